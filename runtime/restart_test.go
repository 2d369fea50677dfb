package runtime

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/lrufile"
)

// residentSet is ResidentBlocks as a set of (id, parent) pairs.
func residentSet(s *Store) map[ResidentBlock]bool {
	out := map[ResidentBlock]bool{}
	for _, b := range s.ResidentBlocks() {
		out[b] = true
	}
	return out
}

// TestReopenKeepsIndex: a clean Close and reopen serve exactly what was
// served before Close, whichever blocks left the index before (a discarded
// or evicted tail of a run that keeps its head stays gone, and a newer run
// that saved those blocks again is served whole).
func TestReopenKeepsIndex(t *testing.T) {
	a, b, c, d := uint64(0xa), uint64(0xb), uint64(0xc), uint64(0xd)
	for _, tc := range []struct {
		name string
		drop func(t *testing.T, s *Store) // takes c out of the index
	}{
		{"discard", func(t *testing.T, s *Store) {
			if _, err := s.Discard(c); err != nil {
				t.Fatal(err)
			}
		}},
		{"evict", func(t *testing.T, s *Store) {
			s.Lookup([]uint64{a, b}) // c is the least recently used leaf
			got := s.idx.Evict(1)
			if len(got) != 1 || got[0].ID != c {
				t.Fatalf("evicted %+v, want block c", got)
			}
			s.cat.Release(got)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := tinyGeometry()
			rng := rand.New(rand.NewPCG(43, 1))
			cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
			s, kv := openKV(t, cfg)
			save := func(chain []uint64) *Save {
				pages := pageTable(rng, g, cfg.NumPages, len(chain))
				fill(kv, g, chain, pages)
				return saveWait(t, s, chain, pages)
			}
			if sv := save([]uint64{a, b, c}); sv.Saved() != 3 {
				t.Fatalf("first save stored %d of 3", sv.Saved())
			}
			tc.drop(t, s)
			if n := s.Lookup([]uint64{a, b, c}); n != 2 {
				t.Fatalf("Lookup after dropping c = %d, want 2", n)
			}
			if sv := save([]uint64{a, b, c, d}); sv.Saved() != 2 {
				t.Fatalf("second save stored %d, want its run [c d]", sv.Saved())
			}
			if err := s.WaitSaves(); err != nil {
				t.Fatal(err)
			}
			if n := s.Lookup([]uint64{a, b, c, d}); n != 4 {
				t.Fatalf("Lookup before Close = %d, want 4", n)
			}
			before := residentSet(s)
			closeKV(t, s, kv)

			s, kv = openKV(t, cfg)
			defer closeKV(t, s, kv)
			if n := s.Lookup([]uint64{a, b, c, d}); n != 4 {
				t.Fatalf("Lookup after reopen = %d, want 4; recovery: %+v", n, s.Recovery())
			}
			if rep := s.Recovery(); rep.DroppedRuns != 0 {
				t.Fatalf("recovery dropped runs: %v", rep.DroppedReasons)
			}
			after := residentSet(s)
			if len(after) != len(before) {
				t.Fatalf("resident after reopen %v, before Close %v", after, before)
			}
			for blk := range before {
				if !after[blk] {
					t.Fatalf("block %+v resident before Close, not after reopen", blk)
				}
			}
			pages := pageTable(rng, g, cfg.NumPages, 4)
			scramble(kv, g, cfg.NumPages)
			l := loadWait(t, s, []uint64{a, b, c, d}, pages)
			if l.Blocks() != 4 {
				t.Fatalf("restored %d of 4", l.Blocks())
			}
			if err := verify(kv, g, []uint64{a, b, c, d}, pages, 4); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestReopenKeepsLRU: a clean Close and reopen keep the eviction order
// (blocks used last are evicted last, whatever order the runs are rebuilt
// in, and whatever order the directories are listed in); a torn order file
// is said in the report and costs only the order.
func TestReopenKeepsLRU(t *testing.T) {
	g := tinyGeometry()
	rng := rand.New(rand.NewPCG(43, 2))
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	s, kv := openKV(t, cfg)
	var chains [][]uint64
	for i := range 6 {
		chain := chainOf(uint64(i+1)<<32, 2)
		pages := pageTable(rng, g, cfg.NumPages, len(chain))
		fill(kv, g, chain, pages)
		if sv := saveWait(t, s, chain, pages); sv.Saved() != 2 {
			t.Fatalf("chain %d: saved %d of 2", i, sv.Saved())
		}
		chains = append(chains, chain)
	}
	for _, i := range []int{0, 2, 1} { // the oldest runs become the most recently used
		s.Lookup(chains[i])
	}
	want := s.idx.LRU()
	closeKV(t, s, kv)

	// Reopened with its directories listed the other way round: the order
	// file is found where the store keeps it.
	reversed := cfg
	reversed.Dirs = []string{cfg.Dirs[1], cfg.Dirs[0]}
	s, kv = openKV(t, reversed)
	if got := s.idx.LRU(); !slices.Equal(got, want) {
		t.Fatalf("LRU after reopen %x, before Close %x", got, want)
	}
	if rep := s.Recovery(); rep.LRURestored != len(want) || rep.LRUNote != "" {
		t.Fatalf("recovery restored %d of %d (%q)", rep.LRURestored, len(want), rep.LRUNote)
	}
	if d := s.idx.Evict(1); len(d) != 1 || d[0].ID != chains[3][1] {
		t.Fatalf("first eviction after reopen %+v, want the leaf of the least recently used chain", d)
	} else {
		s.cat.Release(d)
	}
	closeKV(t, s, kv)

	path := filepath.Join(cfg.Dirs[0], lrufile.Name)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b[:len(b)-5], 0o600); err != nil {
		t.Fatal(err)
	}
	s, kv = openKV(t, cfg)
	defer closeKV(t, s, kv)
	if rep := s.Recovery(); rep.LRURestored != 0 || rep.LRUNote == "" || rep.IndexedBlocks != 11 {
		t.Fatalf("torn order file: restored %d, note %q, %d blocks indexed", rep.LRURestored, rep.LRUNote, rep.IndexedBlocks)
	}
}

// TestRecoverDuplicateBlocks: where a crash lost the trim of an older run
// whose tail a newer run saved again, both runs hold those blocks; the
// older copy is served (the same KV: an id names its prefix) and the newer
// run serves the blocks after it. Nothing committed is lost, every byte
// restored is exact, and the next clean reopen serves the same.
func TestRecoverDuplicateBlocks(t *testing.T) {
	a, b, c, d := uint64(0xa), uint64(0xb), uint64(0xc), uint64(0xd)
	g := tinyGeometry()
	rng := rand.New(rand.NewPCG(43, 3))
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	s, kv := openKV(t, cfg)
	save := func(chain []uint64) {
		pages := pageTable(rng, g, cfg.NumPages, len(chain))
		fill(kv, g, chain, pages)
		saveWait(t, s, chain, pages)
	}
	save([]uint64{a, b, c})
	// c leaves the index, its trim never journaled: what a crash right
	// after the eviction leaves.
	if _, err := s.idx.Remove(c); err != nil {
		t.Fatal(err)
	}
	save([]uint64{a, b, c, d}) // run 2: [c d]
	closeKV(t, s, kv)

	for round := range 2 {
		s, kv = openKV(t, cfg)
		rep := s.Recovery()
		if rep.DuplicateBlocks != 1 || rep.DroppedRuns != 0 || rep.IndexedBlocks != 4 {
			t.Fatalf("round %d: recovery %+v", round, rep)
		}
		chain := []uint64{a, b, c, d}
		loadExact(t, s, kv, rng, chain, 4)
		closeKV(t, s, kv)
	}
}
