package harness

import (
	"errors"
	"fmt"
	goruntime "runtime"
	"sync"
	"sync/atomic"

	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring"
)

// KVMemory is the engine's paged KV cache in host memory, in vLLM's per-layer
// layout: one off-heap tensor per layer, [planes, num_pages, page_tokens,
// kv_heads, head_dim]. Backends read into it and write from it directly
// (it is mmap'd, so O_DIRECT I/O may target it). Free releases it once.
type KVMemory struct {
	Geometry kvshape.Geometry
	NumPages int
	Layers   []*uring.Buffer // one per layer

	// free page ids, a stack whose top is taken first; kept ascending where
	// it can be, so a request's pages are runs of consecutive ids and the
	// copies and clears over them (HostSyncer) are few and large.
	free []int32
}

// NewKVMemory allocates numPages pages of every layer.
func NewKVMemory(g kvshape.Geometry, numPages int) (*KVMemory, error) {
	per, err := g.TensorBytes(kvshape.LayoutPerLayer, numPages)
	if err != nil {
		return nil, err
	}
	if per > 1<<40 {
		return nil, fmt.Errorf("KV memory of %d bytes per layer: too large", per)
	}
	m := &KVMemory{Geometry: g, NumPages: numPages}
	for l := 0; l < g.Layers; l++ {
		b, err := uring.AllocBuffer(int(per))
		if err != nil {
			m.Free()
			return nil, fmt.Errorf("allocating KV memory layer %d (%d bytes): %w", l, per, err)
		}
		m.Layers = append(m.Layers, b)
	}
	m.free = make([]int32, numPages)
	for i := range m.free {
		m.free[i] = int32(i)
	}
	return m, nil
}

// Bytes is the total size.
func (m *KVMemory) Bytes() int64 {
	per, _ := m.Geometry.TensorBytes(kvshape.LayoutPerLayer, m.NumPages)
	return per * int64(m.Geometry.Layers)
}

// Page returns the bytes of (layer, plane, page): a view into the layer's
// buffer, valid until Free.
func (m *KVMemory) Page(layer, plane int, page int32) []byte {
	off, err := m.Geometry.PageOffset(kvshape.LayoutPerLayer, m.NumPages, layer, plane, int(page))
	if err != nil {
		panic(err) // page ids come from Alloc; a bad one is a harness bug
	}
	n := m.Geometry.PageBytesPerPlane()
	return m.Layers[layer].Bytes()[off : off+n]
}

// PageAddr is the address of Page(layer, plane, page).
func (m *KVMemory) PageAddr(layer, plane int, page int32) uintptr {
	off, err := m.Geometry.PageOffset(kvshape.LayoutPerLayer, m.NumPages, layer, plane, int(page))
	if err != nil {
		panic(err)
	}
	return m.Layers[layer].Addr() + uintptr(off)
}

// ErrNoPages is returned when a request needs more pages than are free.
var ErrNoPages = errors.New("not enough free KV pages")

// Alloc takes n free pages: the top of the stack, in ascending order when
// they were released in it (consecutive ids on a fresh memory).
func (m *KVMemory) Alloc(n int) ([]int32, error) {
	if n > len(m.free) {
		return nil, fmt.Errorf("%w: want %d, %d free of %d", ErrNoPages, n, len(m.free), m.NumPages)
	}
	out := append([]int32(nil), m.free[len(m.free)-n:]...)
	m.free = m.free[:len(m.free)-n]
	return out, nil
}

// Release returns pages taken by Alloc.
func (m *KVMemory) Release(pages []int32) { m.free = append(m.free, pages...) }

// PageKey is the content key of page i of chain block id, layer and plane:
// one kvdata block per page, BlockContentBase(id)+i, at its page 0. That is
// the content testkit's GPU verify checks (page j of its page map holds
// Key{Block: base+j, Page: 0}), so a backend whose restores land in HBM is
// verified there (DeviceVerifier) against the same bytes the host checks.
func PageKey(id uint64, layer, plane, i int) kvdata.Key {
	return kvdata.Key{Block: BlockContentBase(id) + uint64(i), Layer: layer, Plane: plane}
}

// BlockContentBase spreads chain ids (a synthetic trace's may be
// consecutive) over 64 bits, so no two blocks' page keys coincide: block
// a's page i and block b's page j share a key only if their bases differ by
// less than a block's pages.
func BlockContentBase(id uint64) uint64 { return kvdata.Spread(id) }

// FillBlock writes the deterministic KV of chain block id into its pages (all
// layers and planes), as a prefill would produce it.
func (m *KVMemory) FillBlock(id uint64, pages []int32) {
	m.eachLayer(func(l int) int {
		for p := 0; p < m.Geometry.Planes; p++ {
			for i, pg := range pages {
				kvdata.Fill(m.Page(l, p, pg), PageKey(id, l, p, i))
			}
		}
		return 0
	}, len(pages))
}

// VerifyBlock checks chain block id in its pages and returns how many pages
// (per layer and plane) differ from what was saved.
func (m *KVMemory) VerifyBlock(id uint64, pages []int32) int {
	return m.eachLayer(func(l int) int {
		bad := 0
		for p := 0; p < m.Geometry.Planes; p++ {
			for i, pg := range pages {
				if kvdata.Verify(m.Page(l, p, pg), PageKey(id, l, p, i)) >= 0 {
					bad++
				}
			}
		}
		return bad
	}, len(pages))
}

// parallelBlockBytes: a block whose pages hold at least this much over all
// layers is filled and verified one goroutine per layer (at most GOMAXPROCS
// at once): a 70B block is 160 MiB, about 60 ms of one core's kvdata, and a
// replay fills and verifies tens of GiB per backend. The whole block counts,
// not one layer: deepseek-v3's 256-token block is 288 KiB per layer but 17
// MiB in all, and checked on one goroutine its host verify was the slowest
// phase of a replay. Smaller blocks (the tiny test shape)
// stay on the caller's goroutine.
const parallelBlockBytes = 4 << 20

// eachLayer runs fn for every layer and sums what it returns; fn for
// different layers touches disjoint memory.
func (m *KVMemory) eachLayer(fn func(layer int) int, pages int) int {
	g := m.Geometry
	if int64(pages)*g.PageBytesPerLayer()*int64(g.Layers) < parallelBlockBytes || goruntime.GOMAXPROCS(0) == 1 {
		sum := 0
		for l := 0; l < g.Layers; l++ {
			sum += fn(l)
		}
		return sum
	}
	workers := min(goruntime.GOMAXPROCS(0), g.Layers)
	var next, sum atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				l := int(next.Add(1) - 1)
				if l >= g.Layers {
					return
				}
				sum.Add(int64(fn(l)))
			}
		}()
	}
	wg.Wait()
	return int(sum.Load())
}

// Scribble zeroes pages (content no block has), so a restore that writes
// nothing cannot pass verification with stale content.
// Layers are zeroed in parallel as FillBlock and VerifyBlock fill and check
// them (a llama3-8b document of 16K tokens is 2 GiB to zero).
func (m *KVMemory) Scribble(pages []int32) {
	m.eachLayer(func(l int) int {
		for p := 0; p < m.Geometry.Planes; p++ {
			for _, pg := range pages {
				clear(m.Page(l, p, pg))
			}
		}
		return 0
	}, len(pages))
}

// Free releases the memory.
func (m *KVMemory) Free() error {
	var errs []error
	for _, b := range m.Layers {
		errs = append(errs, b.Free())
	}
	m.Layers = nil
	return errors.Join(errs...)
}
