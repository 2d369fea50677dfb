package objmap

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenNamesWhatIsMissing: a directory of the store that is not there is
// ErrMissingDir, directories without a store are ErrNoStore when the store
// must exist, and neither is ever reported as corruption; nothing is created
// where the store must exist, and a failed open leaves no directory behind.
func TestOpenNamesWhatIsMissing(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup returns the directories to open, given a two-directory
		// store in a and b.
		setup   func(t *testing.T, a, b string) []string
		opts    Options
		want    error
		mention string
	}{
		{"one directory removed, read-only", func(t *testing.T, a, b string) []string {
			rmAll(t, b)
			return []string{a, b}
		}, Options{ReadOnly: true}, ErrMissingDir, "does not exist"},
		{"one directory removed, must exist", func(t *testing.T, a, b string) []string {
			rmAll(t, b)
			return []string{a, b}
		}, Options{MustExist: true}, ErrMissingDir, "does not exist"},
		{"one directory removed, writable", func(t *testing.T, a, b string) []string {
			rmAll(t, b)
			return []string{a, b}
		}, Options{}, ErrMissingDir, "does not exist"},
		{"one directory emptied", func(t *testing.T, a, b string) []string {
			rmAll(t, b)
			if err := os.Mkdir(b, 0o700); err != nil {
				t.Fatal(err)
			}
			return []string{a, b}
		}, Options{ReadOnly: true}, ErrMissingDir, "has no MANIFEST"},
		{"one directory left out of the list", func(t *testing.T, a, b string) []string {
			return []string{a}
		}, Options{ReadOnly: true}, ErrMissingDir, "1 missing from the list"},
		{"left out, writable", func(t *testing.T, a, b string) []string {
			return []string{a}
		}, Options{}, ErrMissingDir, "1 missing from the list"},
		{"an empty directory, read-only", func(t *testing.T, a, b string) []string {
			return []string{t.TempDir()}
		}, Options{ReadOnly: true}, ErrNoStore, "no MANIFEST"},
		{"an empty directory, must exist", func(t *testing.T, a, b string) []string {
			return []string{t.TempDir()}
		}, Options{MustExist: true}, ErrNoStore, "no MANIFEST"},
		{"no directory, must exist", func(t *testing.T, a, b string) []string {
			return []string{filepath.Join(t.TempDir(), "none")}
		}, Options{MustExist: true}, ErrMissingDir, "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
			m := mustOpen(t, testOpts(t, a, b))
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			o := tc.opts
			o.Dirs = tc.setup(t, a, b)
			before := map[string]bool{}
			for _, d := range o.Dirs {
				_, err := os.Stat(d)
				before[d] = err == nil
			}
			m, err := Open(o)
			if err == nil {
				m.Close()
				t.Fatal("opened")
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("%v: want %v saying %q", err, tc.want, tc.mention)
			}
			if errors.Is(err, ErrCorruptStore) {
				t.Fatalf("%v: reported as corruption", err)
			}
			for _, d := range o.Dirs {
				if _, err := os.Stat(d); (err == nil) != before[d] {
					t.Errorf("%s: existed %v before the open, %v after", d, before[d], err == nil)
				}
			}
		})
	}
}

func rmAll(t *testing.T, d string) {
	t.Helper()
	if err := os.RemoveAll(d); err != nil {
		t.Fatal(err)
	}
}
