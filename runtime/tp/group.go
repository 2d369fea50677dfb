package tp

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime"
)

// Group is N tensor-parallel ranks, one runtime.Store each. Every method is
// safe for concurrent use.
type Group struct {
	cfg     Config
	shard   kvshape.Geometry
	ranks   []*runtime.Store
	devices []int

	// idx holds the blocks every rank committed (locations unused: the
	// group owns no storage). commitMu makes each Reserve+Commit pair on it
	// atomic, so nobody sees a group block pending.
	idx           *prefix.Index
	commitMu      sync.Mutex
	bytesPerBlock int64

	mu     sync.Mutex
	closed bool
	ops    sync.WaitGroup // group loads and saves in flight
	// savesLive counts group saves not ended; savesCond (on mu) wakes
	// WaitSaves.
	savesLive int
	savesCond sync.Cond

	report RecoveryReport
	stats  counters
}

// RecoveryReport is what Open found on every rank and what it reconciled.
type RecoveryReport struct {
	// Rank[r] is rank r's own recovery (object map and index rebuild).
	Rank []runtime.RecoveryReport
	// GroupBlocks were resident on every rank (same id under the same
	// parent, all ancestors too) and were indexed in the group index.
	GroupBlocks int
	// DiscardedBlocks[r] were resident on rank r but not on every rank (a
	// crash between the ranks' commits, or a failed save whose discard did
	// not finish): discarded on rank r, never served.
	DiscardedBlocks []int
}

// Stats are the group's counters since Open, and each rank's.
type Stats struct {
	Ranks int

	Lookups      int64 // Lookup calls
	LookupBlocks int64 // blocks asked for by Lookup
	HitBlocks    int64 // blocks Lookup found on every rank
	// ClippedBlocks were in the group index but no longer on some rank
	// (evicted or dropped as corrupt there): pruned from the group index.
	ClippedBlocks int64

	Loads          int64 // Load calls
	LoadHitBlocks  int64 // group hits at Load
	RestoredBlocks int64 // blocks restored on every rank (sum of final Blocks)

	Saves           int64 // Save calls
	CommittedBlocks int64 // blocks added to the group index (committed on every rank)
	// FailedSaves are saves in which some rank did not store a block it
	// was asked to for another cause than SkipCached (an I/O error, ENOSPC,
	// no space, the save budget, closing); FailedRankSaves counts the rank
	// saves by the causes they skipped blocks for (indexed by
	// runtime.SkipCause).
	FailedSaves     int64
	FailedRankSaves []int64
	// DiscardedBlocks were committed on some ranks by a failed save (or
	// found at recovery on some ranks only) and discarded there.
	DiscardedBlocks int64

	// IndexBlocks is the size of the group index now.
	IndexBlocks int

	// Rank[r] are rank r's store counters.
	Rank []runtime.Stats
}

type counters struct {
	lookups, lookupBlocks, hitBlocks, clipped atomic.Int64
	loads, loadHits, restored                 atomic.Int64
	saves, committed, failedSaves, discarded  atomic.Int64
	failedRank                                []atomic.Int64
}

// Open opens (or creates) every rank's store concurrently: rank r with the
// shard geometry (ShardGeometry), its own directories Dirs[r] and, on
// PathGPU, its own device. Each store recovers on its own; then Open
// rebuilds the group index as the intersection of the ranks' resident
// blocks and discards on each rank what not every rank has (see the package
// doc). If any rank fails to open, the others are closed and the errors are
// returned, each naming its rank.
func Open(cfg Config) (*Group, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	shard, _ := ShardGeometry(cfg.Store.Geometry, cfg.Ranks)
	devs, err := rankDevices(&cfg)
	if err != nil {
		return nil, err
	}
	g := &Group{cfg: cfg, shard: shard, devices: devs, ranks: make([]*runtime.Store, cfg.Ranks)}
	g.savesCond.L = &g.mu
	g.stats.failedRank = make([]atomic.Int64, len(runtime.SkipCauses()))
	errs := eachRank(cfg.Ranks, func(r int) (err error) {
		if g.ranks[r], err = runtime.Open(cfg.rankConfig(r, shard, devs[r])); err != nil {
			return fmt.Errorf("tp: opening rank %d: %w", r, err)
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		g.closeRanks()
		return nil, err
	}
	capBytes := g.ranks[0].Stats().Map.CapacityBytes
	for _, s := range g.ranks[1:] {
		capBytes = min(capBytes, s.Stats().Map.CapacityBytes)
	}
	// The ranks index at most their pool's capacity (in the same bytes per
	// block), so this group index holds every block all of them can hold:
	// it is bounded, and evicts on its own only stale entries.
	g.bytesPerBlock = shard.ChunkBytes()
	if g.idx, err = prefix.New(prefix.Config{CapacityBytes: max(capBytes, g.bytesPerBlock)}); err != nil {
		g.closeRanks()
		return nil, fmt.Errorf("tp: open: group index: %w", err)
	}
	if err := g.reconcile(); err != nil {
		g.closeRanks()
		return nil, fmt.Errorf("tp: open: reconciling the ranks: %w", err)
	}
	return g, nil
}

func (g *Group) closeRanks() error {
	var errs []error
	for r, s := range g.ranks {
		if s != nil {
			if err := s.Close(); err != nil {
				errs = append(errs, fmt.Errorf("tp: closing rank %d: %w", r, err))
			}
		}
	}
	return errors.Join(errs...)
}

// reconcile builds the group index from what every rank recovered: a block
// is a group block when every rank has it resident under the same parent and
// its parent is a group block. Every other resident block is discarded on the
// ranks that have it.
func (g *Group) reconcile() error {
	n := len(g.ranks)
	rep := RecoveryReport{DiscardedBlocks: make([]int, n)}
	sets := make([]map[uint64]runtime.ResidentBlock, n)
	for r, s := range g.ranks {
		rep.Rank = append(rep.Rank, s.Recovery())
		bs := s.ResidentBlocks()
		sets[r] = make(map[uint64]runtime.ResidentBlock, len(bs))
		for _, b := range bs {
			sets[r][b.ID] = b
		}
	}
	common := make(map[uint64]runtime.ResidentBlock)
	for id, b := range sets[0] {
		everywhere := true
		for _, set := range sets[1:] {
			if o, ok := set[id]; !ok || o != b {
				everywhere = false
				break
			}
		}
		if everywhere {
			common[id] = b
		}
	}
	var roots []uint64
	children := make(map[uint64][]uint64)
	for id, b := range common {
		if !b.HasParent {
			roots = append(roots, id)
		} else if _, ok := common[b.Parent]; ok {
			children[b.Parent] = append(children[b.Parent], id)
		}
	}
	slices.Sort(roots)
	// Depth-first from each root; a leaf's root-to-leaf path goes into the
	// group index from its first block not indexed yet. Cost: the sum of
	// the leaves' depths (Reserve walks the indexed part), at Open only.
	in := make(map[uint64]bool, len(common))
	type frame struct {
		id    uint64
		depth int
	}
	var stack []frame
	var path []uint64
	for _, root := range roots {
		stack = append(stack[:0], frame{root, 0})
		for len(stack) > 0 {
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			path = append(path[:f.depth], f.id)
			kids := children[f.id]
			if len(kids) == 0 {
				_, k, err := g.indexPath(path)
				if err != nil {
					return err
				}
				for _, id := range path[:k] {
					in[id] = true
				}
				continue
			}
			slices.Sort(kids)
			for _, c := range slices.Backward(kids) {
				stack = append(stack, frame{c, f.depth + 1})
			}
		}
	}
	rep.GroupBlocks = len(in)
	for r, set := range sets {
		for id, b := range set {
			if in[id] {
				continue
			}
			rep.DiscardedBlocks[r]++
			// Discard only the tops of what is not shared: the rest of
			// such a subtree goes with its top.
			if b.HasParent && !in[b.Parent] {
				continue
			}
			if _, err := g.ranks[r].Discard(id); err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
		}
		g.stats.discarded.Add(int64(rep.DiscardedBlocks[r]))
	}
	g.report = rep
	return nil
}

// indexPath adds chain to the group index (its leading blocks already there
// stay) and returns how many leading blocks of chain were in it before and
// are after.
func (g *Group) indexPath(chain []uint64) (before, after int, err error) {
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	from := g.idx.Lookup(chain)
	if from == len(chain) {
		return from, from, nil
	}
	res, err := g.idx.Reserve(chain, from, g.bytesPerBlock)
	if err != nil {
		return from, from, fmt.Errorf("reserving in the group index: %w", err)
	}
	if res.N == 0 {
		return from, from, nil
	}
	ids := chain[from : from+res.N]
	if _, err := g.idx.Commit(ids, make([]uint64, len(ids))); err != nil {
		return from, from, fmt.Errorf("committing in the group index: %w", err)
	}
	return from, from + res.N, nil
}

// Ranks is the tensor-parallel degree.
func (g *Group) Ranks() int { return len(g.ranks) }

// Rank returns rank r's store (for its Stats, Check, Config; loads and
// saves go through the group).
func (g *Group) Rank(r int) *runtime.Store { return g.ranks[r] }

// ShardGeometry is the geometry every rank's store holds.
func (g *Group) ShardGeometry() kvshape.Geometry { return g.shard }

// Device returns rank r's CUDA device (PathGPU; 0 on PathCPU).
func (g *Group) Device(r int) int { return g.devices[r] }

// Recovery returns what Open recovered and reconciled.
func (g *Group) Recovery() RecoveryReport { return g.report }

// RegisterKV gives rank r its KV memory: the rank's shard of the engine's
// paged KV memory (host memory on PathCPU, device memory on rank r's device
// on PathGPU), shaped by ShardGeometry, with the same page ids on every rank
// (one block table for the group). Each rank must be registered once before
// the first Load or Save.
func (g *Group) RegisterKV(r int, kv runtime.KVMemory) error {
	if r < 0 || r >= len(g.ranks) {
		return fmt.Errorf("tp: RegisterKV: rank %d out of range [0, %d)", r, len(g.ranks))
	}
	if err := g.ranks[r].RegisterKV(kv); err != nil {
		return fmt.Errorf("tp: rank %d: %w", r, err)
	}
	return nil
}

// begin registers a group operation unless the group is closing.
func (g *Group) begin() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return runtime.ErrClosed
	}
	g.ops.Add(1)
	return nil
}

// Lookup returns how many leading blocks of chain are resident on the
// group: the group index's hit, clipped to every rank's own hit (a rank that
// lost a block to eviction or a CRC failure lowers it; the lost part is
// pruned from the group index). No I/O, nothing pinned.
func (g *Group) Lookup(chain []uint64) int {
	n := g.lookup(chain)
	g.stats.lookups.Add(1)
	g.stats.lookupBlocks.Add(int64(len(chain)))
	g.stats.hitBlocks.Add(int64(n))
	return n
}

func (g *Group) lookup(chain []uint64) int {
	n := g.idx.Lookup(chain)
	m := n
	for _, s := range g.ranks {
		if m == 0 {
			break
		}
		m = min(m, s.Resident(chain[:m]))
	}
	if m < n {
		g.commitMu.Lock()
		// Not found: a concurrent lookup pruned it first.
		if _, err := g.idx.Remove(chain[m]); err == nil {
			g.stats.clipped.Add(int64(n - m))
		}
		g.commitMu.Unlock()
	}
	return m
}

// Stats returns the group's counters and every rank's.
func (g *Group) Stats() Stats {
	st := Stats{Ranks: len(g.ranks),
		Lookups: g.stats.lookups.Load(), LookupBlocks: g.stats.lookupBlocks.Load(), HitBlocks: g.stats.hitBlocks.Load(),
		ClippedBlocks: g.stats.clipped.Load(),
		Loads:         g.stats.loads.Load(), LoadHitBlocks: g.stats.loadHits.Load(), RestoredBlocks: g.stats.restored.Load(),
		Saves: g.stats.saves.Load(), CommittedBlocks: g.stats.committed.Load(), FailedSaves: g.stats.failedSaves.Load(),
		DiscardedBlocks: g.stats.discarded.Load(), IndexBlocks: g.idx.Stats().Blocks,
	}
	for i := range g.stats.failedRank {
		st.FailedRankSaves = append(st.FailedRankSaves, g.stats.failedRank[i].Load())
	}
	for _, s := range g.ranks {
		st.Rank = append(st.Rank, s.Stats())
	}
	return st
}

// WaitSaves blocks until every group Save started so far ended (its group
// commit or discard included). Its error joins the ranks' (each wrapping
// runtime.ErrSavesFailed: saves that lost blocks to a failure since the
// last WaitSaves); it waits for every rank either way.
func (g *Group) WaitSaves() error {
	var errs []error
	for r, s := range g.ranks {
		if err := s.WaitSaves(); err != nil {
			errs = append(errs, fmt.Errorf("tp: rank %d: %w", r, err))
		}
	}
	g.mu.Lock()
	for g.savesLive > 0 {
		g.savesCond.Wait()
	}
	g.mu.Unlock()
	return errors.Join(errs...)
}

// Close waits for group loads and saves in flight, then closes every rank.
func (g *Group) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return runtime.ErrClosed
	}
	g.closed = true
	g.mu.Unlock()
	g.ops.Wait()
	return g.closeRanks()
}

// eachRank runs fn for ranks 0..n-1 concurrently (ranks have their own
// rings and disks) and returns each rank's error, nil where it succeeded.
func eachRank(n int, fn func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return errs
}
