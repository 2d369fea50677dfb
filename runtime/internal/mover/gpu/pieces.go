package gpu

import (
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/mover"
)

// piece is one extent of a GPU restore's layers: chunks [first, first+k)
// of the restore's run run (first relative to the run's own first loaded
// chunk).
type piece struct{ run, first, k int }

// The store's kernels are bound for extentsPerRun extents per run of
// MaxRuns on average, at most maxExtentsCap (MaxExtents).
const (
	extentsPerRun = 4
	maxExtentsCap = 1024
)

// MaxExtents is the extents per layer the kernels are bound for (each
// costs a staging block per slot, so at most maxExtentsCap unless MaxRuns
// asks for more).
func (c Config) MaxExtents() int {
	return max(c.MaxRuns, min(c.MaxRuns*extentsPerRun, maxExtentsCap))
}

// pieces cuts a GPU restore's runs into the extents of its request and
// orders them round-robin over the runs: piece 0 of every run, then piece 1
// of every run, and so on. devs[i] is the device layer 0 of run i lies on
// (objmap.Layout.LayerDevices; with a run width W > 1 layer l of every run
// lies W-rotated from there, so every layer's extents spread over as many
// devices as layer 0's); nil, or a single device: the runs stay whole.
//
// Why: the kernels submit a layer's reads in extent order, as the window
// (window reads in flight over all devices) frees, and a device idles once
// the reads it holds are done before the window reaches its next ones. With
// one extent per (layer, run) of R reads, a device's reads come R at a time,
// and where runs spread layer by layer the device first in layer l is last
// in layer l+1: 2R(runs-1) reads go by between its extents, more than its R
// reads last while the window is short of full (the kick loop holds up to
// two batches of it out of the devices: kernels/winsim; BENCHMARKS.md,
// Save and restore through the store). Pieces of at most window/(2*devices) reads put every device's share of
// any window near 1/devices, whether a run lies on one device or spreads
// (kernels/winsim models both orders: TestPlanOrder).
//
// A piece is a whole number of chunks whose per-layer bytes are a multiple
// of objmap.BlockBytes (so every extent starts on an O_DIRECT boundary, as
// Cut keeps every run's first chunk) and at least one read of
// maxIOBytes where the run is that long. There are at most maxExtents
// pieces (at least len(runs) must be allowed); on one device the runs stay
// whole. runs with k < 1 are not allowed.
func pieces(runs []mover.Run, devs []int, g kvshape.Geometry, window, maxIOBytes, maxExtents int) []piece {
	var dst []piece
	pc := pieceChunks(runs, devs, g, window, maxIOBytes, maxExtents)
	for j, more := 0, true; more; j++ {
		more = false
		for ri, r := range runs {
			first := j * pc
			if first >= r.K {
				continue
			}
			dst = append(dst, piece{run: ri, first: first, k: min(pc, r.K-first)})
			more = more || first+pc < r.K
		}
	}
	return dst
}

// pieceChunks is the chunks of a pieces piece (pieces' doc).
func pieceChunks(runs []mover.Run, devs []int, g kvshape.Geometry, window, maxIOBytes, maxExtents int) int {
	longest := 0
	devices := map[int]bool{}
	for i, r := range runs {
		longest = max(longest, r.K)
		if devs != nil {
			devices[devs[i]] = true
		}
	}
	if len(devices) < 2 {
		return max(longest, 1)
	}
	cb := g.ChunkBytesPerLayer()
	unit := int(mover.BlockMultiple(cb) / cb) // chunks of whole O_DIRECT blocks
	target := max(int64(maxIOBytes), int64(window)*int64(maxIOBytes)/int64(2*len(devices)))
	pc := max(unit, int(target/cb)/unit*unit)
	for pc < longest {
		n := 0
		for _, r := range runs {
			n += (r.K + pc - 1) / pc
		}
		if n <= maxExtents {
			break
		}
		pc += unit
	}
	return min(pc, longest)
}
