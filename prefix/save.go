package prefix

import "fmt"

// The save lifecycle: Reserve makes blocks pending, Commit makes them resident
// with their locations, Abort undoes them.

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
