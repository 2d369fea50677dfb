package prefix

import "fmt"

// Pins: a load holds the blocks it restores so that eviction cannot take them.

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
