package objmap

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTrimSurvivesReopen: a run's trim is what every later Open serves,
// whichever way it reads the metadata: the journal, a checkpoint written
// after the trim, or a rebuild from the run headers (a journal damaged
// after the trim records, which stay readable).
func TestTrimSurvivesReopen(t *testing.T) {
	for _, tc := range []struct {
		name    string
		segment int64
		damage  bool
	}{
		{"journal", 1 << 20, false},
		{"checkpoint", 1024, false},
		{"rebuild", 1 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(tc.name))))
			dir := filepath.Join(t.TempDir(), "s")
			o := testOpts(t, dir)
			o.SegmentBytes = tc.segment
			m := mustOpen(t, o)
			want := map[RunID]int{} // run -> Kept
			for range 12 {
				for _, r := range save(t, m, 2+rng.IntN(4)) {
					want[r.ID] = r.Kept
				}
			}
			for _, id := range sortedKeys(want) {
				switch rng.IntN(3) {
				case 0:
					keep := 1 + rng.IntN(want[id]-1)
					if err := m.Trim(id, keep); err != nil {
						t.Fatal(err)
					}
					want[id] = keep
				case 1:
					if err := m.Free(id); err != nil {
						t.Fatal(err)
					}
					delete(want, id)
				}
			}
			// Commits after the trims: with small segments the checkpoints
			// they cause hold the trims; damage in the first one's record
			// leaves the trims readable.
			if err := m.Sync(); err != nil {
				t.Fatal(err)
			}
			damageAt := m.Stats().JournalBytes
			before := m.Stats()
			for range 20 {
				for _, r := range save(t, m, 1) {
					want[r.ID] = r.Kept
				}
			}
			if tc.segment < 1<<20 && m.Stats().Checkpoints == before.Checkpoints {
				t.Fatal("no checkpoint after the trims")
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if tc.damage { // a bad record followed by good ones: not a torn tail
				flipByte(t, filepath.Join(dir, segmentName(1)), damageAt+5)
			}
			m = mustOpen(t, o)
			defer m.Close()
			rep := m.Recovery()
			if rep.Rebuilt != tc.damage || rep.Dropped != 0 {
				t.Fatalf("recovery: %v", rep)
			}
			got := map[RunID]int{}
			m.Runs(func(r RunInfo) bool { got[r.ID] = r.Kept; return true })
			if len(got) != len(want) {
				t.Fatalf("%d runs after reopen, want %d", len(got), len(want))
			}
			for id, k := range want {
				if got[id] != k {
					t.Errorf("run %d keeps %d chunks after reopen, want %d", id, got[id], k)
				}
			}
			if c, err := m.Check(); err != nil || c.Corrupt != 0 {
				t.Fatalf("check: %v %v", c, err)
			}
		})
	}
}

func sortedKeys(m map[RunID]int) []RunID {
	ids := make([]RunID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slicesSortIDs(ids)
	return ids
}

func slicesSortIDs(ids []RunID) {
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestTrimArguments: what Trim refuses and what it leaves alone.
func TestTrimArguments(t *testing.T) {
	m := mustOpen(t, testOpts(t))
	defer m.Close()
	r := save(t, m, 3)[0]
	for _, tc := range []struct {
		name   string
		id     RunID
		keep   int
		err    error // nil: accepted
		kept   int   // Kept afterwards
		record bool  // a trim record was journaled
	}{
		{"unknown run", r.ID + 100, 1, ErrUnknownRun, 3, false},
		{"keep nothing", r.ID, 0, errAny, 3, false},
		{"keep all", r.ID, 3, nil, 3, false},
		{"keep more", r.ID, 9, nil, 3, false},
		{"cut", r.ID, 2, nil, 2, true},
		{"cut again, longer", r.ID, 3, nil, 2, false},
		{"cut to one", r.ID, 1, nil, 1, true},
	} {
		before := m.Stats().Trims
		err := m.Trim(tc.id, tc.keep)
		switch {
		case tc.err == nil && err != nil, tc.err != nil && err == nil:
			t.Fatalf("%s: Trim = %v, want %v", tc.name, err, tc.err)
		case tc.err != nil && tc.err != errAny && !errors.Is(err, tc.err):
			t.Fatalf("%s: Trim = %v, want %v", tc.name, err, tc.err)
		}
		info, _ := m.Lookup(r.ID)
		if info.Kept != tc.kept || (m.Stats().Trims > before) != tc.record {
			t.Fatalf("%s: Kept %d (want %d), trims %d -> %d", tc.name, info.Kept, tc.kept, before, m.Stats().Trims)
		}
	}
	if err := m.Free(r.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.Trim(r.ID, 1); !errors.Is(err, ErrUnknownRun) {
		t.Fatalf("Trim of a freed run: %v", err)
	}
}

var errAny = errors.New("any error")

// TestManifestVersions: a version 1 store (written before trim records)
// is read by this build, checked read-only as it is, and upgraded to
// version 2 by a writable Open; a newer version is refused by name.
func TestManifestVersions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	o := testOpts(t, dir)
	m := mustOpen(t, o)
	runs := save(t, m, 2)
	m.Close()
	setVersion := func(v int) {
		t.Helper()
		editManifests(t, []string{dir}, "version", v)
	}
	version := func() int {
		t.Helper()
		man, err := readManifest(dir)
		if err != nil {
			t.Fatal(err)
		}
		return man.Version
	}

	setVersion(1)
	ro := mustOpen(t, Options{Dirs: []string{dir}, ReadOnly: true})
	if _, ok := ro.Lookup(runs[0].ID); !ok {
		t.Fatal("version 1 store: run lost read-only")
	}
	ro.Close()
	if v := version(); v != 1 {
		t.Fatalf("a read-only open wrote manifest version %d", v)
	}
	m = mustOpen(t, o)
	if _, ok := m.Lookup(runs[0].ID); !ok {
		t.Fatal("version 1 store: run lost")
	}
	m.Close()
	if v := version(); v != manifestVersionFor(1) {
		t.Fatalf("manifest version %d after a writable open, want %d (runs on one device)", v, manifestVersionFor(1))
	}

	setVersion(manifestVersion + 1)
	_, err := Open(o)
	if !errors.Is(err, ErrCorruptStore) || !strings.Contains(err.Error(), fmt.Sprintf("version %d", manifestVersion+1)) {
		t.Fatalf("open of a newer store: %v", err)
	}
}
