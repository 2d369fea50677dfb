package runtime

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

// TestConcurrent runs loads and saves of overlapping chains from several
// goroutines on a store small enough to evict, with WaitSaves racing them.
// Whatever a load reports restored must be bit-exact; nothing may panic or
// race.
func TestConcurrent(t *testing.T) {
	g := tinyGeometry()
	const workers, ops, pagesPer = 4, 40, 32
	cfg := testConfig(t, g, kvshape.LayoutCrossLayer, workers*pagesPer)
	cfg.CapacityBytes = 512 << 10 // a few dozen runs: eviction is constant
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			seed := uint64(100 + w)
			rng := rand.New(rand.NewPCG(seed, 1))
			// Each worker owns a slice of the KV memory.
			own := make([]int32, pagesPer)
			for i := range own {
				own[i] = int32(w*pagesPer + i)
			}
			pick := func(n int) []int32 {
				p := make([]int32, n*g.ChunkPages)
				perm := rng.Perm(pagesPer)
				for i := range p {
					p[i] = own[perm[i]]
				}
				return p
			}
			for i := 0; i < ops; i++ {
				// Chains share roots across workers: 8 roots, random lengths.
				// then diverge into a fresh suffix half of the time.
				root := uint64(rng.IntN(8)+1) << 32
				n := 1 + rng.IntN(pagesPer/g.ChunkPages)
				chain := chainOf(root, n)
				if k := rng.IntN(n); rng.IntN(2) == 0 {
					copy(chain[k:], chainOf(uint64(w+1)<<48|uint64(i)<<24, n-k))
				}
				pages := pick(n)
				if rng.IntN(2) == 0 {
					fill(kv, g, chain, pages)
					sv, err := s.Save(chain, pages)
					if err != nil {
						errs <- err
						return
					}
					<-sv.Gathered()
					if rng.IntN(4) == 0 {
						s.WaitSaves()
					}
				} else {
					l, err := s.Load(chain, pages)
					if err != nil {
						errs <- err
						return
					}
					l.Wait()
					if err := verify(kv, g, chain, pages, l.Blocks()); err != nil {
						t.Errorf("worker %d seed %d op %d: %v", w, seed, i, err)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := s.WaitSaves(); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Check()
	if err != nil || rep.Corrupt != 0 {
		t.Fatalf("fsck after the concurrent run: %v %v", err, rep)
	}
	st := s.Stats()
	if st.Saves.SavedBlocks == 0 || st.Loads.RestoredBlocks == 0 || s.idx.Stats().Evictions == 0 {
		t.Fatalf("nothing saved, restored or evicted: %v %+v", st, s.idx.Stats())
	}
	if n := st.Saves.SkippedBlocks[SkipENOSPC] + st.Saves.SkippedBlocks[SkipIOError]; n != 0 {
		t.Fatalf("%d blocks skipped for I/O errors on a healthy engine: %v", n, st)
	}
	t.Logf("%v; index %+v", st, s.idx.Stats())
}
