package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
)

var fsckGeom = kvshape.Geometry{Layers: 3, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 1}

// makeStore creates a store with n committed runs of two chunks and returns them.
func makeStore(t *testing.T, dir string, n int) []objmap.RunInfo {
	t.Helper()
	g := fsckGeom
	m, err := objmap.Open(objmap.Options{Dirs: []string{dir}, CapacityBytes: 4 << 20, Geometry: g})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var runs []objmap.RunInfo
	for i := 0; i < n; i++ {
		res, err := m.Allocate(2)
		if err != nil {
			t.Fatal(err)
		}
		r := res[0]
		f, err := os.OpenFile(m.Files()[r.File].Path, os.O_WRONLY, 0) // one directory: every layer in the run's file
		if err != nil {
			t.Fatal(err)
		}
		req := objmap.CommitRequest{Res: r, Chain: []uint64{uint64(i), uint64(i) + 100},
			ChunkCRCs: make([]uint32, g.Layers*r.Chunks)}
		for l := 0; l < g.Layers; l++ {
			p := bytes.Repeat([]byte{byte(i), byte(l)}, int(objmap.ObjectBytes(g, r.Chunks)/2))
			obj, err := m.Layout().Where(r.Place(), l, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(p, obj.Offset); err != nil {
				t.Fatal(err)
			}
			if err := objmap.UpdateChunkCRCs(g, req.ChunkCRCs[l*r.Chunks:(l+1)*r.Chunks], 0, p); err != nil {
				t.Fatal(err)
			}
		}
		f.Sync()
		f.Close()
		if err := m.Commit([]objmap.CommitRequest{req}); err != nil {
			t.Fatal(err)
		}
		info, _ := m.Lookup(r.ID)
		runs = append(runs, info)
	}
	return runs
}

// patch overwrites bytes of a file of the store.
func patch(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// dirSnapshot is names, sizes, modification times and contents of small files.
func dirSnapshot(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for _, e := range ents {
		st, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&sb, "%s %d %d\n", e.Name(), st.Size(), st.ModTime().UnixNano())
	}
	return sb.String()
}

// TestFsckVerdicts damages a store of three runs in each way a careless
// user or a failing disk can, runs fsck and checks its exit status and
// that it names the problem (run, file, offset, what), and that it wrote
// nothing. Only a torn journal tail is not a problem.
func TestFsckVerdicts(t *testing.T) {
	seg := "journal-0000000000000001.log"
	cases := []struct {
		name   string
		damage func(t *testing.T, dir string, runs []objmap.RunInfo)
		code   int
		want   []string // in stdout
	}{
		{"clean", func(*testing.T, string, []objmap.RunInfo) {}, 0, []string{"recovered 3", "clean"}},
		{"torn journal tail", func(t *testing.T, dir string, _ []objmap.RunInfo) {
			st, _ := os.Stat(filepath.Join(dir, seg))
			patch(t, filepath.Join(dir, seg), st.Size(), []byte{40, 0, 0, 0, 1, 2})
		}, 0, []string{"recovered 3", "torn tail of 6 bytes dropped", "clean"}},
		{"payload byte flipped", func(t *testing.T, dir string, runs []objmap.RunInfo) {
			obj, _ := fsckLayout().Where(runs[0].Place(), 2, 0)
			patch(t, filepath.Join(dir, "pool-0000.dat"), obj.Offset+5, []byte{0xee})
		}, 1, []string{"corrupt 1", "corrupt run 1 (file 0 offset 0)", "layer 2 chunk 0"}},
		{"run header bit flipped", func(t *testing.T, dir string, runs []objmap.RunInfo) {
			p := filepath.Join(dir, "pool-0000.dat")
			b := readAt(t, p, runs[1].Offset+100, 1)
			patch(t, p, runs[1].Offset+100, []byte{b[0] ^ 4})
		}, 1, []string{"dropped 1", fmt.Sprintf("dropped run 2 (file 0 offset %d)", runsOff(1)), "header CRC"}},
		{"run header zeroed", func(t *testing.T, dir string, runs []objmap.RunInfo) {
			patch(t, filepath.Join(dir, "pool-0000.dat"), runs[1].Offset, make([]byte, objmap.HeaderBytes))
		}, 1, []string{fmt.Sprintf("dropped run 2 (file 0 offset %d)", runsOff(1)), "bad magic"}},
		{"run copied over another", func(t *testing.T, dir string, runs []objmap.RunInfo) {
			p := filepath.Join(dir, "pool-0000.dat")
			patch(t, p, runs[2].Offset, readAt(t, p, runs[0].Offset, runs[0].Length))
		}, 1, []string{fmt.Sprintf("dropped run 3 (file 0 offset %d)", runsOff(2)), "run id 1, journal 3"}},
		{"journal byte 5 flipped (issue 19)", func(t *testing.T, dir string, _ []objmap.RunInfo) {
			b := readAt(t, filepath.Join(dir, seg), 5, 1)
			patch(t, filepath.Join(dir, seg), 5, []byte{b[0] ^ 0xff})
		}, 1, []string{"journal damaged", seg + " at byte 0: segment marker", "index rebuilt from run headers: 3 runs found", "problems found"}},
		{"journal byte flipped in the middle", func(t *testing.T, dir string, _ []objmap.RunInfo) {
			patch(t, filepath.Join(dir, seg), 40, []byte{0x5a})
		}, 1, []string{"journal damaged", "but a valid", "follows at byte", "index rebuilt from run headers: 3 runs found"}},
		{"journal deleted", func(t *testing.T, dir string, _ []objmap.RunInfo) {
			if err := os.Remove(filepath.Join(dir, seg)); err != nil {
				t.Fatal(err)
			}
		}, 1, []string{seg + " missing", "index rebuilt from run headers: 3 runs found"}},
		{"journal zeroed", func(t *testing.T, dir string, _ []objmap.RunInfo) {
			st, _ := os.Stat(filepath.Join(dir, seg))
			patch(t, filepath.Join(dir, seg), 0, make([]byte, st.Size()))
		}, 1, []string{seg + " at byte 0: segment marker", "body length 0", "3 runs found"}},
		{"checkpoint garbage", func(t *testing.T, dir string, _ []objmap.RunInfo) {
			if err := os.WriteFile(filepath.Join(dir, "checkpoint"), []byte("garbage"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, 1, []string{"checkpoint at byte 0", "3 runs found"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			runs := makeStore(t, dir, 3)
			tc.damage(t, dir, runs)
			before := dirSnapshot(t, dir)
			var out, errOut bytes.Buffer
			code := run([]string{"fsck", "--dir", dir}, &out, &errOut)
			if code != tc.code {
				t.Fatalf("exit %d, want %d:\n%s%s", code, tc.code, out.String(), errOut.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			if after := dirSnapshot(t, dir); after != before {
				t.Fatalf("fsck changed the directory:\n%s\nafter:\n%s", before, after)
			}
			if tc.code == 0 {
				return
			}
			// --repair fixes what can be fixed; the next fsck is clean and
			// no run whose bytes were intact was lost.
			out.Reset()
			if code := run([]string{"fsck", "--dir", dir, "--repair"}, &out, &errOut); code != 1 || !strings.Contains(out.String(), "repaired") {
				t.Fatalf("--repair: exit %d:\n%s%s", code, out.String(), errOut.String())
			}
			out.Reset()
			if code := run([]string{"fsck", "--dir", dir, "--json"}, &out, &errOut); code != 0 {
				t.Fatalf("fsck after --repair: exit %d:\n%s%s", code, out.String(), errOut.String())
			}
			var res map[string]any
			if err := json.Unmarshal(out.Bytes(), &res); err != nil {
				t.Fatal(err)
			}
			want := 3.0
			if strings.Contains(tc.name, "run ") || strings.Contains(tc.name, "payload") {
				want = 2 // the damaged run is gone; the others stay
			}
			if res["recovered"] != want {
				t.Fatalf("after --repair %v runs, want %v: %s", res["recovered"], want, out.String())
			}
		})
	}
}

// runsOff is the offset of the i-th run makeStore commits (all of two chunks).
func runsOff(i int) int64 { return int64(i) * fsckLayout().RunBytes(2) }

// fsckLayout is where makeStore's one-directory store puts its runs.
func fsckLayout() objmap.Layout {
	lay, err := objmap.NewLayout(fsckGeom, 1, 1, 0)
	if err != nil {
		panic(err)
	}
	return lay
}

// TestFsckUsageAndLock: usage errors and a store a writer has open
// (refused, naming the writer's pid).
func TestFsckUsageAndLock(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"fsck"}, &out, &errOut); code != 1 {
		t.Fatalf("no --dir: exit %d", code)
	}
	dir := filepath.Join(t.TempDir(), "store")
	makeStore(t, dir, 1)
	m, err := objmap.Open(objmap.Options{Dirs: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	errOut.Reset()
	if code := run([]string{"fsck", "--dir", dir}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), fmt.Sprintf("being written by pid %d", os.Getpid())) {
		t.Fatalf("store open by a writer: exit %d: %s", code, errOut.String())
	}
}

// TestFsckReadOnlyMount checks a store through a read-only bind mount
// (root only; skipped elsewhere).
func TestFsckReadOnlyMount(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	makeStore(t, dir, 2)
	ro := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(ro, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(dir, ro, "", syscall.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount (needs root): %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(ro, 0) })
	if err := syscall.Mount("", ro, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, ""); err != nil {
		t.Skipf("cannot remount read-only: %v", err)
	}
	if err := os.WriteFile(filepath.Join(ro, "probe"), nil, 0o600); err == nil {
		t.Fatal("the mount is writable")
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"fsck", "--dir", ro}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "recovered 2") {
		t.Fatalf("fsck on a read-only mount: exit %d:\n%s%s", code, out.String(), errOut.String())
	}
}
