package gpu

import (
	"testing"

	"github.com/tutti-io/tutti/kernels/winsim"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover"
)

// piecesGeometry is llama3-8b's KV shape with 512-token chunks (2 MiB per
// chunk and layer).
func piecesGeometry() kvshape.Geometry {
	return kvshape.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 32}
}

// runsOn is one load run of k chunks per entry of ks, run i on device
// devs[i].
func runsOn(ks, devs []int) []mover.Run {
	var rs []mover.Run
	pos := 0
	for _, k := range ks {
		rs = append(rs, mover.Run{Info: &objmap.RunInfo{Chain: make([]uint64, k)}, K: k, ChainPos: pos})
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
		// spread: layer l of run i lies on device (devs[i]+l) mod 8, and
		// the window is checked across layer boundaries too.
		spread bool
	}{
		// 80K tokens on 8 devices: 40 reads per run and layer, 128 in the window.
		{"8b-80K-8dev", piecesGeometry(), []int{20, 20, 20, 20, 20, 20, 20, 20}, eight, 128, 1 << 20, 256, 4, false},
		{"8b-32K-4dev", piecesGeometry(), []int{16, 16, 16, 16}, eight[:4], 128, 1 << 20, 256, 8, false},
		// Pieces no smaller than one read, even when the window is small.
		{"8b-small-window", piecesGeometry(), []int{8, 8}, eight[:2], 2, 4 << 20, 256, 2, false},
		// MLA's 576 KiB chunks: a layer of 8 runs fits the window whole.
		{"mla-32K-8dev", mla, []int{8, 8, 8, 8, 8, 8, 8, 8}, eight, 128, 1 << 20, 256, 8, false},
		// 3 KiB chunks: pieces of 4 chunks, the smallest whole-block count.
		{"odd-chunks", odd, []int{64, 64}, eight[:2], 2, 4096, 256, 4, false},
		// The extent limit makes pieces longer.
		{"extent-limit", piecesGeometry(), []int{20, 20, 20, 20, 20, 20, 20, 20}, eight, 128, 1 << 20, 16, 10, false},
		// One device: the runs stay whole.
		{"one-device", piecesGeometry(), []int{20, 20, 3}, []int{2, 2, 2}, 128, 1 << 20, 256, 20, false},
		// No devices known: the runs stay whole.
		{"no-devices", piecesGeometry(), []int{20, 20, 3}, nil, 128, 1 << 20, 256, 20, false},
		// Runs spread over the devices layer by layer (devs: layer 0's
		// device, layer l W-rotated): the emulated 8-device store's restore
		// (8 runs of 16 reads a layer) is cut as a run on one device is.
		{"spread-8dev", piecesGeometry(), []int{8, 8, 8, 8, 8, 8, 8, 8}, eight, 128, 1 << 20, 256, 4, true},
		// Uneven runs: the longer ones' last pieces come last.
		{"uneven", piecesGeometry(), []int{4, 13, 9}, []int{0, 1, 0}, 4, 1 << 20, 256, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := runsOn(tc.ks, tc.devs)
			ps := pieces(runs, tc.devs, tc.g, tc.window, tc.maxIO, tc.maxExtents)
			if len(ps) > tc.maxExtents {
				t.Fatalf("%d pieces, limit %d", len(ps), tc.maxExtents)
			}
			cb := tc.g.ChunkBytesPerLayer()
			next := make([]int, len(runs))
			full := 0
			for i, p := range ps {
				if p.first != next[p.run] || p.k < 1 || p.first+p.k > runs[p.run].K {
					t.Fatalf("piece %d %+v: run %d continues at chunk %d of %d", i, p, p.run, next[p.run], runs[p.run].K)
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
				if next[r] != runs[r].K {
					t.Fatalf("run %d: pieces cover %d of %d chunks", r, next[r], runs[r].K)
				}
			}
			if full != tc.wantChunks {
				t.Fatalf("pieces of %d chunks, want %d", full, tc.wantChunks)
			}
			layers := 1
			if tc.spread {
				layers = 4
			}
			checkWindowSpread(t, runs, tc.devs, ps, tc.g, tc.window, tc.maxIO, full, layers)
		})
	}
}

// checkWindowSpread: in every span of window consecutive reads of a layer's
// entries (kernels' submission order), each device's reads are within one
// piece of its share of the whole layer. layers > 1: runs spread over 8
// devices (layer l of run i on (devs[i]+l) mod 8), and the spans run over
// that many layers' entries, across the layer boundaries.
func checkWindowSpread(t *testing.T, runs []mover.Run, devs []int, ps []piece, g kvshape.Geometry, window, maxIO, pieceChunks, layers int) {
	t.Helper()
	if devs == nil {
		return // spread runs: every layer's reads lie on the devices the layout gives
	}
	var dev []int // device of each read of the layers, in submission order
	for l := range layers {
		for _, p := range ps {
			bytes := int64(p.k) * g.ChunkBytesPerLayer()
			for n := (bytes + int64(maxIO) - 1) / int64(maxIO); n > 0; n-- {
				d := devs[p.run]
				if layers > 1 {
					d = (d + l) % 8
				}
				dev = append(dev, d)
			}
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
		shortest = min(shortest, r.K)
	}
	evenReads := int(int64(shortest)*g.ChunkBytesPerLayer()/int64(maxIO)) * len(runs) * layers
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

// TestPiecesKeepPacedDevicesBusy: the pieces of BENCHMARKS.md's threshold
// restore (llama3-8b, 32,768 tokens: 8 runs of 8 chunks spread over 8
// devices, window 128, 1 MiB reads), issued in their order through the
// model of the GPU's read pipeline on 8 paced devices (kernels/winsim),
// reach 0.95 of the devices' summed rate; the runs whole, as the request
// was before, stay near the 0.911 measured.
func TestPiecesKeepPacedDevicesBusy(t *testing.T) {
	g := piecesGeometry()
	devs := []int{0, 1, 2, 3, 4, 5, 6, 7}
	runs := runsOn([]int{8, 8, 8, 8, 8, 8, 8, 8}, devs)
	const window, maxIO = 128, 1 << 20
	model := func(ps []piece) float64 {
		t.Helper()
		reads := int(int64(ps[0].k) * g.ChunkBytesPerLayer() / maxIO)
		sh := winsim.Shape{Layers: g.Layers, Extents: len(ps), ReadsPerExtent: reads, Devices: len(devs), ReadBytes: maxIO}
		for _, p := range ps {
			if p.k != ps[0].k {
				t.Fatalf("pieces of %d and %d chunks: the model takes one size", ps[0].k, p.k)
			}
			sh.Home = append(sh.Home, devs[p.run])
		}
		r, err := winsim.Run(winsim.OnPacedLoops(sh, winsim.Policy{Window: window, Lookahead: 8}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Fraction
	}
	if f := model(pieces(runs, devs, g, window, maxIO, 256)); f < 0.95 {
		t.Errorf("pieces: %.3f of the devices' rate, want at least 0.95", f)
	}
	var whole []piece
	for i, r := range runs {
		whole = append(whole, piece{run: i, k: r.K})
	}
	if f := model(whole); f > 0.94 {
		t.Errorf("whole runs: %.3f of the devices' rate; the model no longer shows why they were cut", f)
	}
}
