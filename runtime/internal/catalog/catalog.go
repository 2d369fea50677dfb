// Package catalog is what a store serves: its committed runs beside the
// prefix index that names their blocks, kept consistent with the object
// map. A block leaves the index (evicted, discarded, aborted, dropped as
// corrupt) and its run is trimmed to the blocks it still serves, or freed
// once it serves none, each journaled, so a reopened store serves exactly
// what this one does (Recover rebuilds the index from the journal's runs).
// Loads resolve pinned blocks to runs here; saves commit runs here.
package catalog

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
	"github.com/tutti-io/tutti/uring"
)

// IndexShare is the share of the pool the prefix index may fill with
// payload: headers and padding are covered by the rest.
const IndexShare = 0.9

// Run is a committed run as the store serves it: objmap's RunInfo (extent,
// chain, per-(layer, chunk) CRC32C) plus what loads need at hand. Its
// exported fields are immutable after registration. File and Device are
// its home pool file (header and chunk table) and that file's device; its
// layers lie where the object map's Layout puts them.
type Run struct {
	Info   objmap.RunInfo
	ID     objmap.RunID
	File   *uring.File
	Device int
	Offset int64
	Chunks int
	Chain  []uint64
	// The run serves Chain[first:first+live]: first is 0 but where a crash
	// left an older run serving the blocks before (recover.go); blocks
	// leave from the end (a block leaves the index only after the blocks
	// below it), so live only shrinks (Catalog.mu).
	first int
	live  int
	// corrupt is set by the first DropCorrupt: a run found bad by several
	// reads (segments, layers or loads) is dropped and counted once.
	corrupt atomic.Bool
}

// Catalog is a store's run table, index and object map kept consistent.
// Its methods are safe for concurrent use.
type Catalog struct {
	m             *objmap.Map
	idx           *kvmeta.Index
	dirs          int
	bytesPerBlock int64

	mu   sync.Mutex
	runs map[objmap.RunID]*Run
}

// New is the catalog of map m and index idx, both empty of runs until
// Recover; dirs is the store's directory count, bytesPerBlock what one
// block costs in the index's capacity.
func New(m *objmap.Map, idx *kvmeta.Index, dirs int, bytesPerBlock int64) *Catalog {
	return &Catalog{m: m, idx: idx, dirs: dirs, bytesPerBlock: bytesPerBlock, runs: make(map[objmap.RunID]*Run)}
}

// BytesPerBlock is what one chain block costs in the index's capacity.
func (c *Catalog) BytesPerBlock() int64 { return c.bytesPerBlock }

// DeviceOf maps a pool file to its device (objmap.Layout.Device).
func (c *Catalog) DeviceOf(file int) int { return c.m.Layout().Device(file) }

func (c *Catalog) newRun(info objmap.RunInfo) *Run {
	return &Run{Info: info, ID: info.ID, File: c.m.Files()[info.File], Device: c.DeviceOf(info.File),
		Offset: info.Offset, Chunks: len(info.Chain), Chain: info.Chain, live: len(info.Chain)}
}

// loc packs a run id and a chunk index into the prefix index's location.
func loc(id objmap.RunID, chunk int) uint64 { return uint64(id)<<16 | uint64(chunk) }

func unloc(l uint64) (objmap.RunID, int) { return objmap.RunID(l >> 16), int(l & 0xffff) }

// Span is a stretch of a chain stored consecutively in one run: chunks
// [First, First+K) of Run hold chain positions [ChainPos, ChainPos+K).
type Span struct {
	Run      *Run
	First, K int
	ChainPos int
}

// Resolve maps pinned blocks (chain, with the locations Pin returned) to
// runs: consecutive blocks stored consecutively in one run form one Span.
// A block whose run is unknown ends the prefix; notFound counts the blocks
// from it on.
func (c *Catalog) Resolve(chain, locs []uint64) (spans []Span, notFound int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range chain {
		rid, chunk := unloc(locs[i])
		r := c.runs[rid]
		if r != nil && chunk < r.Chunks && r.Chain[chunk] == id {
			if n := len(spans); n > 0 && spans[n-1].Run == r && spans[n-1].First+spans[n-1].K == chunk {
				spans[n-1].K++
			} else {
				spans = append(spans, Span{Run: r, First: chunk, K: 1, ChainPos: i})
			}
			continue
		}
		return spans, len(chain) - i
	}
	return spans, 0
}

// Release frees the storage of blocks that left the index and journals
// that they left: a run is freed in the object map once none of its blocks
// is indexed, and trimmed to the blocks it still serves before that, so a
// reopened store serves exactly what this one does (recover.go). Every
// index call that drops blocks is followed by a Release of them.
func (c *Catalog) Release(dropped []prefix.Dropped) (freedBytes int64) {
	if len(dropped) == 0 {
		return 0
	}
	var free []objmap.RunID
	var cut []*Run
	c.mu.Lock()
	for _, d := range dropped {
		rid, _ := unloc(d.Loc)
		r := c.runs[rid]
		if r == nil {
			continue
		}
		r.live--
		if r.live == 0 {
			delete(c.runs, rid)
			free = append(free, rid)
			freedBytes += r.Info.Length
		} else if !slices.Contains(cut, r) {
			cut = append(cut, r)
		}
	}
	type trim struct {
		id   objmap.RunID
		keep int
	}
	trims := make([]trim, 0, len(cut))
	for _, r := range cut {
		if r.live > 0 {
			trims = append(trims, trim{r.ID, r.first + r.live})
		}
	}
	c.mu.Unlock()
	// A failed trim or free (the journal failed closed, or a concurrent
	// release freed the run first) leaves the blocks on disk, unserved;
	// only a restart may serve them again (see recover.go). Trims only
	// shorten, so concurrent releases may journal them in any order.
	for _, t := range trims {
		_ = c.m.Trim(t.id, t.keep)
	}
	for _, id := range free {
		_ = c.m.Free(id)
	}
	return freedBytes
}

// EvictRuns evicts least recently used blocks until the runs they free hold
// needBytes of pool space, or nothing more can be evicted. The index evicts
// blocks, the pool frees whole runs (a run stays while any block of it is
// indexed), so the index can have room where the pool has none.
func (c *Catalog) EvictRuns(needBytes int64) {
	for freed := int64(0); freed < needBytes; {
		dropped := c.idx.Evict(1) // one block
		if len(dropped) == 0 {
			return
		}
		freed += c.Release(dropped)
	}
}

// DropCorrupt takes a run whose payload failed its CRC out of service with
// everything cached below it (unreachable without it). It reports whether
// this call dropped it (a run found bad by several reads is dropped once).
func (c *Catalog) DropCorrupt(r *Run) bool {
	if r.corrupt.Swap(true) {
		return false // dropped by an earlier read
	}
	dropped, err := c.idx.Remove(r.Chain[r.first])
	if err != nil {
		return false // already removed by a concurrent load
	}
	c.Release(dropped)
	return true
}

// Commit serves run id, just committed in the object map for the blocks
// chain (its whole chain): it joins the run table, then its blocks are
// committed in the index (which reserved them).
func (c *Catalog) Commit(id objmap.RunID, chain []uint64) {
	info, ok := c.m.Lookup(id)
	if !ok {
		panic(fmt.Sprintf("catalog: run %d committed but unknown to objmap", id))
	}
	r := c.newRun(info)
	c.mu.Lock()
	c.runs[r.ID] = r
	c.mu.Unlock()
	locs := make([]uint64, len(chain))
	for i := range locs {
		locs[i] = loc(r.ID, i)
	}
	dropped, err := c.idx.Commit(chain, locs)
	if err != nil {
		panic(fmt.Sprintf("catalog: committing run %d in the index: %v", r.ID, err))
	}
	c.Release(dropped)
}

// Runs is a snapshot of the run table, in no particular order.
func (c *Catalog) Runs() []*Run {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*Run, 0, len(c.runs))
	for _, r := range c.runs {
		out = append(out, r)
	}
	return out
}

// served reports whether block c of r is the one the index serves.
func (c *Catalog) served(r *Run, chunk int) (prefix.Entry, bool) {
	e, ok := c.idx.Get(r.Chain[chunk])
	// A run whose block left the index may share the id with a newer run:
	// only the block the index points at counts.
	return e, ok && !e.Draining && e.Loc == loc(r.ID, chunk) && (e.State == prefix.StateResident || e.State == prefix.StatePinned)
}

// Contents lists the served blocks for a KV events replay (called in the
// publisher's order): per run, in run id order (a parent run is committed
// before any child run is allocated, so parents come first), its leading
// blocks still served.
func (c *Catalog) Contents(emit func(kvevents.Event)) {
	runs := c.Runs()
	slices.SortFunc(runs, func(a, b *Run) int { return cmp.Compare(a.ID, b.ID) })
	for _, r := range runs {
		n := 0
		for ch := r.first; ch < len(r.Chain); ch++ {
			if _, ok := c.served(r, ch); !ok {
				break
			}
			n++
		}
		if n == 0 {
			continue
		}
		parent, hasParent := r.Info.Parent, r.Info.HasParent
		if r.first > 0 {
			parent, hasParent = r.Chain[r.first-1], true
		}
		emit(c.idx.Stored(r.Chain[r.first:r.first+n], parent, hasParent))
	}
}

// Block is one block that is a hit, with its parent in the chain.
type Block struct {
	ID        uint64
	Parent    uint64 // valid when HasParent
	HasParent bool
}

// Resident lists every block that is a hit now (committed, not draining),
// each once, in no particular order. O(blocks).
func (c *Catalog) Resident() []Block {
	var out []Block
	for _, r := range c.Runs() {
		for ch, id := range r.Chain {
			if e, ok := c.served(r, ch); ok {
				out = append(out, Block{ID: id, Parent: e.Parent, HasParent: e.HasParent})
			}
		}
	}
	return out
}
