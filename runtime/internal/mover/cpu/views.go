package cpu

import (
	"unsafe"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/mover"
)

// Views are byte views over host KV memory, built once when it is bound so
// the hot path only slices.
type Views struct {
	layout     kvshape.Layout
	layers     [][]byte         // per-layer layout: one view per layer
	cross      []byte           // cross-layer layout
	g          kvshape.Geometry // the layout rule: g.PlaneOffset
	planeBytes int64
	planes     int64 // planes of a page in an object (CopyPages)
	numPages   int
}

// View makes a []byte over caller-owned memory that the GC does not manage.
func View(addr uintptr, n int64) []byte {
	// Converting through a pointer to the uintptr keeps vet's unsafeptr check
	// quiet: the memory is off-heap, so there is nothing for the GC to move.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// NewViews views kv, host memory of numPages pages of g in layout: one
// region per layer, or one cross-layer region, each at least as long as
// the pages need (the caller checked them: runtime's KVMemory rules).
func NewViews(g kvshape.Geometry, layout kvshape.Layout, numPages int, kv []mover.Region) *Views {
	v := &Views{
		layout:     layout,
		g:          g,
		planeBytes: g.PageBytesPerPlane(),
		planes:     int64(g.Planes),
		numPages:   numPages,
	}
	if layout == kvshape.LayoutPerLayer {
		for _, r := range kv {
			v.layers = append(v.layers, View(r.Addr, r.LenBytes))
		}
	} else {
		v.cross = View(kv[0].Addr, kv[0].LenBytes)
	}
	return v
}

// Plane returns the bytes of (layer, plane, page). The caller has checked
// every index.
func (v *Views) Plane(layer, plane int, page int32) []byte {
	off := v.g.PlaneOffset(v.layout, v.numPages, layer, plane, int(page))
	if v.layout == kvshape.LayoutPerLayer {
		return v.layers[layer][off : off+v.planeBytes]
	}
	return v.cross[off : off+v.planeBytes]
}

// CopyPages moves the bytes [start, end) of one layer of consecutive
// chunks, laid out as objmap stores them (page-major, then plane), between
// buf (which holds exactly those bytes) and the engine's pages: pages[p] is
// the page id of the p-th page from the first chunk. toKV chooses the
// direction (restore: staging → KV; save: KV → staging). Planes may be cut
// at start and end; each part goes where it belongs.
func (v *Views) CopyPages(layer int, pages []int32, start, end int64, buf []byte, toKV bool) {
	pb := v.planeBytes
	for u := start / pb; u*pb < end; u++ {
		plane := int(u % v.planes)
		kv := v.Plane(layer, plane, pages[u/v.planes])
		us := u * pb
		lo, hi := max(us, start), min(us+pb, end)
		if toKV {
			copy(kv[lo-us:hi-us], buf[lo-start:hi-start])
		} else {
			copy(buf[lo-start:hi-start], kv[lo-us:hi-us])
		}
	}
}

// chunkChecker takes a segment's payload bytes in order (a chunk verifier
// of a whole read, the piece CRCs of a split one).
type chunkChecker interface {
	Update(p []byte) error
}

// restorePages is CopyPages toward the KV memory with each piece verified
// first: ver.Update sees the bytes [start, end) in order, one page plane at
// a time, and the piece is copied while it is still in the CPU's cache
// (verifying a whole segment, then copying it, reads it from memory twice).
// It stops at the first CRC error; the pieces before it were copied (a run
// that fails is a miss: its pages hold unspecified bytes).
func (v *Views) restorePages(layer int, pages []int32, start, end int64, buf []byte, ver chunkChecker) error {
	pb := v.planeBytes
	for u := start / pb; u*pb < end; u++ {
		us := u * pb
		lo, hi := max(us, start), min(us+pb, end)
		src := buf[lo-start : hi-start]
		if err := ver.Update(src); err != nil {
			return err
		}
		kv := v.Plane(layer, int(u%v.planes), pages[u/v.planes])
		copy(kv[lo-us:hi-us], src)
	}
	return nil
}

// checkPages is restorePages for a read that went to the pages: ver sees
// the bytes [start, end) of layer in order, where they landed.
func (v *Views) checkPages(layer int, pages []int32, start, end int64, ver chunkChecker) error {
	pb := v.planeBytes
	for u := start / pb; u*pb < end; u++ {
		us := u * pb
		lo, hi := max(us, start), min(us+pb, end)
		kv := v.Plane(layer, int(u%v.planes), pages[u/v.planes])
		if err := ver.Update(kv[lo-us : hi-us]); err != nil {
			return err
		}
	}
	return nil
}
