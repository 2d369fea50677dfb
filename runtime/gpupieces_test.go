package runtime

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu/gputest"
)

// TestGPUPiecedRestore: a GPU-path load of two runs over two devices is one
// request whose extents alternate between the devices (the kernels' plan
// accepts it: gputest.Restorer), restores every byte, and maps a failed
// entry to its run: the runs before it are restored, it and the rest are
// misses. The runs are cut into pieces of one chunk, alternating between
// the devices, both in a store whose runs each lie on one device (run width
// 1, a store made before objmap's manifest version 3) and where runs spread
// over both devices layer by layer (the default; consecutive runs start on
// different devices): a run whole would hold the window on one device.
func TestGPUPiecedRestore(t *testing.T) {
	for _, width := range []int{1, 0} {
		t.Run(fmt.Sprintf("width=%d", width), func(t *testing.T) { gpuPiecedRestore(t, width) })
	}
}

func gpuPiecedRestore(t *testing.T, width int) {
	g := kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 8} // 64 KiB chunks
	const blocks = 64                                                                                                        // 4 MiB per layer: two runs
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, blocks*g.ChunkPages)
	cfg.RunWidth = width
	cfg.SaveBoundMs, cfg.SaveBudgetBytes = 600000, 1<<30
	bound := make(chan *gputest.Restorer, 1)
	cfg.Path, cfg.gpuBind = PathGPU, cpuGPU(nil, bound)
	cfg.GPU.MaxPages = blocks * g.ChunkPages
	cfg.GPU.IOWindow, cfg.GPU.MaxIOBytes = 4, 64<<10 // pieces of one chunk
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	if w := s.m.Layout().Width(); (width == 1) != (w == 1) {
		t.Fatalf("run width %d", w)
	}
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
	extents := blocks // one piece per chunk, run 0's and run 1's alternating
	fails := []struct {
		failExtent int
		wantBlocks int
	}{
		{-1, blocks},
		{3, blocks / 2}, // run 1's second piece
		{2, 0},          // run 0's second piece
	}
	for _, tc := range fails {
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
		for layer, xs := range gpu.Last().Layers {
			if len(xs) != extents {
				t.Fatalf("request of %d extents in layer %d, want %d", len(xs), layer, extents)
			}
			for i := 1; i < len(xs); i++ {
				if xs[i].FD == xs[i-1].FD {
					t.Fatalf("layer %d: extents %d and %d both read fd %d: not alternating over the devices", layer, i-1, i, xs[i].FD)
				}
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
