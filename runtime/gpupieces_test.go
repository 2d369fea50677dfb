package runtime

import (
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu/gputest"
)

// TestGPUPiecedRestore: a GPU-path load of runs on two devices is one
// request whose extents alternate between them (the kernels' plan accepts
// it: gputest.Restorer), restores every byte, and maps a failed entry of a
// run's later piece to that run: the runs before it are restored, it and
// the rest are misses.
func TestGPUPiecedRestore(t *testing.T) {
	g := kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 8} // 64 KiB chunks
	const blocks = 64                                                                                                        // 4 MiB per layer: two runs
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, blocks*g.ChunkPages)
	cfg.SaveBoundMs, cfg.SaveBudgetBytes = 600000, 1<<30
	bound := make(chan *gputest.Restorer, 1)
	cfg.Path, cfg.gpuBind = PathGPU, cpuGPU(nil, bound)
	cfg.GPU.MaxPages = blocks * g.ChunkPages
	cfg.GPU.IOWindow, cfg.GPU.MaxIOBytes = 4, 64<<10 // pieces of one chunk
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	gpu := <-bound
	chain := chainOf(4100, blocks)
	pages := pageTable(rand.New(rand.NewPCG(4, 1)), g, cfg.NumPages, blocks)
	fill(kv, g, chain, pages)
	if sv := saveWait(t, s, chain, pages); sv.Saved() != blocks {
		t.Fatalf("saved %d of %d blocks", sv.Saved(), blocks)
	}
	var runChunks []int
	s.m.Runs(func(r objmap.RunInfo) bool {
		runChunks = append(runChunks, len(r.Chain))
		return true
	})
	if len(runChunks) != 2 || runChunks[0] != blocks/2 {
		t.Fatalf("runs of %v chunks: the test needs two of %d", runChunks, blocks/2)
	}
	for _, tc := range []struct {
		failExtent int
		wantBlocks int
	}{
		{-1, blocks},
		{3, blocks / 2}, // run 1's second piece
		{2, 0},          // run 0's second piece
	} {
		gpu.FailEntry = func(layer, extent int) bool { return layer == 1 && extent == tc.failExtent }
		scramble(kv, g, cfg.NumPages)
		before := s.Stats().Loads.MissBlocks[MissIOError]
		l, err := s.Load(chain, pages)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Wait(); err != nil {
			t.Fatal(err)
		}
		xs := gpu.Last().Layers[0]
		if len(xs) != blocks {
			t.Fatalf("request of %d extents per layer, want one per chunk (%d)", len(xs), blocks)
		}
		for i := 1; i < len(xs); i++ {
			if xs[i].FD == xs[i-1].FD {
				t.Fatalf("extents %d and %d both read fd %d: not alternating over the devices", i-1, i, xs[i].FD)
			}
		}
		if l.Blocks() != tc.wantBlocks || s.Stats().Loads.MissBlocks[MissIOError]-before != int64(blocks-tc.wantBlocks) {
			t.Fatalf("failing extent %d: restored %d blocks (want %d), IO-error misses %d",
				tc.failExtent, l.Blocks(), tc.wantBlocks, s.Stats().Loads.MissBlocks[MissIOError]-before)
		}
		if err := verify(kv, g, chain, pages, tc.wantBlocks); err != nil {
			t.Fatalf("failing extent %d: %v", tc.failExtent, err)
		}
	}
}
