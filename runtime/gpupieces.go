package runtime

import (
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
)

// gpuPiece is one extent of a GPU restore's layers: chunks [first, first+k)
// of load run run (first relative to the run's own first loaded chunk).
type gpuPiece struct{ run, first, k int }

// The store's kernels are bound for gpuExtentsPerRun extents per run of
// GPU.MaxRuns on average, at most gpuMaxExtentsCap (gpuMaxExtents).
const (
	gpuExtentsPerRun = 4
	gpuMaxExtentsCap = 1024
)

// gpuMaxExtents is the extents per layer the store's kernels are bound for
// (each costs a staging block per slot, so at most gpuMaxExtentsCap unless
// GPU.MaxRuns asks for more).
func (c *Config) gpuMaxExtents() int {
	return max(c.GPU.MaxRuns, min(c.GPU.MaxRuns*gpuExtentsPerRun, gpuMaxExtentsCap))
}

// gpuPieces cuts a GPU restore's runs into the extents of its request and
// orders them round-robin over the runs: piece 0 of every run, then piece 1
// of every run, and so on.
//
// Why: the kernels submit a layer's reads in extent order, as the window
// (window reads in flight over all devices) frees, and a run lies on one
// device. With one extent per run, a layer whose runs are longer than
// window/devices reads keeps the window on a few devices at a time and the
// others idle (BENCHMARKS.md, What the defaults rest on). Pieces of at most
// window/(2*devices) reads put every device's share of any window near
// 1/devices.
//
// A piece is a whole number of chunks whose per-layer bytes are a multiple
// of objmap.BlockBytes (so every extent starts on an O_DIRECT boundary, as
// gpuCut keeps every run's first chunk) and at least one read of
// maxIOBytes where the run is that long. There are at most maxExtents
// pieces (at least len(runs) must be allowed); on one device the runs stay
// whole. runs with k < 1 are not allowed.
func gpuPieces(runs []loadRun, g kvshape.Geometry, window, maxIOBytes, maxExtents int) []gpuPiece {
	var dst []gpuPiece
	pc := gpuPieceChunks(runs, g, window, maxIOBytes, maxExtents)
	for j, more := 0, true; more; j++ {
		more = false
		for ri, r := range runs {
			first := j * pc
			if first >= r.k {
				continue
			}
			dst = append(dst, gpuPiece{run: ri, first: first, k: min(pc, r.k-first)})
			more = more || first+pc < r.k
		}
	}
	return dst
}

// gpuPieceChunks is the chunks of a gpuPieces piece (gpuPieces' doc).
func gpuPieceChunks(runs []loadRun, g kvshape.Geometry, window, maxIOBytes, maxExtents int) int {
	longest := 0
	devices := map[int]bool{}
	for _, r := range runs {
		longest = max(longest, r.k)
		devices[r.run.Device] = true
	}
	if len(devices) < 2 {
		return max(longest, 1)
	}
	cb := g.ChunkBytesPerLayer()
	unit := int(lcm(cb, objmap.BlockBytes) / cb) // chunks of whole O_DIRECT blocks
	target := max(int64(maxIOBytes), int64(window)*int64(maxIOBytes)/int64(2*len(devices)))
	pc := max(unit, int(target/cb)/unit*unit)
	for pc < longest {
		n := 0
		for _, r := range runs {
			n += (r.k + pc - 1) / pc
		}
		if n <= maxExtents {
			break
		}
		pc += unit
	}
	return min(pc, longest)
}
