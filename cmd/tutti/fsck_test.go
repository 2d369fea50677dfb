package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/objmap"
)

// makeStore creates a store with n committed runs and returns the first run.
func makeStore(t *testing.T, dir string, n int) objmap.RunInfo {
	t.Helper()
	g := objmap.Geometry{Layers: 3, KVHeads: 2, HeadDim: 64, DType: objmap.BF16, Planes: 2, PageTokens: 16, ChunkPages: 1}
	m, err := objmap.Open(objmap.Options{Dirs: []string{dir}, CapacityBytes: 4 << 20, Geometry: g})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var first objmap.RunInfo
	for i := 0; i < n; i++ {
		res, err := m.Allocate(2)
		if err != nil {
			t.Fatal(err)
		}
		r := res[0]
		f, err := os.OpenFile(m.Files()[r.File].Path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		req := objmap.CommitRequest{Res: r, Chain: []uint64{uint64(i), uint64(i) + 100},
			ChunkCRCs: make([]uint32, g.Layers*r.Chunks)}
		for l := 0; l < g.Layers; l++ {
			p := bytes.Repeat([]byte{byte(i), byte(l)}, int(g.ObjectBytes(r.Chunks)/2))
			off, _ := g.ObjectOffset(r.Chunks, l)
			if _, err := f.WriteAt(p, r.Offset+off); err != nil {
				t.Fatal(err)
			}
			if err := g.UpdateChunkCRCs(req.ChunkCRCs[l*r.Chunks:(l+1)*r.Chunks], 0, p); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
		if err := m.Commit([]objmap.CommitRequest{req}); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first, _ = m.Lookup(r.ID)
		}
	}
	return first
}

func TestFsck(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	first := makeStore(t, dir, 3)

	var out, errOut bytes.Buffer
	if code := run([]string{"fsck", "--dir", dir, "--json"}, &out, &errOut); code != 0 {
		t.Fatalf("clean store: exit %d: %s %s", code, out.String(), errOut.String())
	}
	var res map[string]any
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]float64{"objects": 3, "recovered": 3, "dropped": 0, "corrupt": 0} {
		if res[k] != want {
			t.Errorf("%s = %v, want %v", k, res[k], want)
		}
	}

	// Flip a payload byte of layer 2 of the first run: corrupt, exit 1.
	g := objmap.Geometry{Layers: 3, KVHeads: 2, HeadDim: 64, DType: objmap.BF16, Planes: 2, PageTokens: 16, ChunkPages: 1}
	off, _ := g.ObjectOffset(first.Chunks(), 2)
	f, err := os.OpenFile(filepath.Join(dir, "pool-0000.dat"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0xee}, first.Offset+off+5)
	f.Close()
	out.Reset()
	if code := run([]string{"fsck", "--dir", dir}, &out, &errOut); code != 1 {
		t.Fatalf("corrupt store: exit %d: %s", code, out.String())
	}
	if s := out.String(); !strings.Contains(s, "corrupt 1") || !strings.Contains(s, fmt.Sprintf("corrupt run %d", first.ID)) || !strings.Contains(s, "layer 2") {
		t.Fatalf("report: %s", s)
	}

	// A garbled checkpoint is corruption of the whole store.
	if err := os.WriteFile(filepath.Join(dir, "checkpoint"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run([]string{"fsck", "--dir", dir, "--json"}, &out, &errOut); code != 1 || !strings.Contains(out.String(), `"corrupt": 1`) {
		t.Fatalf("bad checkpoint: exit %d: %s", code, out.String())
	}

	// Usage errors.
	if code := run([]string{"fsck"}, &out, &errOut); code != 1 {
		t.Fatalf("no --dir: exit %d", code)
	}
	if code := run([]string{"fsck", "--dir", filepath.Join(t.TempDir(), "nothing")}, &out, &errOut); code != 1 {
		t.Fatalf("not a store: exit %d", code)
	}
}
