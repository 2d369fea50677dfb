package sim

// An LRU over block ids: the simulated store's capacity and which blocks
// are resident.

type blockInfo struct {
	run, pos, dev int
	pending       bool
}

type lruNode struct {
	id         uint64
	info       blockInfo
	prev, next int32
}

type lru struct {
	capacity int
	idx      map[uint64]int32
	nodes    []lruNode
	free     []int32
	head     int32 // most recent; −1 empty
	tail     int32
}

func newLRU(capacity int) *lru {
	return &lru{capacity: capacity, idx: make(map[uint64]int32), head: -1, tail: -1}
}

func (c *lru) has(id uint64) bool { _, ok := c.idx[id]; return ok }

func (c *lru) resident(id uint64) bool {
	n, ok := c.idx[id]
	return ok && !c.nodes[n].info.pending
}

func (c *lru) get(id uint64) blockInfo { return c.nodes[c.idx[id]].info }

func (c *lru) unlink(n int32) {
	x := &c.nodes[n]
	if x.prev >= 0 {
		c.nodes[x.prev].next = x.next
	} else {
		c.head = x.next
	}
	if x.next >= 0 {
		c.nodes[x.next].prev = x.prev
	} else {
		c.tail = x.prev
	}
}

func (c *lru) pushFront(n int32) {
	x := &c.nodes[n]
	x.prev, x.next = -1, c.head
	if c.head >= 0 {
		c.nodes[c.head].prev = n
	}
	c.head = n
	if c.tail < 0 {
		c.tail = n
	}
}

func (c *lru) touch(id uint64) {
	if n, ok := c.idx[id]; ok {
		c.unlink(n)
		c.pushFront(n)
	}
}

func (c *lru) insert(id uint64, info blockInfo) {
	if n, ok := c.idx[id]; ok {
		c.nodes[n].info = info
		c.touch(id)
		return
	}
	for len(c.idx) >= c.capacity {
		t := c.tail
		c.unlink(t)
		delete(c.idx, c.nodes[t].id)
		c.free = append(c.free, t)
	}
	var n int32
	if k := len(c.free); k > 0 {
		n = c.free[k-1]
		c.free = c.free[:k-1]
	} else {
		c.nodes = append(c.nodes, lruNode{})
		n = int32(len(c.nodes) - 1)
	}
	c.nodes[n] = lruNode{id: id, info: info}
	c.idx[id] = n
	c.pushFront(n)
}

// markResident flips a block saved by run to resident, unless it was evicted
// (or re-saved by another run) meanwhile.
func (c *lru) markResident(id uint64, run int) {
	if n, ok := c.idx[id]; ok && c.nodes[n].info.run == run {
		c.nodes[n].info.pending = false
	}
}
