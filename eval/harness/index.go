package harness

import "container/list"

// Index is the shared cache policy of the baselines: which chain blocks are
// stored, under a capacity in blocks, evicting least recently used blocks
// leaf first (a block is never evicted while a cached descendant stays, so
// the cached part of a chain is always a prefix).
//
// Leaf-first falls out of the touch order: a lookup or insert touches a
// chain's blocks deepest first, so every block is more recent than all of its
// cached descendants and the LRU end of the list is always a leaf.
type Index struct {
	capacity int
	lru      *list.List // front = most recent; values are uint64 ids
	nodes    map[uint64]*list.Element
}

// NewIndex returns an empty index holding at most capacityBlocks blocks.
func NewIndex(capacityBlocks int) *Index {
	return &Index{capacity: capacityBlocks, lru: list.New(), nodes: map[uint64]*list.Element{}}
}

// Len is the number of cached blocks.
func (x *Index) Len() int { return len(x.nodes) }

// Lookup returns how many leading blocks of chain are cached and marks them
// recently used.
func (x *Index) Lookup(chain []uint64) int {
	n := 0
	for n < len(chain) {
		if _, ok := x.nodes[chain[n]]; !ok {
			break
		}
		n++
	}
	x.touch(chain[:n])
	return n
}

func (x *Index) touch(chain []uint64) {
	for i := len(chain) - 1; i >= 0; i-- {
		x.lru.MoveToFront(x.nodes[chain[i]])
	}
}

// Admit plans storing chain[hit:]: it returns end (blocks chain[hit:end] are
// admitted; end < len(chain) when the request alone exceeds the capacity) and
// the blocks to evict first to make room. The chain's own blocks are never
// evicted. Call Insert after the save.
func (x *Index) Admit(chain []uint64, hit int) (end int, evict []uint64) {
	end = min(len(chain), x.capacity)
	if end < hit {
		end = hit
	}
	need := len(x.nodes) + (end - hit) - x.capacity
	mine := make(map[uint64]struct{}, end)
	for _, id := range chain[:end] {
		mine[id] = struct{}{}
	}
	for e := x.lru.Back(); need > 0 && e != nil; {
		prev := e.Prev()
		id := e.Value.(uint64)
		if _, ok := mine[id]; !ok {
			evict = append(evict, id)
			x.lru.Remove(e)
			delete(x.nodes, id)
			need--
		}
		e = prev
	}
	return end, evict
}

// Insert records chain[hit:end] as cached (after Admit made room).
func (x *Index) Insert(chain []uint64, hit, end int) {
	for _, id := range chain[hit:end] {
		if _, ok := x.nodes[id]; !ok {
			x.nodes[id] = x.lru.PushFront(id)
		}
	}
	x.touch(chain[:end])
}
