package catalog

import (
	"slices"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
)

var geo = kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, DType: kvshape.BF16, Planes: 2, PageTokens: 4, ChunkPages: 2}

// open is a catalog over a fresh or reopened buffered map in dirs,
// recovered.
func open(t *testing.T, dirs []string) (*Catalog, *objmap.Map, Report) {
	t.Helper()
	m, err := objmap.Open(objmap.Options{Dirs: dirs, CapacityBytes: 16 << 20, Geometry: geo, Buffered: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	pidx, err := prefix.New(prefix.Config{CapacityBytes: prefix.MaxCapacityBytes})
	if err != nil {
		t.Fatal(err)
	}
	idx, err := kvmeta.Open(pidx, nil, dirs[0], geo.ChunkPages*geo.PageTokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := New(m, idx, len(dirs), geo.ChunkBytes())
	rep, err := c.Recover(geo.Layers)
	if err != nil {
		t.Fatal(err)
	}
	return c, m, rep
}

// save reserves, allocates and commits chain[from:] as one run.
func save(t *testing.T, c *Catalog, m *objmap.Map, chain []uint64, from int) {
	t.Helper()
	res, err := c.idx.Reserve(chain, from, c.BytesPerBlock(), nil)
	if err != nil || res.N != len(chain)-from {
		t.Fatalf("reserve: %+v, %v", res, err)
	}
	rs, err := m.Allocate(res.N)
	if err != nil || len(rs) != 1 {
		t.Fatalf("allocate: %v, %v", rs, err)
	}
	req := objmap.CommitRequest{Res: rs[0], Chain: chain[from:], ChunkCRCs: make([]uint32, geo.Layers*res.N)}
	if from > 0 {
		req.Parent, req.HasParent = chain[from-1], true
	}
	if err := m.Commit([]objmap.CommitRequest{req}); err != nil {
		t.Fatal(err)
	}
	c.Commit(rs[0].ID, chain[from:])
}

// TestCatalog: committed runs resolve to spans, a block that leaves the
// index trims its run and the last one frees it, a corrupt run is dropped
// once with what hangs below it, and a reopened catalog serves what this
// one served.
func TestCatalog(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir()}
	c, m, _ := open(t, dirs)
	chain := []uint64{1, 2, 3, 4, 5}
	save(t, c, m, chain[:3], 0)
	save(t, c, m, chain, 3)
	n, locs := c.idx.Pin(chain, nil)
	spans, notFound := c.Resolve(chain[:n], locs)
	if n != 5 || notFound != 0 || len(spans) != 2 || spans[0].K != 3 || spans[1].ChainPos != 3 || spans[1].K != 2 {
		t.Fatalf("resolve: pinned %d, %d not found, spans %+v", n, notFound, spans)
	}
	dropped, err := c.idx.Unpin(chain)
	if err != nil {
		t.Fatal(err)
	}
	c.Release(dropped)
	if got := len(c.Resident()); got != 5 {
		t.Fatalf("%d resident blocks, want 5", got)
	}
	c.Release(c.idx.Evict(1)) // the leaf: block 5, trimming the second run
	if ids := blockIDs(c.Resident()); !slices.Equal(ids, []uint64{1, 2, 3, 4}) {
		t.Fatalf("after one eviction: %v", ids)
	}
	if !c.DropCorrupt(spans[1].Run) || c.DropCorrupt(spans[1].Run) {
		t.Fatal("a corrupt run must be dropped exactly once")
	}
	if ids := blockIDs(c.Resident()); !slices.Equal(ids, []uint64{1, 2, 3}) || len(c.Runs()) != 1 {
		t.Fatalf("after the drop: %v in %d runs", ids, len(c.Runs()))
	}
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	c2, _, rep := open(t, dirs)
	if ids := blockIDs(c2.Resident()); !slices.Equal(ids, []uint64{1, 2, 3}) || rep.IndexedRuns != 1 || rep.IndexedBlocks != 3 {
		t.Fatalf("reopened: %v, %+v", ids, rep)
	}
}

func blockIDs(bs []Block) []uint64 {
	var ids []uint64
	for _, b := range bs {
		ids = append(ids, b.ID)
	}
	slices.Sort(ids)
	return ids
}
