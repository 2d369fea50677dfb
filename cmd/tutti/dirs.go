package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// dirsFlag is the --dir of every command that opens a store (fsck, node,
// replay), so each takes the same forms: one directory, several
// comma-separated, or the flag repeated (the lists add up, and a directory
// given twice across them is refused as within one).
type dirsFlag struct {
	given []string // each value, as given
	dirs  []string
}

func (d *dirsFlag) String() string {
	if d == nil {
		return ""
	}
	return strings.Join(d.dirs, ",")
}

func (d *dirsFlag) Set(v string) error {
	all := append(slices.Clone(d.given), v)
	dirs, err := parseDirs(strings.Join(all, ","))
	if err != nil {
		return err
	}
	d.given, d.dirs = all, dirs
	return nil
}

// parseDirs splits a --dir value: one directory, or several separated by
// commas (one file system each, e.g. one per device) that a store stripes
// over. Entries are cleaned; an empty entry or one listed twice is an
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
