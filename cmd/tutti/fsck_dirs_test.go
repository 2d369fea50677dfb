package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/objmap"
)

// TestFsckDirs: fsck takes --dir as node and replay do (comma-separated or
// repeated), names a missing directory as missing and an empty one as no
// store, with their own exit statuses, and --repair changes nothing then.
func TestFsckDirs(t *testing.T) {
	for _, tc := range []struct {
		name string
		// args builds fsck's arguments from a clean two-directory store in
		// a and b (after damage).
		args    func(t *testing.T, a, b string) []string
		code    int
		verdict string
		want    string // in stdout; {b} is b
	}{
		{"comma-separated", func(t *testing.T, a, b string) []string {
			return []string{"--dir", a + "," + b}
		}, 0, fsckClean, "clean"},
		{"repeated", func(t *testing.T, a, b string) []string {
			return []string{"--dir", a, "--dir", b}
		}, 0, fsckClean, "clean"},
		{"an empty entry", func(t *testing.T, a, b string) []string {
			return []string{"--dir", a + ",", "--dir", b}
		}, 1, "", ""}, // a usage error, as in node and replay
		{"one directory twice", func(t *testing.T, a, b string) []string {
			return []string{"--dir", a + "," + b, "--dir", a}
		}, 1, "", ""},
		{"one removed", func(t *testing.T, a, b string) []string {
			rmAll(t, b)
			return []string{"--dir", a + "," + b}
		}, fsckExitMissing, fsckMissing, "{b} does not exist"},
		{"one removed with --repair", func(t *testing.T, a, b string) []string {
			rmAll(t, b)
			return []string{"--dir", a + "," + b, "--repair"}
		}, fsckExitMissing, fsckMissing, "{b} does not exist"},
		{"one emptied with --repair", func(t *testing.T, a, b string) []string {
			rmAll(t, b)
			if err := os.Mkdir(b, 0o700); err != nil {
				t.Fatal(err)
			}
			return []string{"--dir", a + "," + b, "--repair"}
		}, fsckExitMissing, fsckMissing, "{b} has no MANIFEST"},
		{"one left out of the list", func(t *testing.T, a, b string) []string {
			return []string{"--dir", a}
		}, fsckExitMissing, fsckMissing, "1 missing from the list"},
		{"nothing there", func(t *testing.T, a, b string) []string {
			return []string{"--dir", filepath.Join(t.TempDir(), "none")}
		}, fsckExitMissing, fsckMissing, "does not exist"},
		{"empty directory", func(t *testing.T, a, b string) []string {
			return []string{"--dir", t.TempDir()}
		}, fsckExitNoStore, fsckNoStore, "no store here"},
		{"empty directory with --repair", func(t *testing.T, a, b string) []string {
			return []string{"--dir", t.TempDir(), "--repair"}
		}, fsckExitNoStore, fsckNoStore, "no store here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
			m, err := objmap.Open(objmap.Options{Dirs: []string{a, b}, CapacityBytes: 4 << 20, Geometry: fsckGeom})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			args := tc.args(t, a, b)
			snap := map[string]string{}
			for _, d := range []string{a, b, args[1]} {
				snap[d] = snapshotOrGone(t, d)
			}
			var out, errOut bytes.Buffer
			code := run(append([]string{"fsck"}, args...), &out, &errOut)
			if code != tc.code {
				t.Fatalf("exit %d, want %d:\n%s%s", code, tc.code, out.String(), errOut.String())
			}
			if tc.verdict == "" {
				return
			}
			if !strings.Contains(out.String(), strings.ReplaceAll(tc.want, "{b}", b)) || strings.Contains(out.String(), "repaired") ||
				tc.verdict != fsckClean && strings.Contains(out.String(), "corrupt") {
				t.Errorf("output does not say %q (or claims a repair or corruption):\n%s", tc.want, out.String())
			}
			for d, before := range snap {
				if after := snapshotOrGone(t, d); after != before {
					t.Errorf("fsck changed %s:\n%s\nafter:\n%s", d, before, after)
				}
			}
			out.Reset()
			run(append([]string{"fsck", "--json"}, args...), &out, &errOut)
			var res fsckResult
			if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.Verdict != tc.verdict {
				t.Errorf("--json: verdict %q (%v), want %q:\n%s", res.Verdict, err, tc.verdict, out.String())
			}
		})
	}
}

// snapshotOrGone is dirSnapshot, or "gone" for a directory that does not
// exist; LOCK files aside (a lock is taken and left, and holds nothing).
func snapshotOrGone(t *testing.T, dir string) string {
	t.Helper()
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return "gone"
	}
	var keep []string
	for _, l := range strings.Split(dirSnapshot(t, dir), "\n") {
		if !strings.HasPrefix(l, "LOCK ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func rmAll(t *testing.T, d string) {
	t.Helper()
	if err := os.RemoveAll(d); err != nil {
		t.Fatal(err)
	}
}

// TestFsckStoresBelow: a directory holding no store but stores in its
// subdirectories (a hybrid model's groups, one store each) is no store, and
// fsck names the stores below it to check, changing nothing.
func TestFsckStoresBelow(t *testing.T) {
	root := t.TempDir()
	for _, g := range []string{"g0", "g1"} {
		m, err := objmap.Open(objmap.Options{Dirs: []string{filepath.Join(root, g)}, CapacityBytes: 4 << 20, Geometry: fsckGeom})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	before := snapshotOrGone(t, root)
	var out, errOut bytes.Buffer
	if code := run([]string{"fsck", "--dir", root}, &out, &errOut); code != fsckExitNoStore {
		t.Fatalf("exit %d, want %d:\n%s%s", code, fsckExitNoStore, out.String(), errOut.String())
	}
	want := "fsck --dir " + filepath.Join(root, "g0") + ", fsck --dir " + filepath.Join(root, "g1") + "\n"
	if !strings.Contains(out.String(), want) || strings.Contains(out.String(), "empty") {
		t.Errorf("output does not name g0 and g1 alone:\n%s", out.String())
	}
	if after := snapshotOrGone(t, root); after != before {
		t.Errorf("fsck changed %s:\n%s\nafter:\n%s", root, before, after)
	}
	out.Reset()
	run([]string{"fsck", "--json", "--dir", root}, &out, &errOut)
	var res fsckResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || len(res.StoresBelow) != 2 || res.Verdict != fsckNoStore {
		t.Errorf("--json: %+v (%v):\n%s", res, err, out.String())
	}
}
