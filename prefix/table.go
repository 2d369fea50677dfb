package prefix

// table maps block ids to slots: open addressing with linear probing over int32 slot numbers (the
// id is read from the slot), Fibonacci hashing (dense trace ids and random hashes both spread),
// load factor ≤ 3/4, backward-shift deletion (no tombstones).
type table struct {
	idx   []int32 // slot, or noSlot for an empty cell; len is a power of two
	shift uint    // 64 - log2(len(idx))
	count int
}

const (
	fibMul         = 0x9E3779B97F4A7C15
	minTableBits   = 10
	tableLoadNum   = 3
	tableLoadDenom = 4
)

func newTable(bits uint) table {
	t := table{idx: make([]int32, 1<<bits), shift: 64 - bits}
	for i := range t.idx {
		t.idx[i] = noSlot
	}
	return t
}

func (t *table) home(id uint64) int { return int((id * fibMul) >> t.shift) }

// find returns the slot holding id, or noSlot.
func (x *Index) find(id uint64) int32 {
	t := &x.tab
	mask := len(t.idx) - 1
	for i := t.home(id); ; i = (i + 1) & mask {
		s := t.idx[i]
		if s == noSlot || x.sl.at(s).id == id {
			return s
		}
	}
}

// tabMakeRoom grows the table when one more id would exceed the load factor. Call it before
// the new entry is written to its slot (growth re-inserts every non-free slot).
func (x *Index) tabMakeRoom() {
	t := &x.tab
	if (t.count+1)*tableLoadDenom > len(t.idx)*tableLoadNum {
		x.tabGrow()
	}
}

// tabInsert maps id (not present) to slot s; tabMakeRoom came first.
func (x *Index) tabInsert(id uint64, s int32) {
	t := &x.tab
	mask := len(t.idx) - 1
	i := t.home(id)
	for t.idx[i] != noSlot {
		i = (i + 1) & mask
	}
	t.idx[i] = s
	t.count++
}

// tabGrow doubles the table, re-inserting from the slot pages in slot order (sequential reads).
func (x *Index) tabGrow() {
	bits := 64 - x.tab.shift + 1
	nt := newTable(bits)
	mask := len(nt.idx) - 1
	for s := int32(0); s < x.sl.n; s++ {
		e := x.sl.at(s)
		if e.state == stateFree {
			continue
		}
		i := nt.home(e.id)
		for nt.idx[i] != noSlot {
			i = (i + 1) & mask
		}
		nt.idx[i] = s
		nt.count++
	}
	x.tab = nt
}

// tabDelete unmaps id (present), shifting later cells of its probe run back.
func (x *Index) tabDelete(id uint64) {
	t := &x.tab
	mask := len(t.idx) - 1
	i := t.home(id)
	for x.sl.at(t.idx[i]).id != id {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; t.idx[j] != noSlot; j = (j + 1) & mask {
		k := t.home(x.sl.at(t.idx[j]).id)
		// Move cell j into the hole at i unless its home lies cyclically in (i, j].
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			t.idx[i] = t.idx[j]
			i = j
		}
	}
	t.idx[i] = noSlot
	t.count--
}
