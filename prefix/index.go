package prefix

import (
	"errors"
	"fmt"
	"sync"
)

// Sentinel errors; calls wrap them with the operation and the offending id.
var (
	ErrNotFound   = errors.New("prefix: block not in index")
	ErrNotPending = errors.New("prefix: block not pending")
	ErrNotPinned  = errors.New("prefix: block not pinned")
	ErrBadChain   = errors.New("prefix: ids do not form a chain in the index")
	ErrBadArg     = errors.New("prefix: invalid argument")
)

// MaxPins bounds the pin count of one block; Pin stops before a block at the limit.
const MaxPins = 1 << 24

// MaxBlocksLimit is the largest Config.MaxBlocks (slot numbers are int32).
const MaxBlocksLimit = maxSlots - 1

// MaxCapacityBytes is the largest capacity (2 EiB), so byte sums cannot overflow int64.
const MaxCapacityBytes = 1 << 61

// State is a block's state as reported by Get.
type State uint8

const (
	StateAbsent   State = iota // not in the index
	StatePending               // reserved, being saved: not a hit, not evictable
	StateResident              // committed, unpinned: a hit, evictable when a leaf
	StatePinned                // committed and pinned by at least one load: a hit, not evictable
)

func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateResident:
		return "resident"
	case StatePinned:
		return "pinned"
	}
	return "absent"
}

// StopReason says why Reserve did not reserve the rest of a chain.
type StopReason uint8

const (
	StopNone      StopReason = iota // everything asked for was reserved
	StopPresent                     // the next block is already in the index (cached, being saved, or draining)
	StopNotCached                   // chain[:from] is not all resident/pinned, so nothing may hang below it
	StopCapacity                    // bytes: what is left over is held by pinned, pending or held blocks
	StopMaxBlocks                   // block count: Config.MaxBlocks is held by non-evictable blocks
)

func (r StopReason) String() string {
	switch r {
	case StopNone:
		return "none"
	case StopPresent:
		return "present"
	case StopNotCached:
		return "not-cached"
	case StopCapacity:
		return "capacity"
	case StopMaxBlocks:
		return "max-blocks"
	}
	return fmt.Sprintf("StopReason(%d)", uint8(r))
}

// Config sizes an Index.
type Config struct {
	CapacityBytes int64 // sum of block sizes the index admits; > 0
	MaxBlocks     int   // block-count limit, 0 = MaxBlocksLimit
}

// Dropped is an entry that left the index. Its storage (Loc, SizeBytes) now belongs to the owner,
// who must free it.
type Dropped struct {
	ID        uint64
	Loc       uint64
	SizeBytes int64
}

// Reservation is the result of Reserve.
type Reservation struct {
	From int // first reserved position (the from argument)
	// N blocks chain[From:From+N] are now Pending and owned by the caller, who must Commit or Abort
	// each of them. N < len(chain)-From is a partial admission; Stop says why.
	N       int
	Stop    StopReason
	Evicted []Dropped // LRU leaves evicted to make room, in eviction order; the caller frees them
}

// Entry is a snapshot of one block.
type Entry struct {
	ID        uint64
	Parent    uint64 // valid when HasParent
	HasParent bool
	State     State
	Pins      int
	Draining  bool // removed, waiting for its last pin, commit or abort
	SizeBytes int64
	Loc       uint64
	Children  int
}

// Stats counts blocks and bytes by state, and what left the index.
type Stats struct {
	Blocks          int   `json:"blocks"`    // all entries
	Pending         int   `json:"pending"`   // pending (including draining ones)
	Resident        int   `json:"resident"`  // committed and unpinned (including draining ones)
	Pinned          int   `json:"pinned"`    // committed and pinned (including draining ones)
	Draining        int   `json:"draining"`  // removed, waiting for pins or pending saves to finish
	Evictable       int   `json:"evictable"` // on the LRU list
	Bytes           int64 `json:"bytes"`     // all entries
	PendingBytes    int64 `json:"pending_bytes"`
	PinnedBytes     int64 `json:"pinned_bytes"`
	EvictableBytes  int64 `json:"evictable_bytes"`
	CapacityBytes   int64 `json:"capacity_bytes"`
	MaxBlocks       int   `json:"max_blocks"`
	Reserved        int64 `json:"reserved"` // blocks ever reserved
	Committed       int64 `json:"committed"`
	Aborted         int64 `json:"aborted"` // blocks dropped by Abort (listed or cascaded)
	Evictions       int64 `json:"evictions"`
	EvictedBytes    int64 `json:"evicted_bytes"`
	Removed         int64 `json:"removed"`          // blocks dropped because of Remove (when they finally leave)
	RefusedCapacity int64 `json:"refused_capacity"` // Reserve calls stopped by StopCapacity
	RefusedBlocks   int64 `json:"refused_blocks"`   // Reserve calls stopped by StopMaxBlocks
}

// Index is the prefix index. Safe for concurrent use (one mutex; see the package doc).
type Index struct {
	mu sync.Mutex

	capacityBytes int64
	maxBlocks     int

	sl  slots
	tab table

	lruHead, lruTail int32

	count, evictableCount                            int
	nPending, nPinned, nDoomed                       int
	usedBytes, pendingBytes, pinnedBytes, evictBytes int64
	reserved, committed, aborted, evictions, removed int64
	evictedBytes, refusedCapacity, refusedBlocks     int64
	scratch                                          []int32
}

// New returns an empty index.
func New(cfg Config) (*Index, error) {
	if cfg.CapacityBytes <= 0 || cfg.CapacityBytes > MaxCapacityBytes {
		return nil, fmt.Errorf("new index: capacity %d bytes: %w", cfg.CapacityBytes, ErrBadArg)
	}
	if cfg.MaxBlocks < 0 || cfg.MaxBlocks > MaxBlocksLimit {
		return nil, fmt.Errorf("new index: max blocks %d (limit %d): %w", cfg.MaxBlocks, MaxBlocksLimit, ErrBadArg)
	}
	if cfg.MaxBlocks == 0 {
		cfg.MaxBlocks = MaxBlocksLimit
	}
	return &Index{
		capacityBytes: cfg.CapacityBytes,
		maxBlocks:     cfg.MaxBlocks,
		sl:            slots{free: noSlot},
		tab:           newTable(minTableBits),
		lruHead:       noSlot,
		lruTail:       noSlot,
	}, nil
}

// Lookup returns how many leading blocks of chain are hits (resident or pinned, not draining);
// the first pending, draining or absent block ends the hit. It marks the hit blocks most recently
// used (the leaf first, so ancestors stay younger than descendants). O(len(chain)).
func (x *Index) Lookup(chain []uint64) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	n, last := x.walk(chain)
	x.touch(last)
	return n
}

// Get returns a snapshot of block id.
func (x *Index) Get(id uint64) (Entry, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.find(id)
	if s == noSlot {
		return Entry{ID: id}, false
	}
	en := x.entryOf(s)
	for c := x.sl.at(s).child; c != noSlot; c = x.sl.at(c).nextSib {
		en.Children++
	}
	return en, true
}

// Subtree appends id and every block below it to dst, parents before
// children, with each one's state as Get reports it, and returns dst; dst
// unchanged when id is not in the index. O(subtree) under the lock: meant
// for an owner that must report what a Remove takes out of service.
func (x *Index) Subtree(id uint64, dst []Entry) []Entry {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.find(id)
	if s == noSlot {
		return dst
	}
	for _, t := range x.subtree(s) {
		dst = append(dst, x.entryOf(t))
	}
	x.trimScratch()
	return dst
}

// entryOf is slot s's snapshot, less Children.
func (x *Index) entryOf(s int32) Entry {
	e := x.sl.at(s)
	en := Entry{ID: e.id, Pins: int(e.pins), Draining: e.flags&flagDoomed != 0, SizeBytes: e.sizeBytes, Loc: e.loc}
	switch {
	case e.state == statePending:
		en.State = StatePending
	case e.pins > 0:
		en.State = StatePinned
	default:
		en.State = StateResident
	}
	if e.parent != noSlot {
		en.Parent, en.HasParent = x.sl.at(e.parent).id, true
	}
	return en
}

// Stats returns the counters.
func (x *Index) Stats() Stats {
	x.mu.Lock()
	defer x.mu.Unlock()
	return Stats{
		Blocks: x.count, Pending: x.nPending, Pinned: x.nPinned, Resident: x.count - x.nPending - x.nPinned,
		Draining: x.nDoomed, Evictable: x.evictableCount,
		Bytes: x.usedBytes, PendingBytes: x.pendingBytes, PinnedBytes: x.pinnedBytes, EvictableBytes: x.evictBytes,
		CapacityBytes: x.capacityBytes, MaxBlocks: x.maxBlocks,
		Reserved: x.reserved, Committed: x.committed, Aborted: x.aborted,
		Evictions: x.evictions, EvictedBytes: x.evictedBytes, Removed: x.removed,
		RefusedCapacity: x.refusedCapacity, RefusedBlocks: x.refusedBlocks,
	}
}

// LRU returns the ids on the eviction list, next victim first. O(evictable blocks); for tests and
// debugging.
func (x *Index) LRU() []uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	var ids []uint64
	for s := x.lruHead; s != noSlot; s = x.sl.at(s).lruNext {
		ids = append(ids, x.sl.at(s).id)
	}
	return ids
}

// childScan is how many children of the previous block are compared before the table is probed:
// a chain saved together sits in consecutive slots with the newest child first, so the next block
// of a lookup is usually found in the cache line next to its parent, without a random table probe.
const childScan = 4

// next returns the slot of id as a child of prev (noSlot: a root), or noSlot when id is absent or
// hangs elsewhere.
func (x *Index) next(prev int32, id uint64) int32 {
	if prev != noSlot {
		c := x.sl.at(prev).child
		for k := 0; k < childScan && c != noSlot; k++ {
			ce := x.sl.at(c)
			if ce.id == id {
				return c
			}
			c = ce.nextSib
		}
		if c == noSlot {
			return noSlot // all children compared
		}
	}
	s := x.find(id)
	if s == noSlot || x.sl.at(s).parent != prev {
		return noSlot
	}
	return s
}

// walk returns how many leading blocks of chain are hits, and the slot of the last one.
func (x *Index) walk(chain []uint64) (int, int32) {
	prev := noSlot
	for i, id := range chain {
		s := x.next(prev, id)
		if s == noSlot {
			return i, prev
		}
		e := x.sl.at(s)
		if e.state != stateResident || e.flags&flagDoomed != 0 {
			return i, prev
		}
		prev = s
	}
	return len(chain), prev
}
