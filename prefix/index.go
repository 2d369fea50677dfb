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
	Blocks          int   // all entries
	Pending         int   // pending (including draining ones)
	Resident        int   // committed and unpinned (including draining ones)
	Pinned          int   // committed and pinned (including draining ones)
	Draining        int   // removed, waiting for pins or pending saves to finish
	Evictable       int   // on the LRU list
	Bytes           int64 // all entries
	PendingBytes    int64
	PinnedBytes     int64
	EvictableBytes  int64
	CapacityBytes   int64
	MaxBlocks       int
	Reserved        int64 // blocks ever reserved
	Committed       int64
	Aborted         int64 // blocks dropped by Abort (listed or cascaded)
	Evictions       int64
	EvictedBytes    int64
	Removed         int64 // blocks dropped because of Remove (when they finally leave)
	RefusedCapacity int64 // Reserve calls stopped by StopCapacity
	RefusedBlocks   int64 // Reserve calls stopped by StopMaxBlocks
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

// Pin is Lookup plus a pin on each hit block: it returns n, and chain[:n] is pinned (not evictable,
// its storage not freed) until the caller calls Unpin(chain[:n]) exactly once. It appends to dst
// the location of each pinned block (chain[i]'s at len(dst)+i) and returns the extended slice; pass
// nil when not needed. A block at MaxPins ends the pinned prefix. Pinning counts as a use for LRU
// order (blocks rejoin the list at the tail when unpinned).
func (x *Index) Pin(chain []uint64, dst []uint64) (int, []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	n, last := x.walk(chain)
	// Trim the prefix at the first block whose pin count is at the limit.
	for s, i := last, n-1; s != noSlot; s, i = x.sl.at(s).parent, i-1 {
		if x.sl.at(s).pins >= MaxPins {
			n, last = i, x.sl.at(s).parent
		}
	}
	base := len(dst)
	for range n {
		dst = append(dst, 0)
	}
	for s, i := last, n-1; s != noSlot; i-- {
		e := x.sl.at(s)
		dst[base+i] = e.loc
		if e.pins == 0 {
			x.nPinned++
			x.pinnedBytes += e.sizeBytes
		}
		e.pins++
		x.refresh(s)
		s = e.parent
	}
	return n, dst
}

// Unpin releases one pin on each block of chain, which must be a prefix the caller pinned with Pin
// (every block present under its chain parent and pinned); otherwise it changes nothing and returns
// an error wrapping ErrNotPinned. Blocks removed while pinned leave the index when their last pin
// goes; they are returned for the caller to free.
//
// Unpin, Commit, Abort and Remove also evict LRU leaves while usage is above a capacity lowered by
// SetCapacity; those are returned in the same list (every returned entry is the caller's to free).
func (x *Index) Unpin(chain []uint64) ([]Dropped, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	prev := noSlot
	for i, id := range chain {
		s := x.next(prev, id)
		if s == noSlot || x.sl.at(s).pins == 0 {
			return nil, fmt.Errorf("unpin chain[%d] id %#x: %w", i, id, ErrNotPinned)
		}
		prev = s
	}
	var out []Dropped
	for s := prev; s != noSlot; {
		e := x.sl.at(s)
		p := e.parent
		e.pins--
		if e.pins == 0 {
			x.nPinned--
			x.pinnedBytes -= e.sizeBytes
		}
		if e.flags&flagDoomed != 0 {
			out = x.reap(s, out)
		} else {
			x.refresh(s)
		}
		s = p
	}
	return x.shrink(out), nil
}

// Reserve marks chain[from:] Pending, as far as capacity allows, for a saver that will write those
// blocks. chain[:from] must all be hits (resident or pinned), or from must be 0; otherwise nothing
// is reserved (StopNotCached). Reservation stops at the first block already in the index
// (StopPresent: cached, being saved by someone else, or draining). To make room it evicts LRU
// leaves, and only when that is enough for the next block: it never evicts for a block it then
// cannot admit, and never blocks. It stops with StopCapacity (or StopMaxBlocks) when the bytes (or
// block count) left are held by pinned, pending or held blocks, or at once when bytesPerBlock
// exceeds the capacity. Evicted entries are returned for the
// caller to free, even when N is 0. The caller owns chain[From:From+N]: it must Commit or Abort
// each of them. Errors (ErrBadArg) only for from outside [0, len(chain)] or bytesPerBlock ≤ 0.
func (x *Index) Reserve(chain []uint64, from int, bytesPerBlock int64) (Reservation, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := Reservation{From: from}
	if from < 0 || from > len(chain) || bytesPerBlock <= 0 {
		return r, fmt.Errorf("reserve from %d of %d blocks, %d bytes per block: %w", from, len(chain), bytesPerBlock, ErrBadArg)
	}
	n, prev := x.walk(chain[:from])
	if n < from {
		r.Stop = StopNotCached
		return r, nil
	}
	for i := from; i < len(chain); i++ {
		if x.find(chain[i]) != noSlot {
			r.Stop = StopPresent
			break
		}
		if bytesPerBlock > x.capacityBytes { // can never fit; also keeps byte sums far from overflow
			r.Stop = StopCapacity
			break
		}
		s := x.insertPending(chain[i], prev, bytesPerBlock)
		if x.usedBytes-x.evictBytes > x.capacityBytes {
			r.Stop = StopCapacity
		} else if x.count-x.evictableCount > x.maxBlocks {
			r.Stop = StopMaxBlocks
		}
		if r.Stop != StopNone {
			x.undoPending(s)
			break
		}
		for x.usedBytes > x.capacityBytes || x.count > x.maxBlocks {
			r.Evicted = append(r.Evicted, x.evictHead())
		}
		x.reserved++
		r.N++
		prev = s
	}
	switch r.Stop {
	case StopCapacity:
		x.refusedCapacity++
	case StopMaxBlocks:
		x.refusedBlocks++
	}
	return r, nil
}

// Commit makes pending blocks resident at the owner's locations (locs[i] for ids[i]). ids must be
// in chain order: each block's parent is either not pending or the previous id (typically ids =
// chain[a:b] of one reservation); a block may not be committed before its parent. On any violation
// nothing changes and the error wraps ErrNotPending, ErrNotFound, ErrBadChain or ErrBadArg.
// Committed blocks join the LRU list as just used. Blocks that were removed (Remove) while pending
// leave the index at once and are returned for the caller to free, with any draining ancestors
// this releases.
func (x *Index) Commit(ids, locs []uint64) ([]Dropped, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(ids) != len(locs) {
		return nil, fmt.Errorf("commit %d ids with %d locations: %w", len(ids), len(locs), ErrBadArg)
	}
	if err := x.checkPending("commit", ids, true); err != nil {
		return nil, err
	}
	var out []Dropped
	for i, id := range ids {
		s := x.find(id)
		e := x.sl.at(s)
		e.state = stateResident
		e.loc = locs[i]
		x.nPending--
		x.pendingBytes -= e.sizeBytes
		x.committed++
		if e.flags&flagDoomed != 0 {
			out = x.reap(s, out)
		} else {
			x.refresh(s)
		}
	}
	return x.shrink(out), nil
}

// Abort drops pending blocks the caller reserved and will not commit, with their pending
// descendants (which can only come from the same reservation, so normally are listed too). Every
// id must be pending; otherwise nothing changes. The caller frees whatever storage it had allocated
// for them. Returned entries are draining ancestors (removed while they held these blocks) that now
// leave the index; the caller frees those too.
func (x *Index) Abort(ids []uint64) ([]Dropped, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.checkPending("abort", ids, false); err != nil {
		return nil, err
	}
	var out []Dropped
	for _, id := range ids {
		s := x.find(id)
		if s == noSlot {
			continue // dropped with an ancestor listed earlier
		}
		sub := x.subtree(s)
		p := x.sl.at(s).parent
		for i := len(sub) - 1; i >= 0; i-- {
			x.drop(sub[i])
			x.aborted++
		}
		out = x.release(p, out)
	}
	x.trimScratch()
	return x.shrink(out), nil
}

// Remove takes a block whose data was found bad out of service together with its descendants,
// which are unreachable without it (O(subtree) under the lock). Entries that are neither pinned
// nor pending (nor holding such descendants) leave at once and are returned for the caller to
// free. The others stop being hits at once ("draining") and leave later: a pinned one is returned
// by the Unpin that drops its last pin, a pending one by its Commit (or it is dropped by its
// Abort, like any aborted block), and a draining ancestor by whichever of these calls releases its
// last held descendant.
func (x *Index) Remove(id uint64) ([]Dropped, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.find(id)
	if s == noSlot {
		return nil, fmt.Errorf("remove id %#x: %w", id, ErrNotFound)
	}
	sub := x.subtree(s)
	for _, t := range sub { // parents first: each leaves the LRU list before its children change
		e := x.sl.at(t)
		if e.flags&flagDoomed == 0 {
			e.flags |= flagDoomed
			x.nDoomed++
			x.refresh(t)
		}
	}
	p := x.sl.at(s).parent
	var out []Dropped
	for i := len(sub) - 1; i >= 0; i-- { // children first
		if x.reapable(x.sl.at(sub[i])) {
			out = append(out, x.dropCommitted(sub[i]))
		}
	}
	out = x.release(p, out)
	x.trimScratch()
	return x.shrink(out), nil
}

// Evict evicts LRU leaves until at least minBytes were freed or nothing is evictable, for an owner
// whose storage is short although the index has room (e.g. fragmentation). Returned entries are
// the caller's to free.
func (x *Index) Evict(minBytes int64) []Dropped {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []Dropped
	for freed := int64(0); freed < minBytes && x.lruHead != noSlot; {
		d := x.evictHead()
		freed += d.SizeBytes
		out = append(out, d)
	}
	return out
}

// SetCapacity changes the byte capacity and evicts LRU leaves down to it as far as possible. Bytes
// held by pinned, pending or held blocks may stay above a lowered capacity until released; Reserve
// admits nothing until usage is below it again.
func (x *Index) SetCapacity(capacityBytes int64) ([]Dropped, error) {
	if capacityBytes <= 0 || capacityBytes > MaxCapacityBytes {
		return nil, fmt.Errorf("set capacity %d bytes: %w", capacityBytes, ErrBadArg)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.capacityBytes = capacityBytes
	var out []Dropped
	for x.usedBytes > x.capacityBytes && x.lruHead != noSlot {
		out = append(out, x.evictHead())
	}
	return out, nil
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

// touch moves s and its ancestors, in that order, to the LRU tail (those that are on the list).
func (x *Index) touch(s int32) {
	for s != noSlot {
		e := x.sl.at(s)
		if e.flags&flagInLRU != 0 && s != x.lruTail {
			x.lruUnlink(s, e)
			x.lruPush(s, e)
		}
		s = e.parent
	}
}

func evictable(e *entry) bool {
	return e.state == stateResident && e.pins == 0 && e.holds == 0 && e.flags&flagDoomed == 0
}

// refresh puts s on or off the LRU list after a change to it, and carries the change up the
// parent path (a parent's holds counts its children that are off the list). It stops at the first
// block whose membership does not change, so its cost is paid by the change that it undoes.
func (x *Index) refresh(s int32) {
	for s != noSlot {
		e := x.sl.at(s)
		want := evictable(e)
		if want == (e.flags&flagInLRU != 0) {
			return
		}
		var p *entry
		if e.parent != noSlot {
			p = x.sl.at(e.parent)
		}
		if want {
			x.lruPush(s, e)
			if p != nil {
				p.holds--
			}
		} else {
			x.lruUnlink(s, e)
			if p != nil {
				p.holds++
			}
		}
		s = e.parent
	}
}

func (x *Index) lruPush(s int32, e *entry) {
	e.lruPrev, e.lruNext = x.lruTail, noSlot
	if x.lruTail != noSlot {
		x.sl.at(x.lruTail).lruNext = s
	} else {
		x.lruHead = s
	}
	x.lruTail = s
	if e.flags&flagInLRU == 0 {
		e.flags |= flagInLRU
		x.evictableCount++
		x.evictBytes += e.sizeBytes
	}
}

func (x *Index) lruUnlink(s int32, e *entry) {
	if e.lruPrev != noSlot {
		x.sl.at(e.lruPrev).lruNext = e.lruNext
	} else {
		x.lruHead = e.lruNext
	}
	if e.lruNext != noSlot {
		x.sl.at(e.lruNext).lruPrev = e.lruPrev
	} else {
		x.lruTail = e.lruPrev
	}
	e.lruPrev, e.lruNext = noSlot, noSlot
	e.flags &^= flagInLRU
	x.evictableCount--
	x.evictBytes -= e.sizeBytes
}

// insertPending adds id as a pending child of parent (noSlot: a root).
func (x *Index) insertPending(id uint64, parent int32, sizeBytes int64) int32 {
	x.tabMakeRoom()
	s := x.sl.alloc() // cannot fail: count ≤ maxBlocks+1 ≤ maxSlots
	e := x.sl.at(s)
	*e = entry{id: id, sizeBytes: sizeBytes, parent: parent, child: noSlot, nextSib: noSlot, prevSib: noSlot,
		lruPrev: noSlot, lruNext: noSlot, state: statePending}
	x.tabInsert(id, s)
	x.count++
	x.nPending++
	x.usedBytes += sizeBytes
	x.pendingBytes += sizeBytes
	if parent != noSlot {
		p := x.sl.at(parent)
		e.nextSib = p.child
		if p.child != noSlot {
			x.sl.at(p.child).prevSib = s
		}
		p.child = s
		p.holds++ // a pending child is off the list
		x.refresh(parent)
	}
	return s
}

// undoPending takes back a pending leaf that Reserve could not admit.
func (x *Index) undoPending(s int32) {
	p := x.sl.at(s).parent
	x.drop(s)
	x.refresh(p)
}

// evictHead evicts the LRU head, a leaf by the list's order invariant.
func (x *Index) evictHead() Dropped {
	s := x.lruHead
	e := x.sl.at(s)
	d := Dropped{ID: e.id, Loc: e.loc, SizeBytes: e.sizeBytes}
	x.evictions++
	x.evictedBytes += e.sizeBytes
	x.drop(s) // parent's holds is unchanged: s was on the list
	return d
}

// shrink evicts LRU leaves while usage is above a capacity that SetCapacity lowered below what
// non-evictable blocks held then; a no-op otherwise (Reserve never exceeds capacity).
func (x *Index) shrink(out []Dropped) []Dropped {
	for x.usedBytes > x.capacityBytes && x.lruHead != noSlot {
		out = append(out, x.evictHead())
	}
	return out
}

// reapable: a draining block that nothing holds any more.
func (x *Index) reapable(e *entry) bool {
	return e.flags&flagDoomed != 0 && e.pins == 0 && e.state == stateResident && e.child == noSlot
}

// dropCommitted drops a draining block and describes it for the caller.
func (x *Index) dropCommitted(s int32) Dropped {
	e := x.sl.at(s)
	d := Dropped{ID: e.id, Loc: e.loc, SizeBytes: e.sizeBytes}
	x.removed++
	x.drop(s)
	return d
}

// reap drops s and then its draining ancestors while they are reapable, then refreshes the first
// survivor.
func (x *Index) reap(s int32, out []Dropped) []Dropped {
	for s != noSlot && x.reapable(x.sl.at(s)) {
		p := x.sl.at(s).parent
		out = append(out, x.dropCommitted(s))
		s = p
	}
	if s != noSlot {
		x.refresh(s)
	}
	return out
}

// release is called on the parent of dropped blocks: reap it if it is draining, else refresh it.
func (x *Index) release(p int32, out []Dropped) []Dropped {
	if p == noSlot {
		return out
	}
	if x.sl.at(p).flags&flagDoomed != 0 {
		return x.reap(p, out)
	}
	x.refresh(p)
	return out
}

// drop removes leaf s from the list or its parent's holds, its parent's children, the table and
// the counters. The caller refreshes the parent when its membership may change.
func (x *Index) drop(s int32) {
	e := x.sl.at(s)
	if e.flags&flagInLRU != 0 {
		x.lruUnlink(s, e)
	} else if e.parent != noSlot {
		x.sl.at(e.parent).holds--
	}
	if e.parent != noSlot {
		if e.prevSib != noSlot {
			x.sl.at(e.prevSib).nextSib = e.nextSib
		} else {
			x.sl.at(e.parent).child = e.nextSib
		}
		if e.nextSib != noSlot {
			x.sl.at(e.nextSib).prevSib = e.prevSib
		}
	}
	x.tabDelete(e.id)
	x.count--
	x.usedBytes -= e.sizeBytes
	if e.state == statePending {
		x.nPending--
		x.pendingBytes -= e.sizeBytes
	}
	if e.pins > 0 {
		x.nPinned--
		x.pinnedBytes -= e.sizeBytes
	}
	if e.flags&flagDoomed != 0 {
		x.nDoomed--
	}
	x.sl.release(s)
}

// subtree returns s and its descendants, parents before children (breadth first), in x.scratch.
func (x *Index) subtree(s int32) []int32 {
	sub := append(x.scratch[:0], s)
	for i := 0; i < len(sub); i++ {
		for c := x.sl.at(sub[i]).child; c != noSlot; c = x.sl.at(c).nextSib {
			sub = append(sub, c)
		}
	}
	x.scratch = sub
	return sub
}

// maxScratch bounds the scratch slice kept between calls (a Remove near a root may list millions).
const maxScratch = 1 << 16

func (x *Index) trimScratch() {
	if cap(x.scratch) > maxScratch {
		x.scratch = nil
	}
}

// checkPending validates ids for Commit (chain order) or Abort: all present, pending, distinct.
func (x *Index) checkPending(op string, ids []uint64, chainOrder bool) error {
	var err error
	marked := 0
	prev := noSlot
	for i, id := range ids {
		s := x.find(id)
		switch {
		case s == noSlot:
			err = fmt.Errorf("%s id %#x: %w", op, id, ErrNotFound)
		case x.sl.at(s).state != statePending:
			err = fmt.Errorf("%s id %#x: %w", op, id, ErrNotPending)
		case x.sl.at(s).flags&flagMark != 0:
			err = fmt.Errorf("%s id %#x listed twice: %w", op, id, ErrBadArg)
		case chainOrder && x.sl.at(s).parent != noSlot && x.sl.at(s).parent != prev &&
			x.sl.at(x.sl.at(s).parent).state == statePending:
			err = fmt.Errorf("%s ids[%d] %#x before its pending parent: %w", op, i, id, ErrBadChain)
		}
		if err != nil {
			break
		}
		x.sl.at(s).flags |= flagMark
		marked++
		prev = s
	}
	for _, id := range ids[:marked] {
		x.sl.at(x.find(id)).flags &^= flagMark
	}
	return err
}
