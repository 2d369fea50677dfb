package mover

import (
	"errors"
	"fmt"
	"slices"

	"github.com/tutti-io/tutti/objmap"
)

// Piece is the CRC32C of bytes [Off, Off+N) of one chunk: chunk entry Idx of
// a run's chunk table (a save's: layer*chunks + chunk) or of a read's span
// (a load's: its chunk counted from the span's first). A chunk checksummed
// in pieces (a save's writes cut a chunk, a split read's segments do) gets
// its CRC from them with FoldPieces.
type Piece struct {
	Idx    int
	Off, N int64
	CRC    uint32
}

// ErrCRCCoverage is wrapped when pieces do not cover a chunk exactly once.
var ErrCRCCoverage = errors.New("mover: chunk CRC pieces do not cover the chunk")

// SortPieces orders pieces by chunk entry, then offset.
func SortPieces(ps []Piece) {
	slices.SortFunc(ps, func(a, b Piece) int {
		if a.Idx != b.Idx {
			return a.Idx - b.Idx
		}
		return int(a.Off - b.Off)
	})
}

// FoldPieces is the CRC32C of one chunk of chunkBytes from its pieces
// (sorted by offset), which must cover it exactly, each once.
func FoldPieces(ps []Piece, chunkBytes int64) (uint32, error) {
	crc, at := uint32(0), int64(0)
	for _, p := range ps {
		if p.Off != at {
			return 0, fmt.Errorf("piece at %d, want %d: %w", p.Off, at, ErrCRCCoverage)
		}
		if at == 0 {
			crc = p.CRC
		} else {
			crc = objmap.CombineCRC32C(crc, p.CRC, p.N)
		}
		at += p.N
	}
	if at != chunkBytes {
		return 0, fmt.Errorf("%d of %d bytes checksummed: %w", at, chunkBytes, ErrCRCCoverage)
	}
	return crc, nil
}

// ChunkCRCs folds a run's pieces (from writes completed in any order; sorted
// here) into crcs, its chunk table: the CRC32C of each chunk entry.
func ChunkCRCs(parts []Piece, crcs []uint32, chunkBytes int64) error {
	SortPieces(parts)
	i := 0
	for idx := range crcs {
		j := i
		for j < len(parts) && parts[j].Idx == idx {
			j++
		}
		crc, err := FoldPieces(parts[i:j], chunkBytes)
		if err != nil {
			return fmt.Errorf("chunk entry %d: %w", idx, err)
		}
		crcs[idx] = crc
		i = j
	}
	if i != len(parts) {
		return fmt.Errorf("%d pieces beyond its %d chunk entries: %w", len(parts)-i, len(crcs), ErrCRCCoverage)
	}
	return nil
}

// AddPiece is the piece that n object bytes at off of layer's object (of a
// run of chunks chunks; the bytes within one chunk) extend: the last piece
// of *parts when they continue it, else a new one with CRC 0 appended. The
// caller folds the bytes' CRC into it.
func AddPiece(parts *[]Piece, layer, chunks int, chunkBytes, off, n int64) *Piece {
	idx, in := layer*chunks+int(off/chunkBytes), off%chunkBytes
	ps := *parts
	if k := len(ps); k > 0 && ps[k-1].Idx == idx && ps[k-1].Off+ps[k-1].N == in {
		ps[k-1].N += n
		return &ps[k-1]
	}
	*parts = append(ps, Piece{Idx: idx, Off: in, N: n})
	return &(*parts)[len(*parts)-1]
}

// BlockMultiple is the least common multiple of n (> 0) and
// objmap.BlockBytes: the smallest size that is whole n's and whole O_DIRECT
// blocks.
func BlockMultiple(n int64) int64 {
	x, y := n, int64(objmap.BlockBytes)
	for y != 0 {
		x, y = y, x%y
	}
	return n / x * objmap.BlockBytes
}
