package runtime

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/mover/cpu"
	"github.com/tutti-io/tutti/uring"
)

// Region is a span of memory owned by the caller, given by address and
// length: host memory on PathCPU (off-heap: mmap'd, pinned or C-allocated,
// never a Go slice the GC may move), device memory on PathGPU.
type Region struct {
	Addr     uintptr
	LenBytes int64
}

// KVMemory describes the engine's paged KV memory. Exactly one of Layers
// (kvshape.LayoutPerLayer: one tensor per layer, each
// [planes, num_pages, page_tokens, kv_heads, head_dim]) or Cross
// (kvshape.LayoutCrossLayer: one tensor
// [num_pages, layers, planes, page_tokens, kv_heads, head_dim]) is set,
// matching Config.Layout. The caller keeps the memory valid and unmoved
// from RegisterKV until Close.
type KVMemory struct {
	Layers []Region
	Cross  Region
}

// ErrKV is wrapped by every error about the registered KV memory or a page
// index (block table entry) that does not fit it.
var ErrKV = errors.New("runtime: bad KV memory")

// kvRegions checks that kv describes memory of the right shape and size for
// numPages pages of g in layout (host or device addresses alike) and
// returns the regions with their needed lengths.
func kvRegions(g kvshape.Geometry, layout kvshape.Layout, numPages int, kv KVMemory) ([]Region, error) {
	switch layout {
	case kvshape.LayoutPerLayer:
		if kv.Cross != (Region{}) {
			return nil, fmt.Errorf("%w: Cross is set but the layout is per-layer (use Layers)", ErrKV)
		}
		if len(kv.Layers) != g.Layers {
			return nil, fmt.Errorf("%w: Layers has %d tensors, geometry has %d layers", ErrKV, len(kv.Layers), g.Layers)
		}
		need, err := g.TensorBytes(layout, numPages)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrKV, err)
		}
		out := make([]Region, g.Layers)
		for l, r := range kv.Layers {
			if r.Addr == 0 {
				return nil, fmt.Errorf("%w: Layers[%d]: nil address", ErrKV, l)
			}
			if r.LenBytes < need {
				return nil, fmt.Errorf("%w: Layers[%d]: %d bytes, %d pages need %d", ErrKV, l, r.LenBytes, numPages, need)
			}
			out[l] = Region{Addr: r.Addr, LenBytes: need}
		}
		return out, nil
	case kvshape.LayoutCrossLayer:
		if len(kv.Layers) != 0 {
			return nil, fmt.Errorf("%w: Layers is set but the layout is cross-layer (use Cross)", ErrKV)
		}
		need, err := g.TensorBytes(layout, numPages)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrKV, err)
		}
		if kv.Cross.Addr == 0 {
			return nil, fmt.Errorf("%w: Cross: nil address", ErrKV)
		}
		if kv.Cross.LenBytes < need {
			return nil, fmt.Errorf("%w: Cross: %d bytes, %d pages need %d", ErrKV, kv.Cross.LenBytes, numPages, need)
		}
		return []Region{{Addr: kv.Cross.Addr, LenBytes: need}}, nil
	}
	return nil, fmt.Errorf("%w: unknown layout %d", ErrKV, layout)
}

// moverRegions is regions as the mover takes them.
func moverRegions(regions []Region) []mover.Region {
	out := make([]mover.Region, len(regions))
	for i, r := range regions {
		out[i] = mover.Region(r)
	}
	return out
}

// HostKV is paged KV memory allocated off-heap (anonymous mmap) in a
// store's layout, for tests, benchmarks and the eval harness. Free it once
// after the store that registered it is closed.
type HostKV struct {
	g     kvshape.Geometry
	pages int
	bufs  []*uring.Buffer
	mem   KVMemory
	views *cpu.Views
}

// AllocHostKV allocates host KV memory for numPages pages of g in layout.
func AllocHostKV(g kvshape.Geometry, layout kvshape.Layout, numPages int) (*HostKV, error) {
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("allocating host KV: %w", err)
	}
	if numPages <= 0 {
		return nil, fmt.Errorf("allocating host KV: numPages %d", numPages)
	}
	h := &HostKV{g: g, pages: numPages}
	alloc := func(n int64) (Region, error) {
		b, err := uring.AllocBuffer(int(n))
		if err != nil {
			return Region{}, fmt.Errorf("allocating host KV (%d bytes): %w", n, err)
		}
		h.bufs = append(h.bufs, b)
		return Region{Addr: b.Addr(), LenBytes: int64(b.Len())}, nil
	}
	per, err := g.TensorBytes(layout, numPages)
	if err != nil {
		return nil, fmt.Errorf("allocating host KV: %w", err)
	}
	switch layout {
	case kvshape.LayoutPerLayer:
		for l := 0; l < g.Layers; l++ {
			r, err := alloc(per)
			if err != nil {
				h.Free()
				return nil, err
			}
			h.mem.Layers = append(h.mem.Layers, r)
		}
	case kvshape.LayoutCrossLayer:
		r, err := alloc(per)
		if err != nil {
			return nil, err
		}
		h.mem.Cross = r
	default:
		return nil, fmt.Errorf("allocating host KV: unknown layout %d", layout)
	}
	regions, err := kvRegions(g, layout, numPages, h.mem)
	if err != nil {
		h.Free()
		return nil, err
	}
	h.views = cpu.NewViews(g, layout, numPages, moverRegions(regions))
	return h, nil
}

// Memory describes h for Store.RegisterKV.
func (h *HostKV) Memory() KVMemory { return h.mem }

// Page returns the bytes of (layer, plane, page): a view valid until Free.
// It panics on an index out of range, like a slice.
func (h *HostKV) Page(layer, plane int, page int32) []byte {
	if layer < 0 || layer >= h.g.Layers || plane < 0 || plane >= h.g.Planes ||
		page < 0 || int(page) >= h.pages {
		panic(fmt.Sprintf("runtime: HostKV.Page(%d, %d, %d) out of range", layer, plane, page))
	}
	return h.views.Plane(layer, plane, page)
}

// Free unmaps the memory. Calling it twice is a no-op.
func (h *HostKV) Free() error {
	var first error
	for _, b := range h.bufs {
		if err := b.Free(); err != nil && first == nil {
			first = err
		}
	}
	h.bufs = nil
	h.views = nil
	return first
}
