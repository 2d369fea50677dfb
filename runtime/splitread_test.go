package runtime

import (
	"errors"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
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
	var segs [][]crcPart
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
		corrupt func([][]crcPart)
		drop    bool // the last segment never arrives: the read is short
		chunk   int  // chunk a CRC error names (-1: none)
	}{
		{name: "in order", order: []int{0, 1, 2, 3, 4}, chunk: -1},
		{name: "reversed", order: []int{4, 3, 2, 1, 0}, chunk: -1},
		{name: "shuffled", order: []int{2, 0, 4, 1, 3}, chunk: -1},
		{name: "bad piece", order: []int{3, 1, 0, 2, 4}, corrupt: func(s [][]crcPart) { s[2][1].crc ^= 1 }, chunk: 3}, // span chunk 2 = run chunk 3
		{name: "bad first chunk found early", order: []int{1, 0, 3, 2, 4}, corrupt: func(s [][]crcPart) { s[0][0].crc ^= 1 }, chunk: 1},
		{name: "chunk never completed", order: []int{0, 1, 2, 3, 4}, drop: true, chunk: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := make([][]crcPart, len(segs))
			for i := range segs {
				cp[i] = append([]crcPart(nil), segs[i]...)
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
	if _, err := sr.add([]crcPart{{idx: 3, n: 1}}, false); !errors.Is(err, kvshape.ErrOutOfRange) {
		t.Fatalf("piece past the read: %v", err)
	}
	if _, err := newSplitRead(want[:2], sp, 1); !errors.Is(err, kvshape.ErrOutOfRange) {
		t.Fatalf("span past the CRCs: %v", err)
	}
}

// TestSplitReadStore: reads four times a slot's size, whose chunks straddle
// segment boundaries (a 12 KiB slot, 16 KiB chunks), restore bit-exact
// through the consume pool; one flipped byte, in the first, a middle or the
// last segment of a read, makes that run a miss counted as MissCRC, drops
// it from the index, and the runs before it still restore.
func TestSplitReadStore(t *testing.T) {
	g := kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 2}
	for _, tc := range []struct {
		name string
		pos  int64 // payload byte of layer 1 of the second run flipped; -1: none
	}{
		{"healthy", -1},
		{"first segment", 5},
		{"segment boundary", 12<<10 - 1},
		{"middle segment", 20 << 10},
		{"last byte", 3*16<<10 - 1},
	} {
		// Reads into the pages, and (KV memory 64 bytes off O_DIRECT's
		// alignment) into staging, copied.
		for _, staged := range []bool{false, true} {
			name := tc.name + "/direct"
			if staged {
				name = tc.name + "/staged"
			}
			t.Run(name, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(5, 5))
				cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
				cfg.StagingBytes, cfg.StagingSlotBytes = 96<<10, 12<<10
				ch := saveChains(t, cfg, rng, 1)[0]
				s, err := Open(cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				kv := allocShiftedKV(t, g, cfg.Layout, cfg.NumPages, map[bool]int64{false: 0, true: 64}[staged])
				if err := s.RegisterKV(kv.mem); err != nil {
					t.Fatal(err)
				}
				want := 6
				if tc.pos >= 0 {
					want = 3
					flipRunByte(t, s, g, ch[3], 1, tc.pos)
				}
				pages := pageTable(rng, g, cfg.NumPages, len(ch))
				l := loadWait(t, s, ch, pages)
				if l.Blocks() != want {
					t.Fatalf("restored %d blocks, want %d", l.Blocks(), want)
				}
				if err := verify(kv, g, ch, pages, want); err != nil {
					t.Fatal(err)
				}
				st := s.Stats()
				if st.Loads.SplitIOs == 0 {
					t.Fatalf("no read was split: %v", st)
				}
				if direct := st.Loads.DirectReads > 0 && st.Loads.StagedReads == 0; direct == staged {
					t.Fatalf("reads %d direct, %d staged (%s); want staged %v", st.Loads.DirectReads, st.Loads.StagedReads, st.Loads.StagedReason, staged)
				}
				if miss := int64(6 - want); st.Loads.MissBlocks[MissCRC] != miss || st.Loads.CorruptDroppedRuns != min(miss, 1) || s.Lookup(ch) != want {
					t.Fatalf("crc misses %d, dropped %d, lookup %d; want %d, %d, %d", st.Loads.MissBlocks[MissCRC], st.Loads.CorruptDroppedRuns, s.Lookup(ch), miss, min(miss, 1), want)
				}
			})
		}
	}
}

// flipRunByte flips payload byte pos of layer's object of the run whose
// first block is first, on disk.
func flipRunByte(t *testing.T, s *Store, g kvshape.Geometry, first uint64, layer int, pos int64) {
	t.Helper()
	victim := runStartingAt(s, first)
	if victim == nil {
		t.Fatalf("no run starts at block %#x", first)
	}
	off, err := objmap.ObjectOffset(g, victim.Chunks, layer)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(victim.File.Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	at := victim.Offset + off + pos
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xFF
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}
