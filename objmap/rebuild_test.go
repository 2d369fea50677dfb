package objmap

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// rebuildStore builds a store of a few thousand runs with frees and reuse
// (so dead headers lie under live runs), plus one run killed mid-write:
// header durable, one layer of its payload never written. It returns the
// live runs (committed, not freed) and the freed ones, then crashes. Over
// several directories the runs spread over them (Layout).
func rebuildStore(t *testing.T, dirs []string, runs int, segmentBytes int64) (live, freed map[RunID]RunInfo, halfWritten Reservation) {
	t.Helper()
	// Buffered: the page cache keeps this test fast; the scan is the same.
	o := Options{Dirs: dirs, CapacityBytes: 64 << 20 * int64(len(dirs)), Geometry: tinyGeom, SegmentBytes: segmentBytes, Buffered: true}
	m := mustOpen(t, o)
	rng := rand.New(rand.NewPCG(5, 6))
	live, freed = map[RunID]RunInfo{}, map[RunID]RunInfo{}
	for len(live) < runs {
		var reqs []CommitRequest
		for k := 0; k < 100; k++ {
			res, err := m.Allocate(1 + rng.IntN(3))
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				reqs = append(reqs, writeRun(t, m, r))
			}
		}
		if err := m.Commit(reqs); err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			info, ok := m.Lookup(r.Res.ID)
			if !ok || len(info.ChunkCRCs) != tinyGeom.Layers*info.Chunks() {
				t.Fatalf("after commit: %v %+v (req %+v)", ok, info, r.Res)
			}
			live[r.Res.ID] = info
		}
		// Free a few: their space is reused by later runs.
		nfree := 0
		for id, r := range live {
			if nfree++; nfree > 8 {
				break
			}
			if err := m.Free(id); err != nil {
				t.Fatal(err)
			}
			delete(live, id)
			freed[id] = r
		}
		if err := m.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	// The kill: run H's header is durable but its payload writes were not
	// (where they should be lie the bytes of a dead run whose header still
	// verifies, with its payload): neither may be served.
	res, err := m.Allocate(6)
	if err != nil || len(res) != 1 || res[0].Chunks != 6 {
		t.Fatalf("%v %v", res, err)
	}
	halfWritten = res[0]
	reqH := writeRun(t, m, halfWritten)
	// The dead run lies at the end of H's extent: its header in H's home
	// file over part of an object of H.
	lay := m.Layout()
	dead := Reservation{ID: 0, Generation: 1, File: halfWritten.File, Offset: halfWritten.Offset + halfWritten.Length - lay.RunBytes(1), Length: lay.RunBytes(1), Chunks: 1}
	writeHeaderForTest(t, m, writeRun(t, m, dead))
	writeHeaderForTest(t, m, reqH)
	m.closeFiles() // crash
	return live, freed, halfWritten
}

// TestRebuildFromHeaders loses or damages the journal of a store of a few
// thousand runs in each way fsck must name, and checks that the next Open
// rebuilds the index from the run headers: every committed run comes back
// bit for bit, the run killed mid-write is not served, no freed run whose
// space was reused comes back, the report says what happened, and the
// Open after that is a normal one.
func TestRebuildFromHeaders(t *testing.T) {
	const runs = 2000
	cases := []struct {
		name    string
		segment int64
		damage  func(t *testing.T, dir string)
		want    string // in JournalDamage
		dirs    int
	}{
		{"journal deleted, runs spread over two directories", 0, func(t *testing.T, dir string) {
			must(t, os.Remove(filepath.Join(dir, segmentName(1))))
		}, "missing", 2},
		{"journal deleted", 0, func(t *testing.T, dir string) {
			must(t, os.Remove(filepath.Join(dir, segmentName(1))))
		}, "missing", 1},
		{"journal zeroed", 0, func(t *testing.T, dir string) {
			p := filepath.Join(dir, segmentName(1))
			st, err := os.Stat(p)
			must(t, err)
			must(t, os.WriteFile(p, make([]byte, st.Size()), 0o600))
		}, "segment marker", 1},
		{"journal byte flipped in the middle", 0, func(t *testing.T, dir string) {
			p := filepath.Join(dir, segmentName(1))
			b, err := os.ReadFile(p)
			must(t, err)
			b[len(b)/2] ^= 0x10
			must(t, os.WriteFile(p, b, 0o600))
		}, "a valid", 1},
		{"checkpoint byte flipped", 64 << 10, func(t *testing.T, dir string) {
			p := filepath.Join(dir, checkpointName)
			b, err := os.ReadFile(p)
			must(t, err)
			b[len(b)/3] ^= 1
			must(t, os.WriteFile(p, b, 0o600))
		}, "checkpoint", 1},
	}
	type store struct {
		dirs        []string
		live, freed map[RunID]RunInfo
		half        Reservation
	}
	built := map[[2]int64]*store{} // (segment bound, directories) -> a built store, copied per case
	for _, tc := range cases {
		key := [2]int64{tc.segment, int64(tc.dirs)}
		if built[key] == nil {
			st := &store{}
			root := t.TempDir()
			for i := range key[1] {
				st.dirs = append(st.dirs, filepath.Join(root, fmt.Sprintf("s%d", i)))
			}
			st.live, st.freed, st.half = rebuildStore(t, st.dirs, runs, tc.segment)
			built[key] = st
		}
		src := built[key]
		freed, half := src.freed, src.half
		t.Run(tc.name, func(t *testing.T) {
			live := maps.Clone(src.live)
			root := t.TempDir()
			var dirs []string
			for i, d := range src.dirs {
				dirs = append(dirs, filepath.Join(root, fmt.Sprintf("s%d", i)))
				must(t, os.CopyFS(dirs[i], os.DirFS(d)))
			}
			dir := dirs[0] // the journal's
			tc.damage(t, dir)

			// fsck's view first: read-only, nothing written.
			before := dirState(t, dir)
			ro := mustOpen(t, Options{Dirs: dirs, ReadOnly: true, Buffered: true})
			rrep := ro.Recovery()
			checkRebuilt(t, ro, live, freed, half)
			ro.Close()
			if after := dirState(t, dir); after != before {
				t.Fatalf("read-only rebuild changed the directory:\n%s\n%s", before, after)
			}
			if !rrep.Rebuilt || !strings.Contains(rrep.JournalDamage, tc.want) || rrep.Clean() {
				t.Fatalf("read-only report: %v", rrep)
			}

			m := mustOpen(t, Options{Dirs: dirs, Buffered: true})
			if m.Layout().Width() != len(dirs) {
				t.Fatalf("width %d over %d directories", m.Layout().Width(), len(dirs))
			}
			rep := m.Recovery()
			t.Log(rep.String()[:min(len(rep.String()), 600)])
			if !rep.Rebuilt || !strings.Contains(rep.JournalDamage, tc.want) || rep.HeaderRuns < len(live) ||
				!strings.Contains(rep.String(), "index rebuilt from run headers") {
				t.Fatalf("report: %v", rep)
			}
			checkRebuilt(t, m, live, freed, half)
			served := rep.Recovered
			if rep.Superseded < 1 || rep.Dropped != 1 || rep.DroppedRuns[0].Run != half.ID {
				t.Fatalf("want the dead run superseded and the half-written one dropped: %v", rep)
			}
			for _, r := range save(t, m, 3) { // the store works: new runs get fresh ids
				if _, dup := live[r.ID]; dup || r.ID <= half.ID {
					t.Fatalf("new run reuses id %d", r.ID)
				}
				live[r.ID] = r
			}
			must(t, m.Close())

			m = mustOpen(t, Options{Dirs: dirs, Buffered: true})
			defer m.Close()
			if rep := m.Recovery(); rep.Rebuilt || rep.JournalDamage != "" || rep.Recovered != served+1 || !rep.Clean() {
				t.Fatalf("the open after the rebuild is not a normal one: %v", rep)
			}
			checkRebuilt(t, m, live, freed, half)
		})
	}
}

// checkRebuilt checks what a rebuilt store serves (see TestRebuildFromHeaders).
func checkRebuilt(t *testing.T, m *Map, live, freed map[RunID]RunInfo, half Reservation) {
	t.Helper()
	buf, err := uring.AllocBuffer(int(ObjectStride(tinyGeom, MaxRunChunks(tinyGeom))))
	must(t, err)
	defer buf.Free()
	for id, want := range live {
		r, ok := m.Lookup(id)
		if !ok {
			t.Fatalf("committed run %d lost", id)
		}
		if r.File != want.File || r.Offset != want.Offset || !slicesEqual(r.ChunkCRCs, want.ChunkCRCs) || r.Parent != want.Parent {
			t.Fatalf("run %d came back as %+v, committed %+v", id, r, want)
		}
		comparePayload(t, m, r, buf.Bytes())
	}
	if _, ok := m.Lookup(half.ID); ok {
		t.Fatalf("run %d, killed mid-write, is served", half.ID)
	}
	if _, ok := m.Lookup(0); ok {
		t.Fatal("a dead run under a later run's header is served")
	}
	m.Runs(func(r RunInfo) bool {
		if _, ok := live[r.ID]; ok {
			return true
		}
		old, ok := freed[r.ID]
		if !ok {
			t.Errorf("run %d served, never committed", r.ID)
			return true
		}
		// A freed run may come back only if nothing reused its space; its
		// bytes are then its own.
		lay := m.Layout()
		for _, l := range live {
			if lay.space(l.File) == lay.space(old.File) && l.Offset < old.Offset+old.Length && old.Offset < l.Offset+l.Length {
				t.Errorf("freed run %d served although live run %d reuses its space", r.ID, l.ID)
			}
		}
		comparePayload(t, m, r, buf.Bytes())
		return true
	})
	if rep, err := m.Check(); err != nil || rep.Corrupt != 0 {
		t.Fatalf("check: %v %v", rep.CorruptRuns, err)
	}
}

// dirState lists a directory's names, sizes and modification times.
func dirState(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	var sb strings.Builder
	for _, e := range ents {
		var st unix.Stat_t
		must(t, unix.Stat(filepath.Join(dir, e.Name()), &st))
		fmt.Fprintf(&sb, "%s size %d mtime %d ctime %d\n", e.Name(), st.Size, st.Mtim.Nano(), st.Ctim.Nano())
	}
	return sb.String()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// comparePayload reads every object of r (one read each, where the
// Layout puts it) and compares it byte for byte with what writeRun wrote.
func comparePayload(t *testing.T, m *Map, r RunInfo, buf []byte) {
	t.Helper()
	for l := 0; l < tinyGeom.Layers; l++ {
		obj, err := m.Layout().Where(r.Place(), l, 0)
		must(t, err)
		b := buf[:ObjectStride(tinyGeom, r.Chunks())]
		must(t, preadFull(int(m.Files()[obj.File].FD), b, obj.Offset))
		want := payload(tinyGeom, r.ID, r.Chunks(), l)
		if !bytes.Equal(b[:len(want)], want) {
			t.Fatalf("run %d layer %d: payload differs from what was committed", r.ID, l)
		}
	}
}

// TestExtentUnion: add reports an overlap with anything added before, and
// the union stays disjoint (overlapping extents merged) and complete.
func TestExtentUnion(t *testing.T) {
	u := newExtentUnion()
	for i, c := range []struct {
		off, n  int64
		overlap bool
	}{
		{100, 10, false}, {120, 10, false}, {110, 10, false}, // touching is not overlapping
		{129, 1, true}, {99, 2, true}, {0, 99, false}, {0, 1000, true}, {1000, 5, false},
	} {
		if got := u.add(extent{c.off, c.n}); got != c.overlap {
			t.Fatalf("add %d [%d,+%d): overlap %v, want %v", i, c.off, c.n, got, c.overlap)
		}
	}
	var all []extent
	u.t.Ascend(func(e extent) bool { all = append(all, e); return true })
	end := int64(0)
	for _, e := range all {
		if e.off != end {
			t.Fatalf("union %v: a gap or an overlap at %d", all, end)
		}
		end = e.end()
	}
	if end != 1005 {
		t.Fatalf("union %v", all)
	}
}
