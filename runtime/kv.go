package runtime

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/tutti-io/tutti/kvshape"
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

// kvViews are byte views over the registered host KV memory, built once at
// RegisterKV so the hot path only slices.
type kvViews struct {
	layout     kvshape.Layout
	layers     [][]byte         // per-layer layout: one view per layer
	cross      []byte           // cross-layer layout
	g          kvshape.Geometry // the layout rule: g.PlaneOffset
	planeBytes int64
	planes     int64 // planes of a page in an object (copyPages)
	numPages   int
}

// view makes a []byte over caller-owned memory that the GC does not manage.
func view(addr uintptr, n int64) []byte {
	// Converting through a pointer to the uintptr keeps vet's unsafeptr check
	// quiet: the memory is off-heap, so there is nothing for the GC to move.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// checkKV checks that kv describes memory of the right shape and size for
// numPages pages of g in layout (host or device addresses alike).
func checkKV(g kvshape.Geometry, layout kvshape.Layout, numPages int, kv KVMemory) error {
	_, err := kvRegions(g, layout, numPages, kv)
	return err
}

// kvRegions checks kv and returns the regions with their needed lengths.
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

func newKVViews(g kvshape.Geometry, layout kvshape.Layout, numPages int, kv KVMemory) (*kvViews, error) {
	regions, err := kvRegions(g, layout, numPages, kv)
	if err != nil {
		return nil, err
	}
	v := &kvViews{
		layout:     layout,
		g:          g,
		planeBytes: g.PageBytesPerPlane(),
		planes:     int64(g.Planes),
		numPages:   numPages,
	}
	if layout == kvshape.LayoutPerLayer {
		for _, r := range regions {
			v.layers = append(v.layers, view(r.Addr, r.LenBytes))
		}
	} else {
		v.cross = view(regions[0].Addr, regions[0].LenBytes)
	}
	return v, nil
}

// plane returns the bytes of (layer, plane, page). The caller has checked
// every index.
func (v *kvViews) plane(layer, plane int, page int32) []byte {
	off := v.g.PlaneOffset(v.layout, v.numPages, layer, plane, int(page))
	if v.layout == kvshape.LayoutPerLayer {
		return v.layers[layer][off : off+v.planeBytes]
	}
	return v.cross[off : off+v.planeBytes]
}

// copyPages moves the bytes [start, end) of one layer of consecutive chunks,
// laid out as objmap stores them (page-major, then plane), between buf
// (which holds exactly those bytes) and the engine's pages: pages[p] is the
// page id of the p-th page from the first chunk. toKV chooses the direction
// (restore: staging → KV; save: KV → staging). Planes may be cut at start and
// end; each part goes where it belongs.
func (v *kvViews) copyPages(layer int, pages []int32, start, end int64, buf []byte, toKV bool) {
	pb := v.planeBytes
	for u := start / pb; u*pb < end; u++ {
		plane := int(u % v.planes)
		kv := v.plane(layer, plane, pages[u/v.planes])
		us := u * pb
		lo, hi := max(us, start), min(us+pb, end)
		if toKV {
			copy(kv[lo-us:hi-us], buf[lo-start:hi-start])
		} else {
			copy(buf[lo-start:hi-start], kv[lo-us:hi-us])
		}
	}
}

// restorePages is copyPages toward the KV memory with each piece verified
// first: ver.Update sees the bytes [start, end) in order, one page plane at
// a time, and the piece is copied while it is still in the CPU's cache
// (verifying a whole segment, then copying it, reads it from memory twice).
// It stops at the first CRC error; the pieces before it were copied (a run
// that fails is a miss: its pages hold unspecified bytes).
func (v *kvViews) restorePages(layer int, pages []int32, start, end int64, buf []byte, ver chunkChecker) error {
	pb := v.planeBytes
	for u := start / pb; u*pb < end; u++ {
		us := u * pb
		lo, hi := max(us, start), min(us+pb, end)
		src := buf[lo-start : hi-start]
		if err := ver.Update(src); err != nil {
			return err
		}
		kv := v.plane(layer, int(u%v.planes), pages[u/v.planes])
		copy(kv[lo-us:hi-us], src)
	}
	return nil
}

// HostKV is paged KV memory allocated off-heap (anonymous mmap) in a
// store's layout, for tests, benchmarks and the eval harness. Free it once
// after the store that registered it is closed.
type HostKV struct {
	bufs  []*uring.Buffer
	mem   KVMemory
	views *kvViews
}

// AllocHostKV allocates host KV memory for numPages pages of g in layout.
func AllocHostKV(g kvshape.Geometry, layout kvshape.Layout, numPages int) (*HostKV, error) {
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("allocating host KV: %w", err)
	}
	if numPages <= 0 {
		return nil, fmt.Errorf("allocating host KV: numPages %d", numPages)
	}
	h := &HostKV{}
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
	v, err := newKVViews(g, layout, numPages, h.mem)
	if err != nil {
		h.Free()
		return nil, err
	}
	h.views = v
	return h, nil
}

// Memory describes h for Store.RegisterKV.
func (h *HostKV) Memory() KVMemory { return h.mem }

// Page returns the bytes of (layer, plane, page): a view valid until Free.
// It panics on an index out of range, like a slice.
func (h *HostKV) Page(layer, plane int, page int32) []byte {
	if layer < 0 || layer >= h.views.g.Layers || plane < 0 || plane >= h.views.g.Planes ||
		page < 0 || int(page) >= h.views.numPages {
		panic(fmt.Sprintf("runtime: HostKV.Page(%d, %d, %d) out of range", layer, plane, page))
	}
	return h.views.plane(layer, plane, page)
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
