package runtime

// servedIndex is the store's prefix index with one addition: every change of
// what the store serves is published as KV events (package kvevents) in the
// same step as the change. Without a publisher it is the plain index. The
// rest of the package calls it as it would call *prefix.Index; the methods
// that change what is served are wrapped here, the others are the index's.

import (
	"sync"
	"sync/atomic"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/prefix"
)

type servedIndex struct {
	*prefix.Index
	ev        *kvevents.Publisher // nil: no events
	meta      *blockMetas
	file      *metaFile // meta's sidecar; nil without a publisher
	blockSize int       // tokens per chain block
	// medium and locality are what the publisher's format says the store's
	// blocks are (kvevents.Config).
	medium, locality string

	// unserved holds blocks reported Removed by Remove that stay in the
	// index draining; their final drop is not reported again. Touched only
	// inside ev.Do.
	unserved map[uint64]struct{}
}

func newServedIndex(x *prefix.Index, ev *kvevents.Publisher, meta *blockMetas, blockSize int) *servedIndex {
	s := &servedIndex{Index: x, ev: ev, meta: meta, blockSize: blockSize, unserved: map[uint64]struct{}{}}
	if ev != nil {
		c := ev.Config()
		s.medium, s.locality = c.Medium, c.Locality
	}
	return s
}

// event is an empty event of kind k as this store publishes it. group_idx
// is 0: a store serves one KV cache group, which vLLM numbers 0.
func (x *servedIndex) event(k kvevents.Kind) kvevents.Event {
	return kvevents.Event{Kind: k, Medium: x.medium, Locality: x.locality, HasGroupIdx: true}
}

// do runs fn as one step of the event order (just fn without a publisher).
func (x *servedIndex) do(fn func(emit func(kvevents.Event))) {
	if x.ev == nil {
		fn(func(kvevents.Event) {})
		return
	}
	x.ev.Do(fn)
}

// hash is block id as published: the engine's own hash when it gave one.
func (x *servedIndex) hash(id uint64) kvevents.Hash {
	if h := x.meta.hash(id); h != nil {
		return kvevents.BytesHash(h)
	}
	return kvevents.IntHash(id)
}

// removed reports dropped blocks that were served, in the order the index
// dropped them (leaves first), and forgets their metadata.
func (x *servedIndex) removed(emit func(kvevents.Event), dropped []prefix.Dropped) {
	if len(dropped) == 0 || x.ev == nil {
		return
	}
	e := x.event(kvevents.BlockRemoved)
	for _, d := range dropped {
		if _, ok := x.unserved[d.ID]; ok {
			delete(x.unserved, d.ID)
			continue
		}
		e.Hashes = append(e.Hashes, x.hash(d.ID))
		x.meta.forget(d.ID)
	}
	if len(e.Hashes) > 0 {
		emit(e)
	}
}

// stored is the BlockStored event of committed blocks ids (in chain order)
// under parent; token ids only when every block has them.
func (x *servedIndex) stored(ids []uint64, parent uint64, hasParent bool) kvevents.Event {
	e := x.event(kvevents.BlockStored)
	e.BlockSize, e.HasParent = x.blockSize, hasParent
	if hasParent {
		e.Parent = x.hash(parent)
	}
	e.Hashes = make([]kvevents.Hash, len(ids))
	tokens := make([]uint32, 0, len(ids)*x.blockSize)
	for i, id := range ids {
		e.Hashes[i] = x.hash(id)
		if tokens != nil {
			t := x.meta.tokens(id)
			if len(t) != x.blockSize {
				tokens = nil
				continue
			}
			tokens = append(tokens, t...)
		}
	}
	if tokens == nil {
		x.meta.hashOnly.Add(int64(len(ids)))
	}
	e.Tokens = tokens
	return e
}

// Reserve also keeps meta[i] (SaveWithMeta's, nil for none) of every block
// i it reserves, in the same step: a block's metadata is kept from its
// reservation until it stops being served, so an eviction of the same id
// racing the save (which forgets that id's metadata) can never take what
// the save will publish.
func (x *servedIndex) Reserve(chain []uint64, from int, bytesPerBlock int64, meta []blockMeta) (res prefix.Reservation, err error) {
	x.do(func(emit func(kvevents.Event)) {
		res, err = x.Index.Reserve(chain, from, bytesPerBlock)
		x.removed(emit, res.Evicted)
		if err == nil && x.ev != nil && meta != nil {
			for i := from; i < from+res.N; i++ {
				if m := meta[i]; len(m.tokens) != 0 || len(m.hash) != 0 {
					x.meta.put(chain[i], m)
				}
			}
		}
	})
	return res, err
}

// Commit publishes the committed blocks as one BlockStored (those a Remove
// doomed while pending leave at once and are not published), then what the
// commit dropped.
func (x *servedIndex) Commit(ids, locs []uint64) (dropped []prefix.Dropped, err error) {
	x.do(func(emit func(kvevents.Event)) {
		var first prefix.Entry
		if x.ev != nil && len(ids) > 0 {
			first, _ = x.Index.Get(ids[0])
		}
		dropped, err = x.Index.Commit(ids, locs)
		if err != nil || x.ev == nil {
			return
		}
		gone := make(map[uint64]bool, len(dropped))
		for _, d := range dropped {
			gone[d.ID] = true
		}
		committed := make(map[uint64]bool, len(ids))
		for _, id := range ids {
			committed[id] = true
		}
		served := make([]uint64, 0, len(ids))
		for _, id := range ids {
			if gone[id] {
				break // doomed: so is every later block of the run
			}
			served = append(served, id)
		}
		if len(served) > 0 {
			emit(x.stored(served, first.Parent, first.HasParent))
			x.file.appendRecord(served, x.meta)
		}
		var rest []prefix.Dropped
		for _, d := range dropped {
			if !committed[d.ID] {
				rest = append(rest, d)
			}
		}
		x.removed(emit, rest)
	})
	return dropped, err
}

func (x *servedIndex) Abort(ids []uint64) (dropped []prefix.Dropped, err error) {
	x.do(func(emit func(kvevents.Event)) {
		dropped, err = x.Index.Abort(ids)
		if err == nil {
			x.removed(emit, dropped)
			for _, id := range ids {
				x.meta.forget(id)
			}
		}
	})
	return dropped, err
}

// Remove publishes every block it takes out of service, leaves first, at
// once, including those that stay in the index draining until released.
func (x *servedIndex) Remove(id uint64) (dropped []prefix.Dropped, err error) {
	x.do(func(emit func(kvevents.Event)) {
		var sub []prefix.Entry
		if x.ev != nil {
			sub = x.Index.Subtree(id, nil)
		}
		dropped, err = x.Index.Remove(id)
		if err != nil || x.ev == nil {
			return
		}
		now := make(map[uint64]bool, len(dropped))
		for _, d := range dropped {
			now[d.ID] = true
		}
		e := x.event(kvevents.BlockRemoved)
		for i := len(sub) - 1; i >= 0; i-- {
			b := sub[i]
			if b.Draining || b.State == prefix.StatePending {
				continue // not served before this Remove
			}
			e.Hashes = append(e.Hashes, x.hash(b.ID))
			if !now[b.ID] {
				x.unserved[b.ID] = struct{}{}
			} else {
				x.meta.forget(b.ID)
			}
		}
		var rest []prefix.Dropped
		for _, d := range dropped {
			if _, ok := x.unserved[d.ID]; ok {
				delete(x.unserved, d.ID) // a draining ancestor reported by an earlier Remove
				continue
			}
			if !inSubtree(sub, d.ID) {
				rest = append(rest, d)
			}
		}
		if len(e.Hashes) > 0 {
			emit(e)
		}
		x.removed(emit, rest)
	})
	return dropped, err
}

func inSubtree(sub []prefix.Entry, id uint64) bool {
	for _, e := range sub {
		if e.ID == id {
			return true
		}
	}
	return false
}

func (x *servedIndex) Unpin(chain []uint64) (dropped []prefix.Dropped, err error) {
	x.do(func(emit func(kvevents.Event)) {
		dropped, err = x.Index.Unpin(chain)
		x.removed(emit, dropped)
	})
	return dropped, err
}

func (x *servedIndex) Evict(minBytes int64) (dropped []prefix.Dropped) {
	x.do(func(emit func(kvevents.Event)) {
		dropped = x.Index.Evict(minBytes)
		x.removed(emit, dropped)
	})
	return dropped
}

func (x *servedIndex) SetCapacity(capacityBytes int64) (dropped []prefix.Dropped, err error) {
	x.do(func(emit func(kvevents.Event)) {
		dropped, err = x.Index.SetCapacity(capacityBytes)
		x.removed(emit, dropped)
	})
	return dropped, err
}

// finishRecovery keeps the sidecar's metadata of the blocks the recovery
// served, forgets the rest, and rewrites the sidecar with what it kept.
func (x *servedIndex) finishRecovery() error {
	if x.file == nil {
		return nil
	}
	return x.file.rewrite(x.meta, func(id uint64) bool {
		e, ok := x.Index.Get(id)
		return ok && !e.Draining && e.State != prefix.StatePending
	})
}

// blockMetas keeps what engines gave of blocks beyond their chain ids
// (token ids, their own hash), from SaveWithMeta until the block stops
// being served, bounded by maxBytes; past it blocks are published with
// hashes only (counted).
type blockMetas struct {
	mu       sync.Mutex
	m        map[uint64]blockMeta
	bytes    int64
	maxBytes int64
	dropped  int64 // blocks whose metadata did not fit
	hashOnly atomic.Int64
}

type blockMeta struct {
	tokens []uint32
	hash   []byte
}

func (b blockMeta) size() int64 { return int64(4*len(b.tokens)+len(b.hash)) + 48 }

func newBlockMetas(maxBytes int64) *blockMetas {
	return &blockMetas{m: map[uint64]blockMeta{}, maxBytes: maxBytes}
}

// put keeps m for block id unless the bound is reached (counted); an id
// already known keeps what it has (an id names the whole prefix, so its
// tokens are the same).
func (b *blockMetas) put(id uint64, m blockMeta) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.m[id]; ok {
		return
	}
	if b.bytes+m.size() > b.maxBytes {
		b.dropped++
		return
	}
	b.m[id] = m
	b.bytes += m.size()
}

func (b *blockMetas) get(id uint64) (blockMeta, bool) {
	if b == nil {
		return blockMeta{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	m, ok := b.m[id]
	return m, ok
}

func (b *blockMetas) tokens(id uint64) []uint32 { m, _ := b.get(id); return m.tokens }

func (b *blockMetas) hash(id uint64) []byte { m, _ := b.get(id); return m.hash }

func (b *blockMetas) forget(id uint64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if m, ok := b.m[id]; ok {
		b.bytes -= m.size()
		delete(b.m, id)
	}
}

func (b *blockMetas) stats() (blocks int, bytes, dropped int64) {
	if b == nil {
		return 0, 0, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m), b.bytes, b.dropped
}
