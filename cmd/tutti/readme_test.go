package main

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestReadmeListsEveryCommand holds the README's CLI table to the registered
// subcommands: one row per command, each beginning "| `tutti NAME".
func TestReadmeListsEveryCommand(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	for _, l := range strings.Split(string(readme), "\n") {
		rest, ok := strings.CutPrefix(l, "| `tutti ")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, "`")
		name, _, _ = strings.Cut(name, " ")
		rows[name]++
	}
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if rows[n] != 1 {
			t.Errorf("README.md's CLI table has %d rows for `tutti %s`, want 1", rows[n], n)
		}
	}
	for n := range rows {
		if _, ok := commands[n]; !ok {
			t.Errorf("README.md's CLI table lists `tutti %s`, which is no command", n)
		}
	}
}
