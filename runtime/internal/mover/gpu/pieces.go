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
// Cut keeps every run's first chunk) and at least one read of
// maxIOBytes where the run is that long. There are at most maxExtents
// pieces (at least len(runs) must be allowed); on one device the runs stay
// whole. runs with k < 1 are not allowed.
func pieces(runs []mover.Run, g kvshape.Geometry, window, maxIOBytes, maxExtents int) []piece {
	var dst []piece
	pc := pieceChunks(runs, g, window, maxIOBytes, maxExtents)
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
func pieceChunks(runs []mover.Run, g kvshape.Geometry, window, maxIOBytes, maxExtents int) int {
	longest := 0
	devices := map[int]bool{}
	for _, r := range runs {
		longest = max(longest, r.K)
		devices[r.Device] = true
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
