package tp

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/internal/crashtest"
	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

// gqaGeometry has 4 KV heads (split over 1, 2 or 4 ranks) and objects that
// are not multiples of 4 KiB.
func gqaGeometry() kvshape.Geometry {
	return kvshape.Geometry{Layers: 3, KVHeads: 4, HeadDim: 16, DType: kvshape.BF16, Planes: 2, PageTokens: 4, ChunkPages: 2}
}

// mlaGeometry is one latent plane of one head (replicated on every rank).
func mlaGeometry() kvshape.Geometry {
	return kvshape.Geometry{Layers: 2, KVHeads: 1, HeadDim: 72, DType: kvshape.FP16, Planes: 1, PageTokens: 16, ChunkPages: 1}
}

// groupConfig is a group of n ranks over fresh temporary directories (two
// per rank) with small staging, as runtime's own tests use.
func groupConfig(t testing.TB, n int, g kvshape.Geometry, layout kvshape.Layout, numPages int) Config {
	t.Helper()
	cfg := Config{Ranks: n, Store: runtime.Config{
		CapacityBytes: 32 << 20, Geometry: g, Layout: layout, NumPages: numPages,
		StagingBytes: 64 << 10, StagingSlotBytes: 8 << 10, QueueDepth: 16,
	}}
	for r := 0; r < n; r++ {
		cfg.Dirs = append(cfg.Dirs, []string{t.TempDir(), t.TempDir()})
	}
	return cfg
}

// group is an open Group with each rank's host KV memory.
type group struct {
	*Group
	full     kvshape.Geometry
	numPages int
	kv       []*runtime.HostKV
}

func openGroup(t testing.TB, cfg Config) *group {
	t.Helper()
	g, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	tg := &group{Group: g, full: cfg.Store.Geometry, numPages: cfg.Store.NumPages}
	for r := 0; r < g.Ranks(); r++ {
		kv, err := runtime.AllocHostKV(g.ShardGeometry(), cfg.Store.Layout, cfg.Store.NumPages)
		if err != nil {
			t.Fatalf("AllocHostKV: %v", err)
		}
		tg.kv = append(tg.kv, kv)
		if err := g.RegisterKV(r, kv.Memory()); err != nil {
			t.Fatalf("RegisterKV(%d): %v", r, err)
		}
	}
	return tg
}

func (tg *group) close(t testing.TB) {
	t.Helper()
	if err := tg.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	for _, kv := range tg.kv {
		if err := kv.Free(); err != nil {
			t.Errorf("Free: %v", err)
		}
	}
}

// shardOf (the tests' own reference, independent of CopyShard) returns rank r's part of a whole-model page plane
// [page_tokens, kv_heads, head_dim]: for each token, the rank's heads. A
// replicated (MLA) page is the whole page.
func shardOf(full []byte, g kvshape.Geometry, ranks, r int) []byte {
	if Replicated(g) {
		return full
	}
	h := g.KVHeads / ranks
	headBytes := g.HeadDim * g.DType.Bytes()
	out := make([]byte, 0, len(full)/ranks)
	for tok := 0; tok < g.PageTokens; tok++ {
		at := (tok*g.KVHeads + r*h) * headBytes
		out = append(out, full[at:at+h*headBytes]...)
	}
	return out
}

// wholePage is the content of one page plane of the whole model.
func wholePage(g kvshape.Geometry, key kvdata.Key) []byte {
	b := make([]byte, g.PageBytesPerPlane())
	kvdata.Fill(b, key)
	return b
}

// fill writes every rank's shard of chain's blocks into its pages.
func (tg *group) fill(chain []uint64, pages []int32) {
	g := tg.full
	for i, id := range chain {
		for j := 0; j < g.ChunkPages; j++ {
			for l := 0; l < g.Layers; l++ {
				for pl := 0; pl < g.Planes; pl++ {
					whole := wholePage(g, kvdata.Key{Block: id, Layer: l, Plane: pl, Page: j})
					for r, kv := range tg.kv {
						if err := CopyShard(g, len(tg.kv), r, whole, kv.Page(l, pl, pages[i*g.ChunkPages+j]), true); err != nil {
							panic(err)
						}
					}
				}
			}
		}
	}
}

// verify checks the first n blocks of chain on every rank against its
// shard of the whole-model content.
func (tg *group) verify(chain []uint64, pages []int32, n int) error {
	for r := range tg.kv {
		if err := tg.verifyRank(r, chain, pages, n); err != nil {
			return err
		}
	}
	return nil
}

// verifyRank checks the first n blocks of chain on rank r.
func (tg *group) verifyRank(r int, chain []uint64, pages []int32, n int) error {
	g := tg.full
	for i, id := range chain[:n] {
		for j := 0; j < g.ChunkPages; j++ {
			for l := 0; l < g.Layers; l++ {
				for pl := 0; pl < g.Planes; pl++ {
					whole := wholePage(g, kvdata.Key{Block: id, Layer: l, Plane: pl, Page: j})
					page := pages[i*g.ChunkPages+j]
					if !bytes.Equal(tg.kv[r].Page(l, pl, page), shardOf(whole, g, len(tg.kv), r)) {
						return fmt.Errorf("rank %d block %d (id %#x) page %d (engine page %d) layer %d plane %d differs", r, i, id, j, page, l, pl)
					}
				}
			}
		}
	}
	return nil
}

// scramble overwrites every page of every rank.
func (tg *group) scramble() {
	g := tg.ShardGeometry()
	for _, kv := range tg.kv {
		for l := 0; l < g.Layers; l++ {
			for pl := 0; pl < g.Planes; pl++ {
				for p := 0; p < tg.numPages; p++ {
					b := kv.Page(l, pl, int32(p))
					for i := range b {
						b[i] = 0xA5
					}
				}
			}
		}
	}
}

func pageTable(rng *rand.Rand, g kvshape.Geometry, numPages, blocks int) []int32 {
	perm := rng.Perm(numPages)
	pages := make([]int32, blocks*g.ChunkPages)
	for i := range pages {
		pages[i] = int32(perm[i])
	}
	return pages
}

var chainOf = crashtest.Chain

func saveWait(t testing.TB, g *group, chain []uint64, pages []int32) *Save {
	t.Helper()
	sv, err := g.Save(chain, pages)
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	sv.Wait()
	return sv
}

func loadWait(t testing.TB, g *group, chain []uint64, pages []int32) *Load {
	t.Helper()
	l, err := g.Load(chain, pages)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	for layer := 0; layer < g.full.Layers; layer++ {
		if err := l.WaitLayer(layer); err != nil {
			t.Fatalf("WaitLayer(%d): %v", layer, err)
		}
	}
	if err := l.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return l
}
