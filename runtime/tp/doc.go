// Package tp runs tutti for a tensor-parallel engine: a Group of N ranks,
// one runtime.Store per rank, each restoring and saving its own shard of the
// KV cache into its own KV memory, with one answer for the group: a prefix
// is resident only when every rank has committed it.
//
// # API
//
//	ShardGeometry(g, n)                   the geometry one rank stores (heads split; MLA replicated)
//	Open(Config) (*Group, error)          open every rank's store concurrently, reconcile them
//	(*Group).RegisterKV(rank, KVMemory)   each rank's shard of the paged KV memory, once
//	(*Group).Lookup(chain) int            leading blocks resident on every rank; no I/O
//	(*Group).Load(chain, pages) (*Load, error)
//	    (*Load).WaitLayer(l) / StreamWaitLayer(rank, l, stream) / Wait() / Blocks() / Planned() / Cached() / Rank(r)
//	(*Group).Save(chain, pages) (*Save, error)
//	    (*Save).Gathered() / Done() / Wait() / Saved() / Resident() / Discarded() / Failed() / Rank(r)
//	(*Group).WaitSaves() / Stats() / Recovery() / Rank(r) / Device(r) / Close()
//
// All ranks share one block table: page p of the engine is page p of every
// rank's KV memory, each holding its own heads.
//
// # Shards
//
// With separate K and V planes the KV heads are split evenly (KVHeads must
// be a multiple of N; rank r holds heads [r*H/N, (r+1)*H/N) of every token,
// as vLLM's tensor parallelism places them), so each rank moves 1/N of the
// bytes and the ranks' restores add up. An MLA latent cache (Planes == 1,
// one latent head) cannot be split by heads; vLLM keeps a full copy on every
// rank, and so does tp: every rank stores its own copy in its own
// directories, rather than rank 0 storing it for all. Why: each rank then
// reads from its own devices in parallel, as for split heads (N ranks
// reading rank 0's directories would share its bandwidth); a store restores
// only into the one KV memory it registered (on PathGPU, into the device its
// restorer is bound to), so "load once, use on N ranks" would need a
// cross-GPU copy the runtime does not have; and the all-or-nothing rule below
// stays the same for both kinds of model. The price is N times the disk space
// and save bandwidth for MLA.
//
// # Per-rank resources
//
// Each rank's store has its own directories (Config.Dirs[r]; a directory
// given to two ranks is refused), pool files, journal, prefix index, staging
// pool, I/O engine and, on PathGPU, its own SQPOLL ring, descriptor tables,
// staging and restorer on its device: Config.Devices[r], or by default
// device r mod (the number of visible GPUs). So N ranks also run on one GPU
// (each with its own ring), which is how the N-GPU path is exercised on a
// one-GPU machine; with N GPUs each rank's GPU drives its own ring.
//
// # Consistency: all or nothing
//
// Invariant: Lookup (and the hit Load restores) never counts a block that
// some rank does not have committed (durable payload, header and journal
// record, in its own index).
//
//   - Save: every rank saves its shard; the group commits nothing until all
//     ranks' saves ended. Then k = min over ranks of the rank's resident
//     prefix of the chain, and chain[:k] goes into the group index (a
//     prefix.Index whose entries are "committed on every rank"). If any rank
//     skipped a block for a failure (I/O error, ENOSPC, no space, the save
//     budget, closing), the ranks that committed chain[k:] discard it
//     (runtime.Store.Discard: it and everything below it leave their index;
//     their runs are freed once nothing of them is indexed), counted in
//     Stats.FailedSaves and Stats.DiscardedBlocks. So a failure on one rank
//     is a miss on all, and its space is freed on all.
//   - Lookup: the group index's hit, clipped to every rank's own hit. A rank
//     can lose a block after the group committed it (its LRU evicted it, or
//     a load found it corrupt and dropped it); the clip makes that a miss at
//     once, and the stale tail is pruned from the group index. The clip alone
//     guarantees the invariant, whatever the group index says; the group
//     index adds that a block committed on every rank but by saves still
//     reconciling (or left by a failed save on some ranks) is not a hit
//     before a save ended on every rank.
//   - Load: each rank pins and restores its own prefix; Blocks is the
//     smallest rank's, capped at the group hit, so a block restored on some
//     ranks only is recomputed on all.
//   - Crash recovery: each rank's store recovers on its own (its journal
//     and headers: only durable, CRC-checked runs come back). A crash can
//     fall between the ranks' commits of one save, leaving blocks committed
//     on some ranks only; and a block a rank discarded shortly before the
//     crash can come back there (its trim record was not durable yet; after
//     a clean Close a rank serves exactly what it did). Open therefore
//     rebuilds the group index as
//     the intersection of the ranks' resident blocks (the same id under the
//     same parent on every rank, with all its ancestors), and discards every
//     other block on the ranks that have it (Recovery().DiscardedBlocks).
//     Nothing committed on some ranks only is a hit after a restart, and a
//     block every rank has durably is (its content is named by its chained
//     id, so every rank's copy is its shard of the same KV).
//
// Concurrent saves of overlapping chains on one rank skip what another has
// reserved (SkipCached, not a failure). When two saves each stored a block
// on different ranks, the one that ends last finds it on every rank and
// commits it to the group (each ends only after its own ranks' saves did).
// A block stored on some ranks only because the other ranks' saves of its
// chain stopped earlier (at a block another save held) is not a hit; the
// next save of its chain stores it on the missing ranks (the others skip
// it) and commits it, or the LRU evicts it. With no concurrency and no
// failure, a save leaves the group index equal to every rank's prefix.
package tp
