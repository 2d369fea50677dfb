package prefix

import (
	"cmp"
	"slices"
)

// lruKey orders one block in RestoreLRU: its rank, then how far it was
// moved behind a descendant (so it sorts after that descendant), then its
// place on the list before.
type lruKey struct {
	rank, lift, pos int64
}

func (a lruKey) cmp(b lruKey) int {
	return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.lift, b.lift), cmp.Compare(a.pos, b.pos))
}

// RestoreLRU reorders the eviction list after a restart, from order, an
// earlier LRU() list (next victim first): the evictable blocks it names
// take its order, and the other evictable blocks come after them, in their
// current order, as the most recently used (blocks the order does not know
// are newer than it). A block the order puts before one of its descendants
// is moved just behind that descendant, so the list keeps its invariant
// (every block before its ancestors; the head is a leaf). Ids that are not
// evictable now are skipped. It returns how many ids of order it placed.
// O(n log n) in the evictable blocks, plus len(order), under the lock, with
// temporary memory of the same order as the index's own; meant for the
// owner's Open, not for the request path.
func (x *Index) RestoreLRU(order []uint64) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	var list []int32
	for s := x.lruHead; s != noSlot; s = x.sl.at(s).lruNext {
		list = append(list, s)
	}
	if len(list) == 0 {
		return 0
	}
	rank := make([]int64, x.sl.n)
	for i := range rank {
		rank[i] = -1
	}
	placed := 0
	for i, id := range order {
		s := x.find(id)
		if s == noSlot || x.sl.at(s).flags&flagInLRU == 0 || rank[s] >= 0 {
			continue
		}
		rank[s] = int64(i)
		placed++
	}
	// keys[s] is block s's place; low[s] (when has[s]) the least place
	// that sorts it behind every descendant keyed so far. The list has
	// every block before its ancestors, so all of them come first.
	keys, low, has := make([]lruKey, x.sl.n), make([]lruKey, x.sl.n), make([]bool, x.sl.n)
	for pos, s := range list {
		k := lruKey{rank: rank[s], pos: int64(pos)}
		if k.rank < 0 {
			k.rank = int64(len(order)) + int64(pos)
		}
		if has[s] && (low[s].rank > k.rank || (low[s].rank == k.rank && low[s].lift > k.lift)) {
			k.rank, k.lift = low[s].rank, low[s].lift
		}
		keys[s] = k
		if p := x.sl.at(s).parent; p != noSlot {
			up := lruKey{rank: k.rank, lift: k.lift + 1}
			if !has[p] || up.rank > low[p].rank || (up.rank == low[p].rank && up.lift > low[p].lift) {
				low[p], has[p] = up, true
			}
		}
	}
	slices.SortFunc(list, func(a, b int32) int { return keys[a].cmp(keys[b]) })
	x.lruHead, x.lruTail = noSlot, noSlot
	for _, s := range list {
		e := x.sl.at(s)
		e.lruPrev, e.lruNext = x.lruTail, noSlot
		if x.lruTail != noSlot {
			x.sl.at(x.lruTail).lruNext = s
		} else {
			x.lruHead = s
		}
		x.lruTail = s
	}
	return placed
}
