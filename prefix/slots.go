package prefix

const (
	noSlot    int32 = -1
	pageBits        = 16
	pageSlots       = 1 << pageBits
	pageMask        = pageSlots - 1

	// maxSlots bounds slot numbers well inside int32 (so count+1 never overflows).
	maxSlots = 1 << 30
)

const (
	stateFree uint8 = iota
	statePending
	stateResident
)

const (
	flagInLRU  uint8 = 1 << iota // on the evictable LRU list
	flagDoomed                   // removed (Remove) but still pinned or pending, or holding such children
	flagMark                     // scratch mark for duplicate detection inside one call
)

// entry is one block. 64 bytes, no pointers: one cache line, never scanned by the GC.
type entry struct {
	id        uint64
	loc       uint64 // owner's location, set at Commit
	sizeBytes int64
	parent    int32 // noSlot for a root
	child     int32 // first child, noSlot if none
	nextSib   int32
	prevSib   int32
	lruPrev   int32
	lruNext   int32
	pins      uint32
	holds     uint32 // children not on the LRU list (pinned, pending, draining, or themselves held)
	state     uint8
	flags     uint8
	_         [6]byte
}

// slots is paged storage for entries: growth adds a page, never copies, and wastes at most one
// page. Free slots are chained through nextSib.
type slots struct {
	pages [][]entry
	n     int32 // slots ever handed out
	free  int32 // head of the free list
}

func (s *slots) at(i int32) *entry { return &s.pages[i>>pageBits][i&pageMask] }

// alloc returns a zeroed slot, or noSlot when maxSlots are in use.
func (s *slots) alloc() int32 {
	if s.free != noSlot {
		i := s.free
		e := s.at(i)
		s.free = e.nextSib
		*e = entry{}
		return i
	}
	if s.n >= maxSlots {
		return noSlot
	}
	if int(s.n>>pageBits) == len(s.pages) {
		s.pages = append(s.pages, make([]entry, pageSlots))
	}
	i := s.n
	s.n++
	return i
}

func (s *slots) release(i int32) {
	e := s.at(i)
	*e = entry{state: stateFree, nextSib: s.free}
	s.free = i
}
