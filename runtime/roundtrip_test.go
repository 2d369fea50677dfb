package runtime

import (
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
)

func saveWait(t *testing.T, s *Store, chain []uint64, pages []int32) *Save {
	t.Helper()
	sv, err := s.Save(chain, pages)
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	sv.Wait()
	return sv
}

func loadWait(t *testing.T, s *Store, chain []uint64, pages []int32) *Load {
	t.Helper()
	l, err := s.Load(chain, pages)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	for layer := 0; layer < s.Geometry().Layers; layer++ {
		if err := l.WaitLayer(layer); err != nil {
			t.Fatalf("WaitLayer(%d): %v", layer, err)
		}
	}
	if err := l.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return l
}

// TestRoundTrip saves chains, restores them into other pages (before and
// after a reopen), extends a chain (a second run under the first), and loads
// a chain that diverges inside a run (a partial run, still verified).
func TestRoundTrip(t *testing.T) {
	geos := map[string]kvshape.Geometry{
		"tiny":    tinyGeometry(),
		"mla":     {Layers: 2, KVHeads: 1, HeadDim: 72, DType: kvshape.FP16, Planes: 1, PageTokens: 16, ChunkPages: 1},
		"aligned": {Layers: 4, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 4},
		"fp8":     {Layers: 2, KVHeads: 3, HeadDim: 8, DType: kvshape.FP8, Planes: 2, PageTokens: 3, ChunkPages: 3},
	}
	for name, g := range geos {
		for _, layout := range []kvshape.Layout{kvshape.LayoutPerLayer, kvshape.LayoutCrossLayer} {
			t.Run(name+"/"+layout.String(), func(t *testing.T) {
				const seed = 1
				rng := rand.New(rand.NewPCG(seed, 0))
				numPages := 40 * g.ChunkPages
				cfg := testConfig(t, g, layout, numPages)
				s, kv := openKV(t, cfg)

				a := chainOf(1000, 5)
				pa := pageTable(rng, g, numPages, len(a))
				fill(kv, g, a, pa)
				if sv := saveWait(t, s, a, pa); sv.Saved() != 5 {
					t.Fatalf("saved %d of 5 blocks (skipped %v)", sv.Saved(), s.Stats().Saves.SkippedBlocks)
				}
				if n := s.Lookup(a); n != 5 {
					t.Fatalf("Lookup = %d, want 5", n)
				}
				scramble(kv, g, numPages)
				pa2 := pageTable(rng, g, numPages, len(a))
				if l := loadWait(t, s, a, pa2); l.Blocks() != 5 {
					t.Fatalf("restored %d of 5 blocks; stats %v", l.Blocks(), s.Stats())
				}
				if err := verify(kv, g, a, pa2, 5); err != nil {
					t.Fatal(err)
				}

				// Extend: the first 5 are cached, 3 more form a second run.
				b := append(append([]uint64(nil), a...), chainOf(2000, 3)...)
				pb := pageTable(rng, g, numPages, len(b))
				fill(kv, g, b, pb)
				sv := saveWait(t, s, b, pb)
				if sv.Saved() != 3 || sv.Skipped(SkipCached) != 5 {
					t.Fatalf("extension: saved %d skipped-cached %d, want 3 and 5", sv.Saved(), sv.Skipped(SkipCached))
				}
				closeKV(t, s, kv)

				// Reopen: both runs come back and restore bit-exact.
				s, kv = openKV(t, cfg)
				defer closeKV(t, s, kv)
				if rep := s.Recovery(); rep.IndexedRuns != 2 || rep.IndexedBlocks != 8 || rep.DroppedRuns != 0 {
					t.Fatalf("recovery: %+v", rep)
				}
				pb2 := pageTable(rng, g, numPages, len(b))
				if l := loadWait(t, s, b, pb2); l.Blocks() != 8 {
					t.Fatalf("after reopen restored %d of 8; stats %v", l.Blocks(), s.Stats())
				}
				if err := verify(kv, g, b, pb2, 8); err != nil {
					t.Fatal(err)
				}

				// Diverge inside the first run: 3 of its 5 chunks are a hit.
				c := append(append([]uint64(nil), a[:3]...), chainOf(3000, 2)...)
				pc := pageTable(rng, g, numPages, len(c))
				scramble(kv, g, numPages)
				l := loadWait(t, s, c, pc)
				if l.Blocks() != 3 || l.Cached() != 3 {
					t.Fatalf("diverging chain: restored %d cached %d, want 3 and 3", l.Blocks(), l.Cached())
				}
				if err := verify(kv, g, c, pc, 3); err != nil {
					t.Fatal(err)
				}
				// A partial run reads only its loaded chunks (verified one by
				// one): at most the O_DIRECT rounding on each side is extra.
				st := s.Stats()
				if st.Loads.ReadIOs == 0 || st.Loads.OverreadBytes >= st.Loads.ReadIOs*2*objmap.BlockBytes {
					t.Fatalf("stats: %v: %d bytes over-read in %d reads", st, st.Loads.OverreadBytes, st.Loads.ReadIOs)
				}
			})
		}
	}
}

// TestRecoveryTree saves a tree of chains (branches inside runs, extensions
// of extensions), reopens, and restores every chain whole: the index is
// rebuilt from the runs and the parent log, however deep.
func TestRecoveryTree(t *testing.T) {
	g := tinyGeometry()
	rng := rand.New(rand.NewPCG(9, 9))
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 128)
	s, kv := openKV(t, cfg)
	chains := [][]uint64{chainOf(1<<32, 6)}
	for i := 0; i < 12; i++ {
		base := chains[rng.IntN(len(chains))]
		cut := 1 + rng.IntN(len(base)) // branch inside or at the end of base
		c := append(append([]uint64(nil), base[:cut]...), chainOf(uint64(i+2)<<32, 1+rng.IntN(4))...)
		chains = append(chains, c)
	}
	for _, c := range chains {
		pages := pageTable(rng, g, cfg.NumPages, len(c))
		fill(kv, g, c, pages)
		if sv := saveWait(t, s, c, pages); sv.Saved()+sv.Skipped(SkipCached) != len(c) {
			t.Fatalf("chain of %d: saved %d, cached %d", len(c), sv.Saved(), sv.Skipped(SkipCached))
		}
	}
	runs := s.Stats().Map.LiveRuns
	closeKV(t, s, kv)

	s, kv = openKV(t, cfg)
	defer closeKV(t, s, kv)
	if rep := s.Recovery(); rep.IndexedRuns != runs || rep.DroppedRuns != 0 {
		t.Fatalf("recovery indexed %d of %d runs: %+v", rep.IndexedRuns, runs, rep)
	}
	for i, c := range chains {
		pages := pageTable(rng, g, cfg.NumPages, len(c))
		scramble(kv, g, cfg.NumPages)
		if l := loadWait(t, s, c, pages); l.Blocks() != len(c) {
			t.Fatalf("chain %d (%d blocks): restored %d after reopen", i, len(c), l.Blocks())
		}
		if err := verify(kv, g, c, pages, len(c)); err != nil {
			t.Fatalf("chain %d: %v", i, err)
		}
	}
}
