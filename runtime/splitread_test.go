package runtime

import (
	"math/rand/v2"
	"os"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

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
	path, off := objectAt(t, s, victim, layer)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	at := off + pos
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xFF
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}
