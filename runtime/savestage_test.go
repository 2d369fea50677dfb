package runtime

import (
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring"
	"github.com/tutti-io/tutti/uring/uringsim"
)

// TestSaveStripedOverDirs: a save large enough is cut into one run per
// directory, each on its own device, written through write buffers cut from
// the staging slots, and restores bit-exact.
func TestSaveStripedOverDirs(t *testing.T) {
	// 1 MiB per (layer, chunk): a run of one block per device is worth it.
	g := kvshape.Geometry{Layers: 2, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 16}
	const blocks = 8
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()}
	cfg := Config{Dirs: dirs, CapacityBytes: CapacityForBlocks(g, blocks) + 4<<20, Geometry: g, Layout: kvshape.LayoutPerLayer,
		NumPages: 2 * blocks * g.ChunkPages, StagingBytes: 32 << 20, StagingSlotBytes: 8 << 20}
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	if s.writes.BufsPerSlot() != 2 {
		t.Fatalf("%d write buffers per 8 MiB slot, want 2 of 4 MiB", s.writes.BufsPerSlot())
	}
	rng := rand.New(rand.NewPCG(3, 3))
	c := chainOf(9<<32, blocks)
	pages := pageTable(rng, g, cfg.NumPages, blocks)
	fill(kv, g, c, pages)
	if sv := saveWait(t, s, c, pages); sv.Saved() != blocks {
		t.Fatalf("saved %d of %d blocks: %+v", sv.Saved(), blocks, s.Stats())
	}
	devs := map[int]int{}
	for _, r := range s.cat.Runs() {
		devs[r.Device] += r.Chunks
	}
	if len(devs) != len(dirs) {
		t.Fatalf("blocks per device %v: want %d blocks on each of %d devices", devs, blocks/len(dirs), len(dirs))
	}
	for d, n := range devs {
		if n != blocks/len(dirs) {
			t.Fatalf("device %d holds %d blocks (%v), want %d", d, n, devs, blocks/len(dirs))
		}
	}
	scramble(kv, g, cfg.NumPages)
	if l := loadWait(t, s, c, pages); l.Blocks() != blocks {
		t.Fatalf("restored %d of %d blocks", l.Blocks(), blocks)
	}
	if err := verify(kv, g, c, pages, blocks); err != nil {
		t.Fatal(err)
	}
}

// TestStripedPrefixBalanced: the prefix a later request shares with a
// striped save (all of it but its last block, the one that held the end of
// the shared part and the start of what followed) is spread over the
// devices as evenly as whole blocks allow, so its restore is not held up by
// one device reading more than its share: ceil(blocks/dirs) blocks of every
// layer per device at most (a save of 13 blocks cut 4,3,3,3 into runs on
// one device each had one device read 4 of the 12 shared ones, a third more
// than the others; runs spread over the devices do better still).
func TestStripedPrefixBalanced(t *testing.T) {
	// 1 MiB per (layer, chunk): every save below is cut one run per device.
	g := kvshape.Geometry{Layers: 2, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 16}
	saves := []int{10, 13, 15, 17}
	total := 0
	for _, n := range saves {
		total += n
	}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()}
	cfg := Config{Dirs: dirs, CapacityBytes: CapacityForBlocks(g, total) + 16<<20, Geometry: g, Layout: kvshape.LayoutPerLayer,
		NumPages: 17 * g.ChunkPages, StagingBytes: 32 << 20, StagingSlotBytes: 8 << 20}
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	rng := rand.New(rand.NewPCG(5, 5))
	for i, n := range saves {
		c := chainOf(uint64(i+1)<<40, n)
		pages := pageTable(rng, g, cfg.NumPages, n)
		fill(kv, g, c, pages)
		if sv := saveWait(t, s, c, pages); sv.Saved() != n {
			t.Fatalf("save of %d: saved %d blocks: %+v", n, sv.Saved(), s.Stats())
		}
		scramble(kv, g, cfg.NumPages)
		shared := n - 1
		l := loadWait(t, s, c[:shared], pages[:shared*g.ChunkPages])
		if l.Blocks() != shared {
			t.Fatalf("save of %d: restored %d of %d blocks (first failure: %v)", n, l.Blocks(), shared, l.Failure())
		}
		perDev := layerBlocks(s, l.runs)
		want := (shared + len(dirs) - 1) / len(dirs) * g.Layers
		for d, k := range perDev {
			if k > want {
				t.Errorf("save of %d, restore of %d: device %d reads %d blocks (%v), want at most %d", n, shared, d, k, perDev, want)
			}
		}
		if err := verify(kv, g, c, pages, shared); err != nil {
			t.Fatalf("save of %d: %v", n, err)
		}
	}
}

// TestSaveWritesCompleteOutOfOrder: with chunks cut across writes and the
// simulator completing writes out of submission order, every save commits
// CRCs that the restore verifies.
func TestSaveWritesCompleteOutOfOrder(t *testing.T) {
	// 3 KiB per (layer, chunk) against 8 KiB writes: chunks straddle writes.
	g := kvshape.Geometry{Layers: 3, KVHeads: 3, HeadDim: 16, DType: kvshape.BF16, Planes: 2, PageTokens: 4, ChunkPages: 4}
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 128)
	var sim *uringsim.Sim
	cfg.NewEngine = func() (uring.Engine, error) {
		sim = uringsim.New(uringsim.Config{Seed: 11, MinLatencyTicks: 1, MaxLatencyTicks: 40})
		return sim, nil
	}
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	rng := rand.New(rand.NewPCG(11, 11))
	for i := range 6 {
		c := chainOf(uint64(i+1)<<36, 5)
		pages := pageTable(rng, g, cfg.NumPages, len(c))
		fill(kv, g, c, pages)
		if sv := saveWait(t, s, c, pages); sv.Saved() != len(c) {
			t.Fatalf("chain %d: saved %d of %d blocks: %+v", i, sv.Saved(), len(c), s.Stats())
		}
		scramble(kv, g, cfg.NumPages)
		if l := loadWait(t, s, c, pages); l.Blocks() != len(c) {
			t.Fatalf("chain %d: restored %d of %d blocks (first failure: %v)", i, l.Blocks(), len(c), l.Failure())
		}
		if err := verify(kv, g, c, pages, len(c)); err != nil {
			t.Fatalf("chain %d: %v", i, err)
		}
	}
}

// TestSaveWritesWholeChunks: with a chunk that does not divide the write
// limit (an MLA-like shape: one 12 KiB chunk per layer against 64 KiB
// slots), save writes still end on chunk boundaries, so every chunk's CRC
// is one write's piece and the commit combines none; the save restores
// intact.
func TestSaveWritesWholeChunks(t *testing.T) {
	g := kvshape.Geometry{Layers: 3, KVHeads: 1, HeadDim: 768, DType: kvshape.BF16, Planes: 1, PageTokens: 4, ChunkPages: 2}
	const blocks = 16
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 2*blocks*g.ChunkPages)
	cfg.Dirs = cfg.Dirs[:1]
	cfg.StagingBytes, cfg.StagingSlotBytes = 512<<10, 64<<10
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	if cb := g.ChunkBytesPerLayer(); s.maxWriteIOBytes%cb != 0 || s.maxWriteIOBytes > cfg.StagingSlotBytes {
		t.Fatalf("save writes of %d bytes: want a multiple of the %d-byte chunk within the %d-byte slot", s.maxWriteIOBytes, cb, cfg.StagingSlotBytes)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	c := chainOf(11<<32, blocks)
	pages := pageTable(rng, g, cfg.NumPages, blocks)
	fill(kv, g, c, pages)
	sv := saveWait(t, s, c, pages)
	if sv.Saved() != blocks {
		t.Fatalf("saved %d of %d blocks: %+v", sv.Saved(), blocks, s.Stats())
	}
	if pieces, entries := sv.txn.Pieces(); pieces != entries {
		t.Errorf("%d CRC pieces for %d (layer, chunk) entries: writes cut chunks", pieces, entries)
	}
	scramble(kv, g, cfg.NumPages)
	if l := loadWait(t, s, c, pages); l.Blocks() != blocks {
		t.Fatalf("restored %d of %d blocks", l.Blocks(), blocks)
	}
	if err := verify(kv, g, c, pages, blocks); err != nil {
		t.Fatal(err)
	}
}
