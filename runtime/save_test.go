package runtime

import (
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/objmap"
)

// TestSaveBudgetCut: a save larger than the scheduler's save budget is
// admitted in part: the run the budget cuts is reallocated for what was
// admitted, the rest is skipped (SkipBudget) and not served, and what was
// admitted restores bit-exact.
func TestSaveBudgetCut(t *testing.T) {
	g := tinyGeometry()
	rng := rand.New(rand.NewPCG(4, 4))
	cfg := testConfig(t, g, objmap.LayoutPerLayer, 64)
	cfg.Dirs = cfg.Dirs[:1]                  // one device: one budget
	cfg.SaveBudgetBytes = 3 * g.ChunkBytes() // three blocks pending at most
	s, kv := openKV(t, cfg)
	c := chainOf(5<<32, 10)
	pages := pageTable(rng, g, cfg.NumPages, len(c))
	fill(kv, g, c, pages)
	sv := saveWait(t, s, c, pages)
	if sv.Saved() != 3 || sv.Skipped(SkipBudget) != 7 {
		t.Fatalf("saved %d, budget-skipped %d; want 3 and 7 (%v)", sv.Saved(), sv.Skipped(SkipBudget), s.Stats())
	}
	if n := s.Lookup(c); n != 3 {
		t.Fatalf("Lookup = %d, want 3", n)
	}
	p2 := pageTable(rng, g, cfg.NumPages, len(c))
	if l := loadWait(t, s, c, p2); l.Blocks() != 3 {
		t.Fatalf("restored %d, want 3", l.Blocks())
	} else if err := verify(kv, g, c, p2, 3); err != nil {
		t.Fatal(err)
	}
	// The rest can be saved once the budget drained.
	if sv := saveWait(t, s, c, pages); sv.Saved() != 3 || sv.Skipped(SkipCached) != 3 {
		t.Fatalf("second save saved %d (cached %d), want 3 (3)", sv.Saved(), sv.Skipped(SkipCached))
	}
	closeKV(t, s, kv)
}
