package prefix

import "fmt"

// Check verifies the index's invariants in O(blocks) and returns the first violation: table and
// slots agree; parent/child links are consistent; holds counts the children off the LRU list; the
// LRU list holds exactly the evictable blocks, every block before its ancestors (so the head is a
// leaf); pins never exceed a parent's pins; a pending block's children are pending; counters and
// byte sums match; bytes exceed capacity only by what non-evictable blocks hold. For tests.
func (x *Index) Check() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.tab.count != x.count {
		return fmt.Errorf("table has %d ids, index %d blocks", x.tab.count, x.count)
	}
	var count, pending, pinned, doomed int
	var used, pendingB, pinnedB int64
	for s := int32(0); s < x.sl.n; s++ {
		e := x.sl.at(s)
		if e.state == stateFree {
			continue
		}
		count++
		used += e.sizeBytes
		if f := x.find(e.id); f != s {
			return fmt.Errorf("id %#x in slot %d but table says %d", e.id, s, f)
		}
		if e.state == statePending {
			pending++
			pendingB += e.sizeBytes
			if e.pins != 0 || e.flags&flagInLRU != 0 {
				return fmt.Errorf("pending %#x pinned or on the list", e.id)
			}
		}
		if e.pins > 0 {
			pinned++
			pinnedB += e.sizeBytes
		}
		if e.flags&flagDoomed != 0 {
			doomed++
		}
		var holds uint32
		for c := e.child; c != noSlot; c = x.sl.at(c).nextSib {
			ce := x.sl.at(c)
			if ce.parent != s {
				return fmt.Errorf("child %#x of %#x has parent slot %d", ce.id, e.id, ce.parent)
			}
			if ce.flags&flagInLRU == 0 {
				holds++
			}
			if e.state == statePending && ce.state != statePending {
				return fmt.Errorf("%#x is committed under pending %#x", ce.id, e.id)
			}
			if e.flags&flagDoomed != 0 && ce.flags&flagDoomed == 0 {
				return fmt.Errorf("%#x is live under draining %#x", ce.id, e.id)
			}
		}
		if holds != e.holds {
			return fmt.Errorf("%#x holds %d, children off the list %d", e.id, e.holds, holds)
		}
		if evictable(e) != (e.flags&flagInLRU != 0) {
			return fmt.Errorf("%#x evictable=%v but on list=%v", e.id, evictable(e), e.flags&flagInLRU != 0)
		}
		if e.parent != noSlot {
			p := x.sl.at(e.parent)
			if p.state == stateFree {
				return fmt.Errorf("%#x has a free parent slot", e.id)
			}
			if p.pins < e.pins {
				return fmt.Errorf("%#x has %d pins, its parent %#x only %d", e.id, e.pins, p.id, p.pins)
			}
		}
	}
	if count != x.count || pending != x.nPending || pinned != x.nPinned || doomed != x.nDoomed {
		return fmt.Errorf("counts: blocks %d/%d pending %d/%d pinned %d/%d draining %d/%d",
			count, x.count, pending, x.nPending, pinned, x.nPinned, doomed, x.nDoomed)
	}
	if used != x.usedBytes || pendingB != x.pendingBytes || pinnedB != x.pinnedBytes {
		return fmt.Errorf("bytes: used %d/%d pending %d/%d pinned %d/%d",
			used, x.usedBytes, pendingB, x.pendingBytes, pinnedB, x.pinnedBytes)
	}
	// The list: links, membership, and order (a block before its ancestors).
	pos := make(map[int32]int, x.evictableCount)
	var n int
	var evB int64
	prev := noSlot
	for s := x.lruHead; s != noSlot; s = x.sl.at(s).lruNext {
		e := x.sl.at(s)
		if e.lruPrev != prev {
			return fmt.Errorf("list: %#x lruPrev %d, want %d", e.id, e.lruPrev, prev)
		}
		if e.flags&flagInLRU == 0 {
			return fmt.Errorf("list: %#x not flagged", e.id)
		}
		if n > x.count {
			return fmt.Errorf("list: cycle")
		}
		pos[s] = n
		n++
		evB += e.sizeBytes
		prev = s
	}
	if prev != x.lruTail || n != x.evictableCount || evB != x.evictBytes {
		return fmt.Errorf("list: tail %d/%d length %d/%d bytes %d/%d", prev, x.lruTail, n, x.evictableCount, evB, x.evictBytes)
	}
	for s, i := range pos {
		if p := x.sl.at(s).parent; p != noSlot {
			if j, ok := pos[p]; ok && j < i {
				return fmt.Errorf("list: %#x after its parent %#x", x.sl.at(s).id, x.sl.at(p).id)
			}
		}
	}
	if x.lruHead != noSlot && x.sl.at(x.lruHead).child != noSlot {
		return fmt.Errorf("list: head %#x is not a leaf", x.sl.at(x.lruHead).id)
	}
	if x.usedBytes > x.capacityBytes && x.evictBytes > 0 {
		return fmt.Errorf("bytes %d over capacity %d with %d evictable", x.usedBytes, x.capacityBytes, x.evictBytes)
	}
	if x.count > x.maxBlocks && x.evictableCount > 0 {
		return fmt.Errorf("blocks %d over limit %d with %d evictable", x.count, x.maxBlocks, x.evictableCount)
	}
	return nil
}
