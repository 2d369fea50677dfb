package runtime

// KV events for cache-aware routers (Config.KVEvents): what the engine
// gives of a block beyond its chain id, the store's contents for a replay,
// and the publisher's counters. The events themselves are emitted by the
// index (kvmeta.Index), in the same step as each change of it.

import (
	"fmt"
	"slices"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
)

// BlockMeta is what an engine knows of a block it saves beyond its chain id,
// for routers that key blocks their own way.
type BlockMeta struct {
	// Tokens are the block's token ids (ChunkPages*PageTokens of them), or
	// nil: the block is published with its hash only.
	Tokens []uint32
	// Hash is the engine's own hash of the block (vLLM's block hash bytes,
	// at most kvevents.MaxHashBytes), published instead of the chain id; nil:
	// the chain id is published as an int.
	Hash []byte
}

// copyMeta checks meta against chain and copies it for the index (nil
// without Config.KVEvents: nothing is published).
func (s *Store) copyMeta(chain []uint64, meta []BlockMeta) ([]kvmeta.Meta, error) {
	if len(meta) != len(chain) {
		return nil, fmt.Errorf("runtime: save: %d metadata for %d chain blocks: %w", len(meta), len(chain), ErrBadRequest)
	}
	bt := s.geo.ChunkPages * s.geo.PageTokens
	for i, m := range meta {
		if len(m.Tokens) != 0 && len(m.Tokens) != bt {
			return nil, fmt.Errorf("runtime: save: meta[%d]: %d token ids, a block has %d: %w", i, len(m.Tokens), bt, ErrBadRequest)
		}
		if len(m.Hash) > kvevents.MaxHashBytes {
			return nil, fmt.Errorf("runtime: save: meta[%d]: %d hash bytes, at most %d: %w", i, len(m.Hash), kvevents.MaxHashBytes, ErrBadRequest)
		}
	}
	if !s.ctl.keepsMeta() {
		return nil, nil
	}
	kept := make([]kvmeta.Meta, len(meta))
	for i, m := range meta {
		kept[i] = kvmeta.Meta{Tokens: slices.Clone(m.Tokens), Hash: slices.Clone(m.Hash)}
	}
	return kept, nil
}

// openServed wraps the index (kvmeta.Open: with Config.KVEvents, the
// publisher and the sidecar in the store's first directory, in the map's
// order as every other per-store file, whatever order Config.Dirs lists).
func (s *Store) openServed(idx *prefix.Index) (*kvmeta.Index, error) {
	// The catalog is made after the index: the publisher asks for the
	// contents only once Open returned.
	return kvmeta.Open(idx, s.cfg.KVEvents, s.storeDirs()[0], s.geo.ChunkPages*s.geo.PageTokens,
		func(emit func(kvevents.Event)) { s.cat.Contents(emit) })
}

// KVEventsStats is what the store published (Config.KVEvents); all zero
// with Enabled false without it.
type KVEventsStats struct {
	Enabled bool `json:"enabled"`
	kvevents.Stats
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint"`
	// HashOnlyBlocks were published without token ids (the engine gave none,
	// or they did not fit MaxTokenBytes: MetaDropped).
	HashOnlyBlocks int64 `json:"hash_only_blocks"`
	MetaBlocks     int   `json:"meta_blocks"`
	MetaBytes      int64 `json:"meta_bytes"`
	MetaDropped    int64 `json:"meta_dropped"`
	// MetaUnpersisted blocks' metadata is not in the sidecar (past its size
	// bound, or a write failed): after a restart they are hashes only.
	MetaUnpersisted int64 `json:"meta_unpersisted"`
	// MetaLoadNote says what Open found wrong with the sidecar, if anything.
	MetaLoadNote string `json:"meta_load_note"`
}

// kvEventsStats is Stats.Events.
func (s *Store) kvEventsStats() (st KVEventsStats) {
	if s.idx == nil {
		return st // a connected store: the service publishes
	}
	p := s.idx.Publisher()
	if p == nil {
		return st
	}
	st.Enabled, st.Stats = true, p.Stats()
	st.Endpoint, st.ReplayEndpoint = p.Endpoint(), p.ReplayEndpoint()
	m := s.idx.MetaStats()
	st.HashOnlyBlocks = m.HashOnlyBlocks
	st.MetaBlocks, st.MetaBytes, st.MetaDropped = m.Blocks, m.Bytes, m.Dropped
	st.MetaUnpersisted, st.MetaLoadNote = m.Unpersisted, m.LoadNote
	return st
}
