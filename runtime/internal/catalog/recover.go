package catalog

import (
	"fmt"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/lrufile"
)

// Rebuilding the prefix index at Open.
//
// The rule: after a Close that returned nil, the index is the index before
// Close. Every block that left the index (evicted, discarded, dropped as
// corrupt) was journaled when it left: its run was trimmed to the blocks it
// still served (objmap.Map.Trim) or freed once it served none, and Close
// makes those records durable. So each run is rebuilt with exactly the
// blocks it served (RunInfo.Kept), and a newer run that saved some of
// those blocks again is served whole. Nothing else comes back, and the
// eviction order comes back too (package lrufile).
//
// After a crash the journal may lack the last trims and frees (they are
// not waited for): a block dropped shortly before can come back. Its bytes
// are what its run committed (a run's space is reused only once its free
// record is durable, and a trim frees nothing), every read checks them
// against the run's chunk CRCs, and it is served only where the journal
// cannot say it left. Such a block can also be in two runs, the older one
// whose trim was lost and the newer one that saved it again: the older copy
// is served (an id names its whole prefix, so both hold the same KV) and
// the newer run serves the blocks after it (RecoveryReport.DuplicateBlocks).
// Nothing half-written is ever served: a run is recovered only when its
// commit record, written after its payload and header were durable, is.

// placed is a run in the rebuilt index; its chain from the root is its
// parent's chain through block upTo of the parent, then its own: kept as
// links, materialised per run, so memory stays O(runs + blocks).
type placed struct {
	parent *placed
	upTo   int      // the parent block's index in parent.chain
	chain  []uint64 // the blocks this run serves
}

// blockAt is where a block was placed: index chunk of p.chain.
type blockAt struct {
	p     *placed
	chunk int
}

// fullChain is the chain from the root through block upTo of p, in dst.
func fullChain(p *placed, upTo int, dst []uint64) []uint64 {
	var segs [][]uint64
	for ; p != nil; p, upTo = p.parent, p.upTo {
		segs = append(segs, p.chain[:upTo+1])
	}
	dst = dst[:0]
	for i := len(segs) - 1; i >= 0; i-- {
		dst = append(dst, segs[i]...)
	}
	return dst
}

// Report is what Recover rebuilt; runtime.RecoveryReport says what each
// count means.
type Report struct {
	IndexedRuns, IndexedBlocks     int
	DroppedRuns                    int
	DroppedReasons                 []string
	TrimmedBlocks                  int
	DuplicateBlocks, RefusedBlocks int
	EvictedAtOpen                  int
	LRURestored                    int
	LRUNote                        string
}

// Recover rebuilds the prefix index from the object map's recovered runs
// of a store of layers layers (see the rule above), restores the eviction
// order, then bounds the index to the store's capacity. Runs are visited in
// id order: a parent is committed before any child is allocated, so a live
// parent is placed first; a run whose parent is not stored is unreachable
// and freed. Open calls it once, on an unbounded index, before any load or
// save.
func (c *Catalog) Recover(layers int) (Report, error) {
	var infos []objmap.RunInfo
	c.m.Runs(func(r objmap.RunInfo) bool { infos = append(infos, r); return true })
	var rep Report
	drop := func(info *objmap.RunInfo, why string) {
		rep.DroppedRuns++
		rep.DroppedReasons = append(rep.DroppedReasons, fmt.Sprintf("run %d: %s", info.ID, why))
		_ = c.m.Free(info.ID)
	}
	where := make(map[uint64]blockAt)
	var full []uint64
	for i := range infos {
		info := &infos[i]
		if len(info.ChunkCRCs) != layers*len(info.Chain) {
			drop(info, fmt.Sprintf("%d chunk CRCs for %d layers x %d chunks", len(info.ChunkCRCs), layers, len(info.Chain)))
			continue
		}
		chain := info.Chain[:info.Kept]
		rep.TrimmedBlocks += len(info.Chain) - info.Kept
		lo := 0
		for lo < len(chain) {
			if _, ok := where[chain[lo]]; !ok {
				break
			}
			lo++
		}
		rep.DuplicateBlocks += lo
		if lo == len(chain) {
			drop(info, "an earlier run serves every block it holds")
			continue
		}
		parent, hasParent := info.Parent, info.HasParent
		if lo > 0 {
			parent, hasParent = chain[lo-1], true
		}
		var at blockAt
		at.chunk = -1
		if hasParent {
			w, ok := where[parent]
			if !ok {
				drop(info, fmt.Sprintf("parent block %#x is not stored", parent))
				continue
			}
			at = w
		}
		full = fullChain(at.p, at.chunk, full)
		n, err := c.placeRun(info, full, chain[lo:], lo)
		if err != nil {
			return rep, err
		}
		if n == 0 {
			drop(info, "the index refused its first block")
			continue
		}
		if rest := len(chain) - lo - n; rest > 0 {
			rep.RefusedBlocks += rest
			_ = c.m.Trim(info.ID, lo+n)
		}
		pl := &placed{parent: at.p, upTo: at.chunk, chain: chain[lo : lo+n]}
		for c, id := range pl.chain {
			where[id] = blockAt{pl, c}
		}
		rep.IndexedRuns++
		rep.IndexedBlocks += n
	}
	ids, note := lrufile.Read(c.m.Dirs()[0], int(min(c.indexCapacity()/c.bytesPerBlock+1, prefix.MaxBlocksLimit)))
	rep.LRURestored, rep.LRUNote = c.idx.RestoreLRU(ids), note
	dropped, err := c.idx.SetCapacity(c.indexCapacity())
	if err != nil {
		return rep, fmt.Errorf("rebuilding the index: %w", err)
	}
	rep.EvictedAtOpen = len(dropped)
	c.Release(dropped)
	if err := c.m.Sync(); err != nil {
		return rep, err
	}
	return rep, nil
}

// placeRun puts the blocks of run info that it serves from chain position
// lo on (blocks, after the chain from the root to their parent, full) into
// the index and the run table, and returns how many it placed: all of them
// unless the index holds one already (a collision of ids), which ends the
// run there.
func (c *Catalog) placeRun(info *objmap.RunInfo, full, blocks []uint64, lo int) (int, error) {
	base := len(full)
	full = append(full, blocks...)
	res, err := c.idx.Reserve(full, base, c.bytesPerBlock, nil)
	if err != nil {
		return 0, fmt.Errorf("rebuilding the index: run %d: %w", info.ID, err)
	}
	c.Release(res.Evicted) // none: the index is unbounded while it is rebuilt
	if res.N == 0 {
		return 0, nil
	}
	r := c.newRun(*info)
	r.first, r.live = lo, res.N
	c.mu.Lock()
	c.runs[r.ID] = r
	c.mu.Unlock()
	locs := make([]uint64, res.N)
	for i := range locs {
		locs[i] = loc(r.ID, lo+i)
	}
	dropped, err := c.idx.Commit(blocks[:res.N], locs)
	if err != nil {
		return 0, fmt.Errorf("rebuilding the index: run %d: %w", info.ID, err)
	}
	c.Release(dropped)
	return res.N, nil
}

// indexCapacity is the prefix index's byte capacity: IndexShare of the
// pool's object slots the layers fill (objmap.Layout.SlotFill: all of them
// unless the run width leaves some empty).
func (c *Catalog) indexCapacity() int64 {
	return max(int64(float64(c.m.Stats().CapacityBytes)*IndexShare*c.m.Layout().SlotFill()), 1)
}
