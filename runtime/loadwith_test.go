package runtime

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/sched"
)

func loadWithWait(t *testing.T, s *Store, chain []uint64, pages []int32, opts LoadOptions) *Load {
	t.Helper()
	l, err := s.LoadWith(chain, pages, opts)
	if err != nil {
		t.Fatalf("LoadWith(%+v): %v", opts, err)
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

// TestLoadWithSkip restores a chain after its first k blocks (the engine's
// local hits) into a block table of the rest only: the skipped blocks'
// pages are untouched, the others hold the saved bytes.
func TestLoadWithSkip(t *testing.T) {
	g := tinyGeometry()
	for _, layout := range []kvshape.Layout{kvshape.LayoutPerLayer, kvshape.LayoutCrossLayer} {
		t.Run(layout.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 0))
			numPages := 40 * g.ChunkPages
			s, kv := openKV(t, testConfig(t, g, layout, numPages))
			defer closeKV(t, s, kv)
			chain := chainOf(500, 6)
			pages := pageTable(rng, g, numPages, len(chain))
			fill(kv, g, chain, pages)
			saveWait(t, s, chain, pages)
			for _, tc := range []struct{ skip, want int }{{0, 6}, {2, 4}, {5, 1}} {
				scramble(kv, g, numPages)
				local := pageTable(rng, g, numPages, len(chain))
				fill(kv, g, chain[:tc.skip], local[:tc.skip*g.ChunkPages])
				l := loadWithWait(t, s, chain, local[tc.skip*g.ChunkPages:], LoadOptions{Skip: tc.skip, Promised: true})
				if l.Blocks() != tc.want || l.Cached() != tc.want || l.Planned() != tc.want {
					t.Fatalf("skip %d: blocks %d cached %d planned %d, want %d", tc.skip, l.Blocks(), l.Cached(), l.Planned(), tc.want)
				}
				if err := verify(kv, g, chain, local, len(chain)); err != nil {
					t.Fatalf("skip %d: %v", tc.skip, err)
				}
			}
			// A skip past the stored prefix restores nothing and is no error.
			longer := append(append([]uint64(nil), chain...), chainOf(900, 3)...)
			pl := pageTable(rng, g, numPages, 2)
			if l := loadWithWait(t, s, longer[:8], pl, LoadOptions{Skip: 6}); l.Blocks() != 0 || l.Cached() != 0 {
				t.Fatalf("past the stored prefix: blocks %d cached %d", l.Blocks(), l.Cached())
			}
			for _, bad := range []LoadOptions{{Skip: -1}, {Skip: 6}} {
				if _, err := s.LoadWith(chain, pages[:0], bad); !errors.Is(err, ErrBadRequest) {
					t.Fatalf("LoadWith(%+v) = %v, want ErrBadRequest", bad, err)
				}
			}
		})
	}
}

// TestMatchHoldsAgainstEviction: what Match promised survives saves that
// evict everything else, until the hold is released or expires; the hold's
// count is what a promised load restores.
func TestMatchHoldsAgainstEviction(t *testing.T) {
	g := tinyGeometry()
	rng := rand.New(rand.NewPCG(9, 0))
	numPages := 64 * g.ChunkPages
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, numPages)
	cfg.CapacityBytes = 512 << 10 // a few dozen runs: the fills below evict
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)

	held := chainOf(100, 4)
	pages := pageTable(rng, g, numPages, len(held))
	fill(kv, g, held, pages)
	saveWait(t, s, held, pages)
	h, err := s.Match(append(append([]uint64(nil), held...), 77), 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if h.Blocks() != 3 {
		t.Fatalf("Match after 1 of 4 stored blocks = %d, want 3", h.Blocks())
	}
	unheld := chainOf(200, 4)
	fill(kv, g, unheld, pages)
	saveWait(t, s, unheld, pages)
	// Fill the store several times over: everything unpinned is evicted.
	for i := range 60 {
		c := chainOf(uint64(1000+100*i), 8)
		p := pageTable(rng, g, numPages, len(c))
		fill(kv, g, c, p)
		saveWait(t, s, c, p)
	}
	if s.Lookup(unheld) != 0 {
		t.Fatalf("the unheld chain survived: the test did not evict")
	}
	scramble(kv, g, numPages)
	local := pageTable(rng, g, numPages, len(held))
	fill(kv, g, held[:1], local[:g.ChunkPages])
	l := loadWithWait(t, s, held, local[g.ChunkPages:], LoadOptions{Skip: 1, Promised: true})
	h.Release()
	h.Release() // idempotent
	if l.Blocks() != 3 {
		t.Fatalf("held load restored %d of 3", l.Blocks())
	}
	if err := verify(kv, g, held, local, 4); err != nil {
		t.Fatal(err)
	}
	if h := s.Stats().Holds; h.Live != 0 || h.Expired != 0 {
		t.Fatalf("holds live %d expired %d after release", h.Live, h.Expired)
	}

	// A hold that is never released ends by its time to live.
	h2, err := s.Match(held, 0, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if h := s.Stats().Holds; h.Live == 0 && h.Expired == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hold not expired: %v", h2)
		}
		time.Sleep(5 * time.Millisecond)
	}
	h2.Release() // after expiry: nothing left to unpin
	for i := range 60 {
		c := chainOf(uint64(5000+100*i), 8)
		p := pageTable(rng, g, numPages, len(c))
		fill(kv, g, c, p)
		saveWait(t, s, c, p)
	}
	if s.Lookup(held) != 0 {
		t.Fatalf("an expired hold still pins its chain")
	}
	for _, bad := range []struct {
		skip int
		ttl  time.Duration
	}{{-1, time.Second}, {5, time.Second}, {0, 0}} {
		if _, err := s.Match(held, bad.skip, bad.ttl); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("Match(skip %d, ttl %v) = %v, want ErrBadRequest", bad.skip, bad.ttl, err)
		}
	}
}

// TestMatchLeavesOutPlannerRecompute: on a device far slower than compute,
// the planner would recompute the stored blocks, so Match promises none of
// them (the engine computes them: no load error); a Promised load of the
// same chain still restores everything it admits.
func TestMatchLeavesOutPlannerRecompute(t *testing.T) {
	g := tinyGeometry()
	rng := rand.New(rand.NewPCG(11, 0))
	numPages := 16 * g.ChunkPages
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, numPages)
	cfg.Compute = sched.ComputeModel{FixedNs: 1, PerTokenNs: 1}
	cfg.Device = sched.DeviceProfile{ReadBytesPerSec: 1 << 20, WriteBytesPerSec: 1 << 30, ReadIOPS: 10, WriteIOPS: 1e5,
		ReadLatencyNs: 50e6, ReadShareUnderWrites: 1, WriteShareUnderReads: 1}
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	chain := chainOf(300, 4)
	pages := pageTable(rng, g, numPages, len(chain))
	fill(kv, g, chain, pages)
	saveWait(t, s, chain, pages)
	if n := s.Lookup(chain); n != 4 {
		t.Fatalf("Lookup = %d, want 4", n)
	}
	h, err := s.Match(chain, 0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if h.Blocks() != 0 {
		t.Fatalf("Match = %d blocks; reading at 1 MiB/s with 50 ms latency should lose to 1 ns compute", h.Blocks())
	}
	scramble(kv, g, numPages)
	l := loadWithWait(t, s, chain, pages, LoadOptions{Promised: true})
	if l.Blocks() != 4 || l.Planned() != 4 {
		t.Fatalf("promised load: blocks %d planned %d, want 4", l.Blocks(), l.Planned())
	}
	if err := verify(kv, g, chain, pages, 4); err != nil {
		t.Fatal(err)
	}
	if l2 := loadWithWait(t, s, chain, pages, LoadOptions{}); l2.Planned() != 0 {
		t.Fatalf("unpromised load planned %d: the planner should recompute here", l2.Planned())
	}
}
