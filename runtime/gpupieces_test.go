package runtime

import (
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/catalog"
)

// piecesGeometry is llama3-8b's KV shape with 512-token chunks (2 MiB per
// chunk and layer).
func piecesGeometry() kvshape.Geometry {
	return kvshape.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 32}
}

// runsOn is one load run of k chunks per entry of ks, run i on device
// devs[i].
func runsOn(ks, devs []int) []loadRun {
	var rs []loadRun
	pos := 0
	for i, k := range ks {
		rs = append(rs, loadRun{run: &catalog.Run{Device: devs[i], Chunks: k}, k: k, chainPos: pos})
		pos += k
	}
	return rs
}

// TestGPUPieces: the GPU request's pieces cover every run once, in order
// within the run, whole O_DIRECT blocks at a time, round-robin over the
// runs, within the extent limit; and every window of reads in flight holds
// each device's share within one piece of even.
func TestGPUPieces(t *testing.T) {
	mla := kvshape.Geometry{Layers: 61, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16, Planes: 1, PageTokens: 16, ChunkPages: 32}
	odd := kvshape.Geometry{Layers: 4, KVHeads: 1, HeadDim: 48, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 1} // 3 KiB chunks
	eight := []int{0, 1, 2, 3, 4, 5, 6, 7}
	for _, tc := range []struct {
		name       string
		g          kvshape.Geometry
		ks, devs   []int
		window     int
		maxIO      int
		maxExtents int
		wantChunks int // chunks of a full piece
	}{
		// 80K tokens on 8 devices: 40 reads per run and layer, 128 in the window.
		{"8b-80K-8dev", piecesGeometry(), []int{20, 20, 20, 20, 20, 20, 20, 20}, eight, 128, 1 << 20, 256, 4},
		{"8b-32K-4dev", piecesGeometry(), []int{16, 16, 16, 16}, eight[:4], 128, 1 << 20, 256, 8},
		// Pieces no smaller than one read, even when the window is small.
		{"8b-small-window", piecesGeometry(), []int{8, 8}, eight[:2], 2, 4 << 20, 256, 2},
		// MLA's 576 KiB chunks: a layer of 8 runs fits the window whole.
		{"mla-32K-8dev", mla, []int{8, 8, 8, 8, 8, 8, 8, 8}, eight, 128, 1 << 20, 256, 8},
		// 3 KiB chunks: pieces of 4 chunks, the smallest whole-block count.
		{"odd-chunks", odd, []int{64, 64}, eight[:2], 2, 4096, 256, 4},
		// The extent limit makes pieces longer.
		{"extent-limit", piecesGeometry(), []int{20, 20, 20, 20, 20, 20, 20, 20}, eight, 128, 1 << 20, 16, 10},
		// One device: the runs stay whole.
		{"one-device", piecesGeometry(), []int{20, 20, 3}, []int{2, 2, 2}, 128, 1 << 20, 256, 20},
		// Uneven runs: the longer ones' last pieces come last.
		{"uneven", piecesGeometry(), []int{4, 13, 9}, []int{0, 1, 0}, 4, 1 << 20, 256, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := runsOn(tc.ks, tc.devs)
			ps := gpuPieces(runs, tc.g, tc.window, tc.maxIO, tc.maxExtents)
			if len(ps) > tc.maxExtents {
				t.Fatalf("%d pieces, limit %d", len(ps), tc.maxExtents)
			}
			cb := tc.g.ChunkBytesPerLayer()
			next := make([]int, len(runs))
			full := 0
			for i, p := range ps {
				if p.first != next[p.run] || p.k < 1 || p.first+p.k > runs[p.run].k {
					t.Fatalf("piece %d %+v: run %d continues at chunk %d of %d", i, p, p.run, next[p.run], runs[p.run].k)
				}
				if (int64(p.first)*cb)%objmap.BlockBytes != 0 {
					t.Fatalf("piece %d %+v starts %d bytes into its run's layer: not on an O_DIRECT block", i, p, int64(p.first)*cb)
				}
				next[p.run] += p.k
				full = max(full, p.k)
				// Round-robin: a run's next piece comes only after every run
				// with chunks left had its piece of this round.
				if i > 0 && p.run <= ps[i-1].run && p.first == ps[i-1].first {
					t.Fatalf("pieces %d and %d of the same round out of run order: %+v %+v", i-1, i, ps[i-1], p)
				}
			}
			for r := range runs {
				if next[r] != runs[r].k {
					t.Fatalf("run %d: pieces cover %d of %d chunks", r, next[r], runs[r].k)
				}
			}
			if full != tc.wantChunks {
				t.Fatalf("pieces of %d chunks, want %d", full, tc.wantChunks)
			}
			checkWindowSpread(t, runs, ps, tc.g, tc.window, tc.maxIO, full)
		})
	}
}

// checkWindowSpread: in every span of window consecutive reads of a layer's
// entries (kernels' submission order), each device's reads are within one
// piece of its share of the whole layer.
func checkWindowSpread(t *testing.T, runs []loadRun, ps []gpuPiece, g kvshape.Geometry, window, maxIO, pieceChunks int) {
	t.Helper()
	var dev []int // device of each read of one layer, in submission order
	for _, p := range ps {
		bytes := int64(p.k) * g.ChunkBytesPerLayer()
		for n := (bytes + int64(maxIO) - 1) / int64(maxIO); n > 0; n-- {
			dev = append(dev, runs[p.run].run.Device)
		}
	}
	total := map[int]int{}
	for _, d := range dev {
		total[d]++
	}
	if len(total) < 2 || window >= len(dev) {
		return
	}
	pieceReads := int((int64(pieceChunks)*g.ChunkBytesPerLayer() + int64(maxIO) - 1) / int64(maxIO))
	// Only the spans before any run is used up: after that the rest is uneven by design.
	shortest := len(dev)
	for _, r := range runs {
		shortest = min(shortest, r.k)
	}
	evenReads := int(int64(shortest)*g.ChunkBytesPerLayer()/int64(maxIO)) * len(runs)
	for start := 0; start+window <= min(evenReads, len(dev)); start++ {
		in := map[int]int{}
		for _, d := range dev[start : start+window] {
			in[d]++
		}
		for d, n := range total {
			share := float64(window) * float64(n) / float64(len(dev))
			if diff := float64(in[d]) - share; diff > float64(pieceReads) || diff < -float64(pieceReads) {
				t.Fatalf("reads [%d, %d): device %d has %d of them, its share is %.1f (pieces of %d reads)", start, start+window, d, in[d], share, pieceReads)
			}
		}
	}
}

// TestGPUPiecedRestore: a GPU-path load of runs on two devices is one
// request whose extents alternate between them (the kernels' plan accepts
// it: cpuRestorer), restores every byte, and maps a failed entry of a
// run's later piece to that run: the runs before it are restored, it and
// the rest are misses.
func TestGPUPiecedRestore(t *testing.T) {
	g := kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 8} // 64 KiB chunks
	const blocks = 64                                                                                                        // 4 MiB per layer: two runs
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, blocks*g.ChunkPages)
	cfg.SaveBoundMs, cfg.SaveBudgetBytes = 600000, 1<<30
	bound := make(chan *cpuRestorer, 1)
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
		gpu.failEntry = func(layer, extent int) bool { return layer == 1 && extent == tc.failExtent }
		scramble(kv, g, cfg.NumPages)
		before := s.Stats().Loads.MissBlocks[MissIOError]
		l, err := s.Load(chain, pages)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Wait(); err != nil {
			t.Fatal(err)
		}
		xs := gpu.last.Layers[0]
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
