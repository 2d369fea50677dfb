// Package kvmeta is what a store serves, as routers see it: the prefix
// index with every change of what is served published as vLLM KV events
// (package kvevents) in the same step as the change (Index), the engine's
// metadata of the blocks it saved (token ids, its own hash) kept while they
// are served, and the sidecar file that keeps that metadata across restarts
// (sidecar.go). Without a publisher Index is the plain prefix index.
package kvmeta

import (
	"errors"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/prefix"
)

// Index is the store's prefix index: the rest of the store calls it as it
// would call *prefix.Index; the methods that change what is served are
// wrapped here, the others are the index's. It is safe for concurrent use
// as prefix.Index is.
type Index struct {
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

// Open wraps idx for a store of blocks of blockTokens tokens. With cfg it
// binds the publisher first (AllBlocksCleared is batch 0, so the recovery
// that follows publishes the recovered runs parents first) and reads the
// sidecar in dir; contents lists what the store serves for the
// publisher's replays (kvevents.Publisher.SetContents), Stored making its
// events. Without cfg nothing is published and contents is not used. The
// Index owns the publisher and the sidecar: Close them with Close.
func Open(idx *prefix.Index, cfg *kvevents.Config, dir string, blockTokens int, contents func(emit func(kvevents.Event))) (*Index, error) {
	if cfg == nil {
		return newIndex(idx, nil, nil, blockTokens), nil
	}
	p, err := kvevents.New(*cfg)
	if err != nil {
		return nil, err
	}
	metas := newBlockMetas(p.Config().MaxTokenBytes)
	mf, err := loadMetaFile(dir, blockTokens, maxFileBytes(p.Config().MaxTokenBytes), metas)
	if err != nil {
		_ = p.Close()
		return nil, err
	}
	p.SetContents(contents)
	x := newIndex(idx, p, metas, blockTokens)
	x.file = mf
	return x, nil
}

// maxFileBytes bounds the sidecar: twice what the store keeps in memory,
// so appends of blocks evicted since the last Open fit a while.
func maxFileBytes(maxTokenBytes int64) int64 { return 2*maxTokenBytes + 1<<20 }

func newIndex(x *prefix.Index, ev *kvevents.Publisher, meta *blockMetas, blockSize int) *Index {
	s := &Index{Index: x, ev: ev, meta: meta, blockSize: blockSize, unserved: map[uint64]struct{}{}}
	if ev != nil {
		c := ev.Config()
		s.medium, s.locality = c.Medium, c.Locality
	}
	return s
}

// Publisher is the event publisher; nil when the store publishes none.
func (x *Index) Publisher() *kvevents.Publisher { return x.ev }

// MetaStats is what the index kept of the engine's block metadata.
type MetaStats struct {
	// HashOnlyBlocks were published without token ids.
	HashOnlyBlocks int64
	// Blocks and Bytes are kept now; Dropped did not fit the bound.
	Blocks  int
	Bytes   int64
	Dropped int64
	// Unpersisted blocks' metadata is not in the sidecar (past its size
	// bound, or a write failed); LoadNote says what Open found wrong with
	// the sidecar, if anything.
	Unpersisted int64
	LoadNote    string
}

// MetaStats is what the index kept; all zero without a publisher.
func (x *Index) MetaStats() MetaStats {
	if x.ev == nil {
		return MetaStats{}
	}
	var st MetaStats
	st.HashOnlyBlocks = x.meta.hashOnly.Load()
	st.Blocks, st.Bytes, st.Dropped = x.meta.stats()
	st.Unpersisted, st.LoadNote = x.file.stats()
	return st
}

// Close closes the publisher and the sidecar (the index itself has nothing
// to close).
func (x *Index) Close() error {
	if x.ev == nil {
		return nil
	}
	return errors.Join(x.ev.Close(), x.file.close())
}

// event is an empty event of kind k as this store publishes it. group_idx
// is 0: a store serves one KV cache group, which vLLM numbers 0.
func (x *Index) event(k kvevents.Kind) kvevents.Event {
	return kvevents.Event{Kind: k, Medium: x.medium, Locality: x.locality, HasGroupIdx: true}
}

// do runs fn as one step of the event order (just fn without a publisher).
func (x *Index) do(fn func(emit func(kvevents.Event))) {
	if x.ev == nil {
		fn(func(kvevents.Event) {})
		return
	}
	x.ev.Do(fn)
}

// hash is block id as published: the engine's own hash when it gave one.
func (x *Index) hash(id uint64) kvevents.Hash {
	if h := x.meta.hash(id); h != nil {
		return kvevents.BytesHash(h)
	}
	return kvevents.IntHash(id)
}

// removed reports dropped blocks that were served, in the order the index
// dropped them (leaves first), and forgets their metadata.
func (x *Index) removed(emit func(kvevents.Event), dropped []prefix.Dropped) {
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

// Stored is the BlockStored event of committed blocks ids (in chain order)
// under parent; token ids only when every block has them.
func (x *Index) Stored(ids []uint64, parent uint64, hasParent bool) kvevents.Event {
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
func (x *Index) Reserve(chain []uint64, from int, bytesPerBlock int64, meta []Meta) (res prefix.Reservation, err error) {
	x.do(func(emit func(kvevents.Event)) {
		res, err = x.Index.Reserve(chain, from, bytesPerBlock)
		x.removed(emit, res.Evicted)
		if err == nil && x.ev != nil && meta != nil {
			for i := from; i < from+res.N; i++ {
				if m := meta[i]; len(m.Tokens) != 0 || len(m.Hash) != 0 {
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
func (x *Index) Commit(ids, locs []uint64) (dropped []prefix.Dropped, err error) {
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
			emit(x.Stored(served, first.Parent, first.HasParent))
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

func (x *Index) Abort(ids []uint64) (dropped []prefix.Dropped, err error) {
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
func (x *Index) Remove(id uint64) (dropped []prefix.Dropped, err error) {
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

func (x *Index) Unpin(chain []uint64) (dropped []prefix.Dropped, err error) {
	x.do(func(emit func(kvevents.Event)) {
		dropped, err = x.Index.Unpin(chain)
		x.removed(emit, dropped)
	})
	return dropped, err
}

func (x *Index) Evict(minBytes int64) (dropped []prefix.Dropped) {
	x.do(func(emit func(kvevents.Event)) {
		dropped = x.Index.Evict(minBytes)
		x.removed(emit, dropped)
	})
	return dropped
}

func (x *Index) SetCapacity(capacityBytes int64) (dropped []prefix.Dropped, err error) {
	x.do(func(emit func(kvevents.Event)) {
		dropped, err = x.Index.SetCapacity(capacityBytes)
		x.removed(emit, dropped)
	})
	return dropped, err
}

// FinishRecovery keeps the sidecar's metadata of the blocks the recovery
// served, forgets the rest, and rewrites the sidecar with what it kept.
// Open calls it once, after the recovery's commits and before any save.
func (x *Index) FinishRecovery() error {
	if x.file == nil {
		return nil
	}
	return x.file.rewrite(x.meta, func(id uint64) bool {
		e, ok := x.Index.Get(id)
		return ok && !e.Draining && e.State != prefix.StatePending
	})
}
