package kvmeta

import (
	"sync"
	"sync/atomic"
)

// Meta is what an engine gave of a block beyond its chain id (its token ids,
// its own hash); either may be nil. The index keeps it from the block's
// reservation until the block stops being served.
type Meta struct {
	Tokens []uint32
	Hash   []byte
}

func (b Meta) size() int64 { return int64(4*len(b.Tokens)+len(b.Hash)) + 48 }

// blockMetas keeps what engines gave of blocks beyond their chain ids
// (token ids, their own hash), from SaveWithMeta until the block stops
// being served, bounded by maxBytes; past it blocks are published with
// hashes only (counted).
type blockMetas struct {
	mu       sync.Mutex
	m        map[uint64]Meta
	bytes    int64
	maxBytes int64
	dropped  int64 // blocks whose metadata did not fit
	hashOnly atomic.Int64
}

func newBlockMetas(maxBytes int64) *blockMetas {
	return &blockMetas{m: map[uint64]Meta{}, maxBytes: maxBytes}
}

// put keeps m for block id unless the bound is reached (counted); an id
// already known keeps what it has (an id names the whole prefix, so its
// tokens are the same).
func (b *blockMetas) put(id uint64, m Meta) {
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

func (b *blockMetas) get(id uint64) (Meta, bool) {
	if b == nil {
		return Meta{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	m, ok := b.m[id]
	return m, ok
}

func (b *blockMetas) tokens(id uint64) []uint32 { m, _ := b.get(id); return m.Tokens }

func (b *blockMetas) hash(id uint64) []byte { m, _ := b.get(id); return m.Hash }

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
