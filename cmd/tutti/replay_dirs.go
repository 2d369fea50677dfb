package main

import (
	"fmt"
	"path/filepath"
	"strings"
)

// parseDirs splits replay's --dir: one directory, or several separated by
// commas (one file system each, e.g. one per device) that every backend
// stripes over. Entries are cleaned; an empty entry or one listed twice is an
// error that names it (by position and text), so a stray comma never
// silently drops a device.
func parseDirs(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	seen := make(map[string]int, len(parts))
	var bad []string
	dirs := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			bad = append(bad, fmt.Sprintf("entry %d is empty", i+1))
			continue
		}
		c := filepath.Clean(p)
		if j, ok := seen[c]; ok {
			bad = append(bad, fmt.Sprintf("entry %d (%q) is entry %d again", i+1, p, j+1))
			continue
		}
		seen[c] = i
		dirs = append(dirs, c)
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("--dir %q: %s", s, strings.Join(bad, "; "))
	}
	return dirs, nil
}

// shellJoin joins args for the report's reproduce line, single-quoting those
// a shell would split or expand (a --storage-label with spaces).
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$`\\*?[]()<>|&;#~{}") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}
