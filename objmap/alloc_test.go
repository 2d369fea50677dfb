package objmap

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/tutti-io/tutti/kvshape"
)

// allocGeom makes the arithmetic readable: one layer, one 4 KiB chunk, so a
// run of n chunks takes (n+1) blocks of 4096 bytes.
var allocGeom = kvshape.Geometry{Layers: 1, KVHeads: 1, HeadDim: 1024, DType: kvshape.FP32, Planes: 1, PageTokens: 1, ChunkPages: 1}

func TestAllocatorDataDriven(t *testing.T) {
	datadriven.RunTest(t, "testdata/alloc", func(t *testing.T, d *datadriven.TestData) string {
		return allocCmd(t, d)
	})
}

var allocState struct {
	a    *allocator
	runs map[string]span
	next int
}

func allocCmd(t *testing.T, d *datadriven.TestData) string {
	s := &allocState
	intArg := func(key string, def int) int {
		if !d.HasArg(key) {
			return def
		}
		var v int
		d.ScanArgs(t, key, &v)
		return v
	}
	var out strings.Builder
	switch d.Cmd {
	case "init":
		// files pool files, one per directory; with width > 1 (and layers
		// >= width) the runs spread over stripe groups of width files.
		files, bytes := intArg("files", 1), intArg("bytes", 40960)
		g := allocGeom
		g.Layers = intArg("layers", 1)
		lay, err := NewLayout(g, files, 1, intArg("width", 1))
		if err != nil {
			return "error: " + err.Error()
		}
		s.a = newAllocator(lay, int64(bytes))
		s.runs = map[string]span{}
		s.next = 1
	case "alloc":
		spans := s.a.alloc(intArg("chunks", 1), intArg("maxrun", MaxRunChunks(s.a.lay.Geometry())), intArg("maxruns", 64))
		total := 0
		for _, sp := range spans {
			name := fmt.Sprintf("r%d", s.next)
			s.next++
			s.runs[name] = sp
			total += sp.chunks
			if s.a.lay.Width() > 1 {
				fmt.Fprintf(&out, "%s: space %d home file %d [%d,+%d) chunks %d\n", name, sp.space, sp.file(s.a.lay), sp.off, sp.n, sp.chunks)
				continue
			}
			fmt.Fprintf(&out, "%s: file %d [%d,+%d) chunks %d\n", name, sp.file(s.a.lay), sp.off, sp.n, sp.chunks)
		}
		fmt.Fprintf(&out, "allocated %d of %d chunks\n", total, intArg("chunks", 1))
	case "free", "qfree":
		var name string
		d.ScanArgs(t, "run", &name)
		sp, ok := s.runs[name]
		if !ok {
			return "no run " + name
		}
		if d.Cmd == "free" {
			if err := s.a.free(sp.file(s.a.lay), extent{sp.off, sp.n}); err != nil {
				return "error: " + err.Error()
			}
			delete(s.runs, name)
		} else {
			s.a.quarantineFree(sp.file(s.a.lay), extent{sp.off, sp.n}, uint64(intArg("lsn", 0)))
			delete(s.runs, name)
		}
	case "freeext":
		if err := s.a.free(intArg("file", 0), extent{int64(intArg("off", 0)), int64(intArg("len", 4096))}); err != nil {
			return "error: " + err.Error()
		}
	case "release":
		if err := s.a.release(uint64(intArg("lsn", 0))); err != nil {
			return "error: " + err.Error()
		}
	case "carve":
		err := s.a.carve(intArg("file", 0), extent{int64(intArg("off", 0)), int64(intArg("len", 4096))})
		if err != nil {
			return "error: " + err.Error()
		}
	case "freebytes":
		return fmt.Sprintf("free %d quarantined %d", s.a.freeBytes(), s.a.quarantinedBytes())
	default:
		t.Fatalf("unknown command %s", d.Cmd)
	}
	out.WriteString(s.a.String())
	return out.String()
}

// TestAllocateStriped: a striped allocation is cut into near-equal runs on
// distinct pool files in distinct directories, as many as asked (fewer with
// fewer chunks), the longer runs last (a restore of all but the last chunks
// then cuts a longest run), and bad arguments are refused.
func TestAllocateStriped(t *testing.T) {
	root := t.TempDir()
	var dirs []string
	for i := range 4 {
		dirs = append(dirs, filepath.Join(root, fmt.Sprintf("d%d", i)))
	}
	o := testOpts(t, dirs...)
	o.CapacityBytes = 4 << 20
	m := mustOpen(t, o)
	defer m.Close()
	for _, tc := range []struct{ chunks, ways, runs int }{{10, 4, 4}, {3, 4, 3}, {8, 1, 1}, {9, 3, 3}, {13, 4, 4}, {7, 4, 4}} {
		res, err := m.AllocateStriped(tc.chunks, tc.ways)
		if err != nil {
			t.Fatalf("%d chunks in %d ways: %v", tc.chunks, tc.ways, err)
		}
		if len(res) != tc.runs {
			t.Fatalf("%d chunks in %d ways: %d runs, want %d", tc.chunks, tc.ways, len(res), tc.runs)
		}
		total, dirSeen := 0, map[int]bool{}
		for i, r := range res {
			if i > 0 && r.Chunks < res[i-1].Chunks {
				t.Fatalf("%d chunks in %d ways: run %d shorter than run %d: %+v", tc.chunks, tc.ways, i, i-1, res)
			}
			total += r.Chunks
			if d := r.File % len(dirs); dirSeen[d] {
				t.Fatalf("%d chunks in %d ways: two runs in directory %d: %+v", tc.chunks, tc.ways, d, res)
			} else {
				dirSeen[d] = true
			}
			if lo := tc.chunks / tc.runs; r.Chunks < lo || r.Chunks > lo+1 {
				t.Fatalf("%d chunks in %d ways: uneven runs %+v", tc.chunks, tc.ways, res)
			}
		}
		if total != tc.chunks {
			t.Fatalf("%d chunks in %d ways: %d chunks reserved", tc.chunks, tc.ways, total)
		}
		for _, r := range res {
			if err := m.Abort(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, bad := range [][2]int{{0, 1}, {1, 0}, {1, maxRunsPerAllocate + 1}} {
		if _, err := m.AllocateStriped(bad[0], bad[1]); err == nil {
			t.Fatalf("AllocateStriped(%d, %d) accepted", bad[0], bad[1])
		}
	}
}
