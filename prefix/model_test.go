package prefix

import (
	"sort"
)

// The reference model: plain maps, evictability recomputed from scratch, LRU by timestamps.
// Eviction picks the evictable leaf with the oldest stamp; a block gets a new stamp when it is
// touched on the list or when it (re)becomes evictable (deepest first, as the index pushes them).

type mBlock struct {
	id, parent uint64
	hasParent  bool
	pending    bool
	pins       int
	doomed     bool
	size       int64
	loc        uint64
	inList     bool
	stamp      int64
}

type model struct {
	b         map[uint64]*mBlock
	capacity  int64
	maxBlocks int
	clock     int64
}

func newModel(capacity int64, maxBlocks int) *model {
	if maxBlocks == 0 {
		maxBlocks = MaxBlocksLimit
	}
	return &model{b: map[uint64]*mBlock{}, capacity: capacity, maxBlocks: maxBlocks}
}

func (m *model) children(id uint64) []*mBlock {
	var cs []*mBlock
	for _, c := range m.b {
		if c.hasParent && c.parent == id {
			cs = append(cs, c)
		}
	}
	return cs
}

// evictable: resident, unpinned, not draining, and every child evictable (memoized per sync).
func (m *model) evictable(b *mBlock, kids map[uint64][]*mBlock, memo map[uint64]bool) bool {
	if v, ok := memo[b.id]; ok {
		return v
	}
	ev := !b.pending && b.pins == 0 && !b.doomed
	for _, c := range kids[b.id] {
		if !m.evictable(c, kids, memo) {
			ev = false
		}
	}
	memo[b.id] = ev
	return ev
}

func (m *model) depth(b *mBlock) int {
	d := 0
	for b.hasParent {
		b = m.b[b.parent]
		d++
	}
	return d
}

// sync recomputes list membership; blocks that join get new stamps, deepest first.
func (m *model) sync() {
	var joined []*mBlock
	kids := make(map[uint64][]*mBlock, len(m.b))
	for _, b := range m.b {
		if b.hasParent {
			kids[b.parent] = append(kids[b.parent], b)
		}
	}
	memo := make(map[uint64]bool, len(m.b))
	for _, b := range m.b {
		ev := m.evictable(b, kids, memo)
		if ev && !b.inList {
			joined = append(joined, b)
		}
		b.inList = ev
	}
	sort.Slice(joined, func(i, j int) bool { return m.depth(joined[i]) > m.depth(joined[j]) })
	for _, b := range joined {
		m.clock++
		b.stamp = m.clock
	}
}

func (m *model) used() (used, evictable int64, evCount int) {
	for _, b := range m.b {
		used += b.size
		if b.inList {
			evictable += b.size
			evCount++
		}
	}
	return
}

func (m *model) lru() []uint64 {
	var l []*mBlock
	for _, b := range m.b {
		if b.inList {
			l = append(l, b)
		}
	}
	sort.Slice(l, func(i, j int) bool { return l[i].stamp < l[j].stamp })
	ids := make([]uint64, len(l))
	for i, b := range l {
		ids[i] = b.id
	}
	return ids
}

func (m *model) walk(chain []uint64) int {
	for i, id := range chain {
		b := m.b[id]
		if b == nil || b.pending || b.doomed || b.hasParent != (i > 0) || (i > 0 && b.parent != chain[i-1]) {
			return i
		}
	}
	return len(chain)
}

func (m *model) lookup(chain []uint64) int {
	n := m.walk(chain)
	for i := n - 1; i >= 0; i-- {
		if b := m.b[chain[i]]; b.inList {
			m.clock++
			b.stamp = m.clock
		}
	}
	return n
}

func (m *model) pin(chain []uint64) int {
	n := m.walk(chain)
	for i := n - 1; i >= 0; i-- {
		m.b[chain[i]].pins++
		m.sync()
	}
	return n
}

func (m *model) reapable(b *mBlock) bool {
	return b.doomed && b.pins == 0 && !b.pending && len(m.children(b.id)) == 0
}

func (m *model) reap(b *mBlock, out []Dropped) []Dropped {
	for b != nil && m.reapable(b) {
		out = append(out, Dropped{b.id, b.loc, b.size})
		delete(m.b, b.id)
		if !b.hasParent {
			b = nil
		} else {
			b = m.b[b.parent]
		}
	}
	m.sync()
	return out
}

// shrink mirrors Index.shrink.
func (m *model) shrink(out []Dropped) []Dropped {
	for {
		used, ev, _ := m.used()
		if used <= m.capacity || ev == 0 {
			return out
		}
		out = append(out, m.evictOne())
	}
}

func (m *model) unpin(chain []uint64) ([]Dropped, error) {
	for i, id := range chain {
		b := m.b[id]
		if b == nil || b.pins == 0 || b.hasParent != (i > 0) || (i > 0 && b.parent != chain[i-1]) {
			return nil, ErrNotPinned
		}
	}
	var out []Dropped
	for i := len(chain) - 1; i >= 0; i-- {
		b := m.b[chain[i]]
		b.pins--
		if b.doomed {
			out = m.reap(b, out)
		} else {
			m.sync()
		}
	}
	return m.shrink(out), nil
}

func (m *model) evictOne() Dropped {
	var best *mBlock
	for _, b := range m.b {
		if b.inList && len(m.children(b.id)) == 0 && (best == nil || b.stamp < best.stamp) {
			best = b
		}
	}
	delete(m.b, best.id)
	m.sync()
	return Dropped{best.id, best.loc, best.size}
}

func (m *model) reserve(chain []uint64, from int, size int64) (Reservation, error) {
	r := Reservation{From: from}
	if from < 0 || from > len(chain) || size <= 0 {
		return r, ErrBadArg
	}
	if m.walk(chain[:from]) < from {
		r.Stop = StopNotCached
		return r, nil
	}
	for i := from; i < len(chain); i++ {
		if m.b[chain[i]] != nil {
			r.Stop = StopPresent
			break
		}
		if size > m.capacity {
			r.Stop = StopCapacity
			break
		}
		b := &mBlock{id: chain[i], pending: true, size: size}
		if i > 0 {
			b.parent, b.hasParent = chain[i-1], true
		}
		m.b[b.id] = b
		m.sync()
		used, ev, evCount := m.used()
		if used-ev > m.capacity {
			r.Stop = StopCapacity
		} else if len(m.b)-evCount > m.maxBlocks {
			r.Stop = StopMaxBlocks
		}
		if r.Stop != StopNone {
			delete(m.b, b.id)
			m.sync()
			break
		}
		for {
			used, _, _ := m.used()
			if used <= m.capacity && len(m.b) <= m.maxBlocks {
				break
			}
			r.Evicted = append(r.Evicted, m.evictOne())
		}
		r.N++
	}
	return r, nil
}

func (m *model) checkPending(ids []uint64, chainOrder bool) error {
	seen := map[uint64]bool{}
	for i, id := range ids {
		b := m.b[id]
		switch {
		case b == nil:
			return ErrNotFound
		case !b.pending:
			return ErrNotPending
		case seen[id]:
			return ErrBadArg
		case chainOrder && b.hasParent && (i == 0 || b.parent != ids[i-1]) && m.b[b.parent].pending:
			return ErrBadChain
		}
		seen[id] = true
	}
	return nil
}

func (m *model) commit(ids, locs []uint64) ([]Dropped, error) {
	if len(ids) != len(locs) {
		return nil, ErrBadArg
	}
	if err := m.checkPending(ids, true); err != nil {
		return nil, err
	}
	var out []Dropped
	for i, id := range ids {
		b := m.b[id]
		b.pending = false
		b.loc = locs[i]
		if b.doomed {
			out = m.reap(b, out)
		} else {
			m.sync()
		}
	}
	return m.shrink(out), nil
}

func (m *model) subtree(id uint64) []uint64 {
	sub := []uint64{id}
	for i := 0; i < len(sub); i++ {
		for _, c := range m.children(sub[i]) {
			sub = append(sub, c.id)
		}
	}
	return sub
}

func (m *model) release(b *mBlock, out []Dropped) []Dropped {
	if b == nil {
		return out
	}
	if b.doomed {
		return m.reap(b, out)
	}
	m.sync()
	return out
}

func (m *model) parentOf(b *mBlock) *mBlock {
	if !b.hasParent {
		return nil
	}
	return m.b[b.parent]
}

func (m *model) abort(ids []uint64) ([]Dropped, error) {
	if err := m.checkPending(ids, false); err != nil {
		return nil, err
	}
	var out []Dropped
	for _, id := range ids {
		b := m.b[id]
		if b == nil {
			continue
		}
		p := m.parentOf(b)
		for _, d := range m.subtree(id) {
			delete(m.b, d)
		}
		out = m.release(p, out)
	}
	return m.shrink(out), nil
}

func (m *model) remove(id uint64) ([]Dropped, error) {
	b := m.b[id]
	if b == nil {
		return nil, ErrNotFound
	}
	sub := m.subtree(id)
	for _, d := range sub {
		m.b[d].doomed = true
	}
	m.sync()
	p := m.parentOf(b)
	var out []Dropped
	for i := len(sub) - 1; i >= 0; i-- {
		if d := m.b[sub[i]]; m.reapable(d) {
			out = append(out, Dropped{d.id, d.loc, d.size})
			delete(m.b, d.id)
		}
	}
	m.sync()
	return m.shrink(m.release(p, out)), nil
}

func (m *model) evict(minBytes int64) []Dropped {
	var out []Dropped
	for freed := int64(0); freed < minBytes; {
		_, ev, _ := m.used()
		if ev == 0 {
			break
		}
		d := m.evictOne()
		freed += d.SizeBytes
		out = append(out, d)
	}
	return out
}

func (m *model) setCapacity(c int64) []Dropped {
	m.capacity = c
	var out []Dropped
	for {
		used, ev, _ := m.used()
		if used <= m.capacity || ev == 0 {
			return out
		}
		out = append(out, m.evictOne())
	}
}
