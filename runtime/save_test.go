package runtime

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tutti-io/tutti/objmap"
)

func TestRunSizes(t *testing.T) {
	for _, tc := range []struct {
		n, m int
		root bool
		want []int
	}{
		{1, 1, true, []int{1}},
		{2, 1, true, []int{1, 1}},
		{5, 1, true, []int{1, 1, 2, 1}},
		{24, 1, true, []int{1, 1, 2, 4, 8, 8}},
		{24, 1, false, []int{24}},
		{100, 16, true, []int{16, 16, 32, 36}},
		{10, 16, true, []int{10}},
	} {
		if got := runSizes(tc.n, tc.m, tc.root); !slices.Equal(got, tc.want) {
			t.Errorf("runSizes(%d, %d, %v) = %v, want %v", tc.n, tc.m, tc.root, got, tc.want)
		}
	}
	// Reading the first k blocks of a save reads at most max(2k, m).
	for _, m := range []int{1, 3, 16} {
		for n := 1; n <= 300; n++ {
			sizes := runSizes(n, m, true)
			start := 0
			for _, sz := range sizes {
				for k := start + 1; k <= start+sz; k++ {
					if read := start + sz; read > max(2*k, m) {
						t.Fatalf("n=%d m=%d: the first %d blocks read %d", n, m, k, read)
					}
				}
				start += sz
			}
			if start != n {
				t.Fatalf("n=%d m=%d: sizes %v sum to %d", n, m, sizes, start)
			}
		}
	}
}

// TestSaveBudgetCut: a save larger than the scheduler's save budget is
// admitted in part: the run the budget cuts is reallocated for what was
// admitted, the rest is skipped (SkipBudget) and not served, and what was
// admitted restores bit-exact.
func TestSaveBudgetCut(t *testing.T) {
	g := tinyGeometry()
	for _, whole := range []bool{true, false} {
		rng := rand.New(rand.NewPCG(4, 4))
		cfg := testConfig(t, g, objmap.LayoutPerLayer, 64)
		cfg.Dirs = cfg.Dirs[:1] // one device: one budget
		cfg.WholeSaves = whole
		cfg.SaveBudgetBytes = 3 * g.ChunkBytes() // three blocks pending at most
		s, kv := openKV(t, cfg)
		c := chainOf(5<<32, 10)
		pages := pageTable(rng, g, cfg.NumPages, len(c))
		fill(kv, g, c, pages)
		sv := saveWait(t, s, c, pages)
		if sv.Saved() != 3 || sv.Skipped(SkipBudget) != 7 {
			t.Fatalf("whole=%v: saved %d, budget-skipped %d; want 3 and 7 (%v)", whole, sv.Saved(), sv.Skipped(SkipBudget), s.Stats())
		}
		if n := s.Lookup(c); n != 3 {
			t.Fatalf("whole=%v: Lookup = %d, want 3", whole, n)
		}
		p2 := pageTable(rng, g, cfg.NumPages, len(c))
		if l := loadWait(t, s, c, p2); l.Blocks() != 3 {
			t.Fatalf("whole=%v: restored %d, want 3", whole, l.Blocks())
		} else if err := verify(kv, g, c, p2, 3); err != nil {
			t.Fatal(err)
		}
		// The rest can be saved once the budget drained.
		if sv := saveWait(t, s, c, pages); sv.Saved() != 3 || sv.Skipped(SkipCached) != 3 {
			t.Fatalf("whole=%v: second save saved %d (cached %d), want 3 (3)", whole, sv.Saved(), sv.Skipped(SkipCached))
		}
		closeKV(t, s, kv)
	}
}
