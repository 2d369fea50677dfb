package cpu

// Verifying a split read. A (layer, run) read larger than one staging slot
// is read in segments, one slot each, and its segments are verified and
// scattered by the consume pool in any order, at once: each segment
// checksums the pieces of chunks it holds (segCRCs), and the read's
// splitRead combines a chunk's pieces once all of them arrived
// (objmap.CombineCRC32C) and checks the result against the chunk's CRC. So a
// slot need not hold a whole read for the read to be consumed in parallel,
// and slots can be sized for depth (several reads in flight per device)
// rather than for the largest read.

import (
	"fmt"
	"sync"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover"
)

// segCRCs checksums the payload of one segment as it arrives in order:
// Update takes the bytes that follow the previous ones (payload offset
// next), as objmap.ChunkVerifier's does. A piece's idx is its chunk counted
// from the span's first.
type segCRCs struct {
	next       int64 // payload offset of the next byte
	chunkBytes int64
	pieces     []mover.Piece
}

func (s *segCRCs) Update(p []byte) error {
	for len(p) > 0 {
		c := int(s.next / s.chunkBytes)
		in := s.next % s.chunkBytes
		n := min(int64(len(p)), s.chunkBytes-in)
		if k := len(s.pieces); k == 0 || s.pieces[k-1].Idx != c {
			s.pieces = append(s.pieces, mover.Piece{Idx: c, Off: in})
		}
		last := &s.pieces[len(s.pieces)-1]
		last.CRC = objmap.UpdateCRC32C(last.CRC, p[:n])
		last.N += n
		p, s.next = p[n:], s.next+n
	}
	return nil
}

// splitRead is the verification state of one split (layer, run) read,
// shared by its segments' consume workers.
type splitRead struct {
	mu         sync.Mutex
	want       []uint32 // CRC32C of the span's chunks
	layer      int
	first      int   // the span's first chunk in its run
	chunkBytes int64 // bytes per chunk
	pieces     [][]mover.Piece
	have       []int64 // per chunk: bytes seen
	verified   int
	segsLeft   int   // segments not consumed yet
	bad        error // the first piece or chunk that failed, sticky
}

// newSplitRead starts the check of span sp of a run whose chunk CRCs of
// sp.Layer are layerCRCs, read in segs segments.
func newSplitRead(layerCRCs []uint32, sp objmap.Span, segs int) (*splitRead, error) {
	if sp.First < 0 || sp.K < 1 || sp.First+sp.K > len(layerCRCs) || sp.ChunkBytes < 1 || segs < 1 {
		return nil, fmt.Errorf("verifying layer %d chunks [%d,+%d) in %d segments against %d chunk CRCs: %w",
			sp.Layer, sp.First, sp.K, segs, len(layerCRCs), kvshape.ErrOutOfRange)
	}
	return &splitRead{want: layerCRCs[sp.First : sp.First+sp.K], layer: sp.Layer, first: sp.First, chunkBytes: sp.ChunkBytes,
		pieces: make([][]mover.Piece, sp.K), have: make([]int64, sp.K), segsLeft: segs}, nil
}

// add takes one segment's pieces (nil for a segment whose run already
// failed) and verifies every chunk they complete. last reports that this
// was the read's last segment to be consumed; then err also says whether
// every chunk was verified. A bad chunk is a *objmap.ChunkCRCError, and it
// stays the read's verdict: every later segment, the last included, gets it
// too, so whichever consumer ends the read has acted on it (dropped the
// run) before the read counts as done.
func (r *splitRead) add(pieces []mover.Piece, failed bool) (last bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.segsLeft--
	last = r.segsLeft == 0
	if r.bad == nil {
		r.bad = r.addPieces(pieces)
	}
	switch {
	case r.bad != nil:
		return last, r.bad
	case last && !failed && r.verified != len(r.want):
		return last, fmt.Errorf("objmap: layer %d: %d of %d chunks verified", r.layer, r.verified, len(r.want))
	}
	return last, nil
}

// addPieces files pieces and checks each chunk they complete; the first
// error ends it (the read has failed, the rest need no check).
func (r *splitRead) addPieces(pieces []mover.Piece) error {
	for _, p := range pieces {
		c := p.Idx
		if c < 0 || c >= len(r.want) || r.have[c]+p.N > r.chunkBytes {
			return fmt.Errorf("layer %d: piece [%d,+%d) of chunk %d outside the read: %w", r.layer, p.Off, p.N, r.first+c, kvshape.ErrOutOfRange)
		}
		r.pieces[c] = append(r.pieces[c], p)
		if r.have[c] += p.N; r.have[c] < r.chunkBytes {
			continue
		}
		mover.SortPieces(r.pieces[c])
		crc, err := mover.FoldPieces(r.pieces[c], r.chunkBytes)
		if err != nil {
			return fmt.Errorf("layer %d chunk %d: %w", r.layer, r.first+c, err)
		}
		if crc != r.want[c] {
			return &objmap.ChunkCRCError{Layer: r.layer, Chunk: r.first + c, Got: crc, Want: r.want[c]}
		}
		r.verified++
	}
	return nil
}
