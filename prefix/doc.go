// Package prefix is tutti's prefix index: which chain blocks of KV cache are stored, in which state,
// and which to evict when the store is full.
//
// # Chains
//
// A request is a chain of block ids: id i names the whole prefix up to and including block i (a
// chained hash, as in the Mooncake trace, or as derived from token ids by [ChainFromTokens]). A chain
// always starts at its first block: chain[0] is a root of the index, and chain[i]'s parent is
// chain[i-1]. The index therefore is a forest; an id present in the index under another parent than
// the chain says is a miss for that chain.
//
// # States
//
//   - Pending: reserved by a saver ([Index.Reserve]) and being written; never a hit; never evicted.
//   - Resident: committed ([Index.Commit]); a hit; evictable once it is a leaf.
//   - Pinned: resident with a pin count > 0 ([Index.Pin]); a hit; never evicted. Pins are counted
//     (several loads may pin a block) and are taken and released on whole prefixes chain[:n], so a
//     pinned block's ancestors are pinned at least as often.
//
// A block removed with [Index.Remove] while it is pinned or pending (or has such descendants) stays
// in the index as "draining": no longer a hit and never evicted, and it is handed back as [Dropped]
// by the Unpin, Commit or Abort that releases it last.
//
// # Eviction
//
// Leaf-first LRU under a byte capacity (and an optional block-count limit). A block is evictable when
// it is resident, unpinned, not draining, and every child is evictable; evictable blocks sit on one
// intrusive LRU list, ordered so that every block comes before its ancestors (Lookup touches a hit
// prefix leaf to root; a block joins the list at the tail only when the last thing holding it goes).
// Hence the list head is always a leaf, the least recently used one, and an eviction is O(1). Blocks
// with a pinned or pending descendant are held off the list by a per-block count of non-evictable
// children, updated along the parent path when a block's evictability changes.
//
// The index does no I/O: each entry carries an opaque 64-bit location the owner (the object store)
// sets at Commit; every call that drops committed entries returns them ([Dropped]) so the owner frees
// their storage.
//
// # Use by the store
//
// Load: n, locs := x.Pin(chain, locs[:0]); restore chain[:n] from locs (a partial restore is fine);
// if a block's data is bad, x.Remove(id); finally x.Unpin(chain[:n]) and free what it returns.
// Lookup alone answers "how much is cached" without protecting anything.
//
// Save: r, _ := x.Reserve(chain, h, bytesPerBlock) with h the hit length (e.g. from Pin or Lookup;
// StopNotCached if chain[:h] was evicted meanwhile, so look up again); free r.Evicted; write
// chain[h:h+r.N]; then x.Commit(written ids, their locations) parent first, and x.Abort the rest.
// Pending blocks hold their ancestors, so chain[:h] is not evicted while the save is in flight.
//
// Every []Dropped a call returns is storage the owner must free; nothing in it is pinned, so no
// load is reading it.
//
// # Memory
//
// Entries are 64-byte slots (one cache line, no pointers, so the GC never scans them) in 64 Ki-slot
// pages, linked by int32 slot numbers (parent, children, LRU). Ids map to slots through an
// open-addressing table of int32 slot numbers (linear probing, Fibonacci hashing, load ≤ 3/4).
// The bytes per block at 10 million blocks: BENCHMARKS.md, prefix, objmap, uring / devbench.
//
// # Concurrency
//
// [Index] is safe for concurrent use: every method takes one internal mutex. A read-write lock would
// not help because Lookup reorders the LRU list, and every operation is short (O(len(chain)), tens of
// nanoseconds per block), so one uncontended mutex per call is cheaper than any finer scheme. The
// caller must still pair its own calls: Unpin exactly the prefixes it pinned, and Commit or Abort
// exactly the blocks it reserved.
package prefix
