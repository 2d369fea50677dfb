package prefix

import "fmt"

// Eviction: the leaf-first LRU list, capacity, Remove, and dropping blocks
// with their subtrees.

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
