package runtime

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/internal/crashtest"
	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/catalog"
	"github.com/tutti-io/tutti/runtime/internal/mover"
)

// tinyGeometry is small enough for many runs per test yet exercises padding
// (objects are not multiples of 4 KiB) and both planes.
func tinyGeometry() kvshape.Geometry {
	return kvshape.Geometry{Layers: 3, KVHeads: 2, HeadDim: 16, DType: kvshape.BF16, Planes: 2, PageTokens: 4, ChunkPages: 2}
}

// testConfig is a store over fresh temporary directories with small staging
// slots, so objects are read and written in several pieces. Its devices
// "probe" at the seed profile's rates, so that admission does not depend on
// the disk under the test (TestOpenProbesDevices runs the real probe), and
// it does not prewrite (a test store's 64 MiB each, written in the
// background of every test; prewrite_test.go turns it on).
func testConfig(t testing.TB, g kvshape.Geometry, layout kvshape.Layout, numPages int) Config {
	t.Helper()
	return Config{
		probe:            fixedProbe(defaultDevice.WriteBytesPerSec, defaultDevice.ReadBytesPerSec),
		Dirs:             []string{t.TempDir(), t.TempDir()},
		CapacityBytes:    64 << 20,
		Geometry:         g,
		Layout:           layout,
		NumPages:         numPages,
		StagingBytes:     64 << 10,
		StagingSlotBytes: 8 << 10,
		QueueDepth:       16,
		NoPrewrite:       true,
	}
}

// openKV opens cfg and registers fresh host KV memory.
func openKV(t testing.TB, cfg Config) (*Store, *HostKV) {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	kv, err := AllocHostKV(cfg.Geometry, cfg.Layout, cfg.NumPages)
	if err != nil {
		t.Fatalf("AllocHostKV: %v", err)
	}
	if err := s.RegisterKV(kv.Memory()); err != nil {
		t.Fatalf("RegisterKV: %v", err)
	}
	return s, kv
}

func closeKV(t testing.TB, s *Store, kv *HostKV) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := kv.Free(); err != nil {
		t.Errorf("Free: %v", err)
	}
}

// pageTable picks distinct random page ids for n chain blocks.
func pageTable(rng *rand.Rand, g kvshape.Geometry, numPages, blocks int) []int32 {
	perm := rng.Perm(numPages)
	pages := make([]int32, blocks*g.ChunkPages)
	for i := range pages {
		pages[i] = int32(perm[i])
	}
	return pages
}

// disjointLoads is n chains of blocks blocks each (ids from base, 100
// apart) over page tables of distinct random pages, none shared between
// chains: loads of them can be live at once.
func disjointLoads(rng *rand.Rand, g kvshape.Geometry, numPages, n, blocks int, base uint64) ([][]uint64, [][]int32) {
	perm := rng.Perm(numPages)
	per := blocks * g.ChunkPages
	chains, tables := make([][]uint64, n), make([][]int32, n)
	for i := range chains {
		chains[i] = chainOf(base+uint64(100*i), blocks)
		for _, p := range perm[i*per : (i+1)*per] {
			tables[i] = append(tables[i], int32(p))
		}
	}
	return chains, tables
}

// pageMem is host KV memory seen page plane by page plane: a HostKV, or
// views over memory a test laid out itself (shiftedKV).
type pageMem interface {
	Page(layer, plane int, page int32) []byte
}

// fill writes the deterministic content of chain's blocks into their pages.
func fill(kv pageMem, g kvshape.Geometry, chain []uint64, pages []int32) {
	for i, id := range chain {
		for j := 0; j < g.ChunkPages; j++ {
			for l := 0; l < g.Layers; l++ {
				for pl := 0; pl < g.Planes; pl++ {
					kvdata.Fill(kv.Page(l, pl, pages[i*g.ChunkPages+j]), kvdata.Key{Block: id, Layer: l, Plane: pl, Page: j})
				}
			}
		}
	}
}

// scramble overwrites every page (so a restore that skips a page shows).
func scramble(kv pageMem, g kvshape.Geometry, numPages int) {
	for p := 0; p < numPages; p++ {
		for l := 0; l < g.Layers; l++ {
			for pl := 0; pl < g.Planes; pl++ {
				b := kv.Page(l, pl, int32(p))
				for i := range b {
					b[i] = 0xA5
				}
			}
		}
	}
}

// verify checks the first n blocks of chain in their pages; it returns the
// first mismatch.
func verify(kv pageMem, g kvshape.Geometry, chain []uint64, pages []int32, n int) error {
	for i, id := range chain[:n] {
		for j := 0; j < g.ChunkPages; j++ {
			for l := 0; l < g.Layers; l++ {
				for pl := 0; pl < g.Planes; pl++ {
					page := pages[i*g.ChunkPages+j]
					if off := kvdata.Verify(kv.Page(l, pl, page), kvdata.Key{Block: id, Layer: l, Plane: pl, Page: j}); off >= 0 {
						return fmt.Errorf("block %d (id %#x) page %d (engine page %d) layer %d plane %d: byte %d differs", i, id, j, page, l, pl, off)
					}
				}
			}
		}
	}
	return nil
}

// runStartingAt is the stored run whose first block is first, or nil.
func runStartingAt(s *Store, first uint64) *catalog.Run {
	for _, r := range s.cat.Runs() {
		if r.Chain[0] == first {
			return r
		}
	}
	return nil
}

// chainOf makes a chain of n ids starting at base (ids are opaque).
var chainOf = crashtest.Chain

// objectAt is where chunk 0 of layer layer of r lies (the store's Layout):
// its pool file's path and the offset there.
func objectAt(t testing.TB, s *Store, r *catalog.Run, layer int) (string, int64) {
	t.Helper()
	loc, err := s.m.Layout().Where(r.Info.Place(), layer, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s.m.Files()[loc.File].Path, loc.Offset
}

// layerBlocks is, per device, the blocks of every (layer, run) of runs that
// the device reads: a device reading a whole block of every layer counts
// Layers for it.
func layerBlocks(s *Store, runs []mover.Run) map[int]int {
	out := map[int]int{}
	for _, r := range runs {
		for _, dev := range s.m.Layout().LayerDevices(r.Info.File) {
			out[dev] += r.K
		}
	}
	return out
}
