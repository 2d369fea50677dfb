package prefix

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomForest saves chains of a few families into x (every block 1 byte)
// with random lookups in between, and returns the chains; an id names its
// prefix, so the same chains saved in any order make the same forest.
func randomForest(t *testing.T, x *Index, rng *rand.Rand) [][]uint64 {
	t.Helper()
	var chains [][]uint64
	for f := range 1 + rng.IntN(6) {
		for range 1 + rng.IntN(4) {
			// Each id names its whole prefix: a path in a binary trie.
			chain := make([]uint64, 1+rng.IntN(8))
			for i := range chain {
				prev := uint64(f + 1)
				if i > 0 {
					prev = chain[i-1]
				}
				chain[i] = prev*1000003 + uint64(rng.IntN(2)) + 1
			}
			save(t, x, chain, x.Lookup(chain), 1)
			chains = append(chains, chain)
			if len(chains) > 1 && rng.IntN(2) == 0 {
				c := chains[rng.IntN(len(chains))]
				x.Lookup(c[:1+rng.IntN(len(c))])
			}
		}
	}
	return chains
}

// TestRestoreLRU: an index rebuilt in another order (as a restart rebuilds
// it: runs in id order) takes back the eviction order of the index it was
// rebuilt from; blocks the order does not name come after it; and an order
// that puts a block before its descendants is repaired, never followed.
func TestRestoreLRU(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 77))
			x := mustNew(t, Config{CapacityBytes: 1 << 20})
			chains := randomForest(t, x, rng)
			want := x.LRU()

			// Rebuilt: the same chains saved again, in reverse order.
			y := mustNew(t, Config{CapacityBytes: 1 << 20})
			for _, c := range slices.Backward(chains) {
				save(t, y, c, y.Lookup(c), 1)
			}
			// A block the order never saw: newest, so last after restoring.
			extra := []uint64{1 << 60}
			save(t, y, extra, 0, 1)
			if got := y.RestoreLRU(want); got != len(want) {
				t.Fatalf("placed %d of %d", got, len(want))
			}
			if err := y.Check(); err != nil {
				t.Fatal(err)
			}
			if got := y.LRU(); !slices.Equal(got, append(slices.Clone(want), extra...)) {
				t.Fatalf("LRU after restore\n%x\nwant\n%x", got, append(want, extra...))
			}

			// A shuffled order: followed where it keeps descendants first.
			shuffled := slices.Clone(want)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			y.RestoreLRU(append(shuffled, 999)) // an unknown id is skipped
			if err := y.Check(); err != nil {
				t.Fatalf("shuffled order: %v", err)
			}
			got := y.LRU()
			if len(got) != len(want)+1 {
				t.Fatalf("LRU holds %d after a shuffled restore, want %d", len(got), len(want)+1)
			}
			// A leaf the order names first is evicted first.
			if e, _ := y.Get(shuffled[0]); e.Children == 0 && got[0] != e.ID {
				t.Fatalf("head %#x, the order starts with leaf %#x", got[0], e.ID)
			}
		})
	}
}
