package mover

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/objmap"
)

// TestChunkCRCsFromPieces: chunk pieces from writes completed in any order
// fold into the CRC32C of each whole chunk; a missing or overlapping piece
// is ErrCRCCoverage, never a CRC.
func TestChunkCRCsFromPieces(t *testing.T) {
	const layers, chunks, chunkBytes = 2, 3, 1000
	rng := rand.New(rand.NewPCG(9, 9))
	data := make([]byte, layers*chunks*chunkBytes)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	var parts []Piece
	crcs := make([]uint32, layers*chunks)
	want := make([]uint32, layers*chunks)
	for idx := range want {
		chunk := data[idx*chunkBytes : (idx+1)*chunkBytes]
		want[idx] = objmap.UpdateCRC32C(0, chunk)
		// Cut each chunk at random points, as writes of any size cut it.
		for off := 0; off < chunkBytes; {
			n := min(chunkBytes-off, 1+rng.IntN(400))
			parts = append(parts, Piece{Idx: idx, Off: int64(off), N: int64(n), CRC: objmap.UpdateCRC32C(0, chunk[off:off+n])})
			off += n
		}
	}
	rng.Shuffle(len(parts), func(i, j int) { parts[i], parts[j] = parts[j], parts[i] })
	if err := ChunkCRCs(parts, crcs, chunkBytes); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if crcs[i] != want[i] {
			t.Fatalf("chunk entry %d: CRC %08x, want %08x", i, crcs[i], want[i])
		}
	}
	full := parts
	for name, ps := range map[string][]Piece{
		"missing piece":  full[1:],
		"repeated piece": append(append([]Piece(nil), full...), full[0]),
		"beyond the run": append(append([]Piece(nil), full...), Piece{Idx: layers * chunks, N: chunkBytes}),
	} {
		if err := ChunkCRCs(append([]Piece(nil), ps...), crcs, chunkBytes); !errors.Is(err, ErrCRCCoverage) {
			t.Errorf("%s: %v, want ErrCRCCoverage", name, err)
		}
	}
}

// TestAddPiece: bytes that continue the last piece extend it; bytes of
// another chunk, or not adjacent, start a new one.
func TestAddPiece(t *testing.T) {
	var ps []Piece
	AddPiece(&ps, 1, 3, 100, 0, 40).CRC = 1
	AddPiece(&ps, 1, 3, 100, 40, 60)
	AddPiece(&ps, 1, 3, 100, 100, 10)
	AddPiece(&ps, 1, 3, 100, 150, 10)
	want := []Piece{{Idx: 3, Off: 0, N: 100, CRC: 1}, {Idx: 4, Off: 0, N: 10}, {Idx: 4, Off: 50, N: 10}}
	if len(ps) != len(want) {
		t.Fatalf("pieces %+v, want %+v", ps, want)
	}
	for i := range want {
		if ps[i] != want[i] {
			t.Fatalf("pieces %+v, want %+v", ps, want)
		}
	}
	if got := BlockMultiple(3 << 10); got != 12<<10 {
		t.Fatalf("BlockMultiple(3 KiB) = %d, want 12 KiB", got)
	}
}
