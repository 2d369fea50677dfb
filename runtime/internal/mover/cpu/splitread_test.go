package cpu

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover"
)

// TestSplitReadPieces: a split read's chunk pieces verify in any order of
// arrival; a wrong byte anywhere in a chunk is a *ChunkCRCError naming it,
// which the read's last segment also gets however late it comes, a
// chunk never completed fails the read's last segment, and a piece outside
// the read is refused.
func TestSplitReadPieces(t *testing.T) {
	const chunk = 10000
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 3*chunk)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	want := []uint32{0xdead, objmap.CRC32C(data[:chunk]), objmap.CRC32C(data[chunk : 2*chunk]), objmap.CRC32C(data[2*chunk:])}
	sp := objmap.Span{Layer: 2, First: 1, K: 3, ChunkBytes: chunk}
	// Segments of 7000 payload bytes: pieces straddle chunk boundaries.
	var segs [][]mover.Piece
	for off := 0; off < len(data); off += 7000 {
		c := segCRCs{next: int64(off), chunkBytes: chunk}
		end := min(off+7000, len(data))
		for p := off; p < end; p += 512 { // in pieces of a page, as restorePages feeds it
			if err := c.Update(data[p:min(p+512, end)]); err != nil {
				t.Fatal(err)
			}
		}
		segs = append(segs, c.pieces)
	}
	for _, tc := range []struct {
		name    string
		order   []int
		corrupt func([][]mover.Piece)
		drop    bool // the last segment never arrives: the read is short
		chunk   int  // chunk a CRC error names (-1: none)
	}{
		{name: "in order", order: []int{0, 1, 2, 3, 4}, chunk: -1},
		{name: "reversed", order: []int{4, 3, 2, 1, 0}, chunk: -1},
		{name: "shuffled", order: []int{2, 0, 4, 1, 3}, chunk: -1},
		{name: "bad piece", order: []int{3, 1, 0, 2, 4}, corrupt: func(s [][]mover.Piece) { s[2][1].CRC ^= 1 }, chunk: 3}, // span chunk 2 = run chunk 3
		{name: "bad first chunk found early", order: []int{1, 0, 3, 2, 4}, corrupt: func(s [][]mover.Piece) { s[0][0].CRC ^= 1 }, chunk: 1},
		{name: "chunk never completed", order: []int{0, 1, 2, 3, 4}, drop: true, chunk: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := make([][]mover.Piece, len(segs))
			for i := range segs {
				cp[i] = append([]mover.Piece(nil), segs[i]...)
			}
			if tc.corrupt != nil {
				tc.corrupt(cp)
			}
			sr, err := newSplitRead(want, sp, len(cp))
			if err != nil {
				t.Fatal(err)
			}
			var firstErr, lastErr error
			for i, k := range tc.order {
				pieces := cp[k]
				if tc.drop && i == len(tc.order)-1 {
					pieces = nil
				}
				// As in a load: once a segment failed the run, the later
				// ones are consumed without their pieces.
				failed := firstErr != nil
				if failed {
					pieces = nil
				}
				last, err := sr.add(pieces, failed)
				if last != (i == len(tc.order)-1) {
					t.Fatalf("segment %d: last %v", i, last)
				}
				if firstErr == nil {
					firstErr = err
				}
				if last {
					lastErr = err
				}
			}
			var ce *objmap.ChunkCRCError
			switch {
			case tc.chunk >= 0:
				if !errors.As(firstErr, &ce) || ce.Chunk != tc.chunk || ce.Layer != 2 {
					t.Fatalf("err %v, want a CRC error of layer 2 chunk %d", firstErr, tc.chunk)
				}
				// The consumer that ends the read must see the verdict too,
				// or the read could count as done before the run is dropped.
				if !errors.Is(lastErr, objmap.ErrChunkCRC) {
					t.Fatalf("last segment's err %v, want the CRC error", lastErr)
				}
			case tc.drop:
				if firstErr == nil || errors.As(firstErr, &ce) {
					t.Fatalf("err %v, want chunks not verified", firstErr)
				}
			case firstErr != nil:
				t.Fatal(firstErr)
			}
		})
	}
	sr, _ := newSplitRead(want, sp, 1)
	if _, err := sr.add([]mover.Piece{{Idx: 3, N: 1}}, false); !errors.Is(err, kvshape.ErrOutOfRange) {
		t.Fatalf("piece past the read: %v", err)
	}
	if _, err := newSplitRead(want[:2], sp, 1); !errors.Is(err, kvshape.ErrOutOfRange) {
		t.Fatalf("span past the CRCs: %v", err)
	}
}
