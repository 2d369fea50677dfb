package kvshape

import (
	"errors"
	"fmt"
)

// Layout is how the engine's paged KV memory is arranged. The values are
// the kernels' layout codes (the C ABI's are one more: 0 is unset there).
type Layout uint8

const (
	// LayoutPerLayer is vLLM's: one tensor per layer, shaped
	// [planes, num_pages, page_tokens, kv_heads, head_dim].
	LayoutPerLayer Layout = iota
	// LayoutCrossLayer is one tensor for all layers, shaped
	// [num_pages, layers, planes, page_tokens, kv_heads, head_dim]: a page's
	// planes of one layer are adjacent (one copy of PageBytesPerLayer).
	LayoutCrossLayer
)

func (l Layout) String() string {
	switch l {
	case LayoutPerLayer:
		return "per-layer"
	case LayoutCrossLayer:
		return "cross-layer"
	}
	return fmt.Sprintf("Layout(%d)", uint8(l))
}

// ErrOutOfRange is wrapped when a layer, plane, page or chunk index is out
// of range (objmap wraps it for indices into a run too).
var ErrOutOfRange = errors.New("kvshape: index out of range")

// TensorBytes is the size of one KV tensor for numPages pages: per layer for
// LayoutPerLayer (there are Layers of them), the whole cache for
// LayoutCrossLayer (there is one).
func (g Geometry) TensorBytes(layout Layout, numPages int) (int64, error) {
	if numPages < 1 {
		return 0, fmt.Errorf("kvshape: tensor of %d pages: %w", numPages, ErrOutOfRange)
	}
	switch layout {
	case LayoutPerLayer:
		return int64(numPages) * g.PageBytesPerLayer(), nil
	case LayoutCrossLayer:
		return int64(numPages) * int64(g.Layers) * g.PageBytesPerLayer(), nil
	}
	return 0, fmt.Errorf("kvshape: unknown layout %d", layout)
}

// PageOffset is the byte offset of (layer, plane, page) in the engine's KV
// memory: inside layer's own tensor for LayoutPerLayer, inside the single
// tensor for LayoutCrossLayer. The span [off, off+PageBytesPerPlane) holds
// that page of that plane. Every index is checked; an error names the bad one.
func (g Geometry) PageOffset(layout Layout, numPages, layer, plane, page int) (int64, error) {
	if layer < 0 || layer >= g.Layers {
		return 0, fmt.Errorf("kvshape: layer %d of %d: %w", layer, g.Layers, ErrOutOfRange)
	}
	if plane < 0 || plane >= g.Planes {
		return 0, fmt.Errorf("kvshape: plane %d of %d: %w", plane, g.Planes, ErrOutOfRange)
	}
	if page < 0 || page >= numPages {
		return 0, fmt.Errorf("kvshape: page id %d of %d pages: %w", page, numPages, ErrOutOfRange)
	}
	if layout != LayoutPerLayer && layout != LayoutCrossLayer {
		return 0, fmt.Errorf("kvshape: unknown layout %d", layout)
	}
	return g.PlaneOffset(layout, numPages, layer, plane, page), nil
}

// PlaneOffset is PageOffset without its checks, for loops over indices the
// caller has checked once (0 <= layer < Layers, 0 <= plane < Planes,
// 0 <= page < numPages, layout one of the two); anything else gives a
// meaningless offset. It is the one statement of the engine's KV layout:
// the kernels' plane_ptr and Python's Geometry.page_offset are held to it.
func (g Geometry) PlaneOffset(layout Layout, numPages, layer, plane, page int) int64 {
	pp := g.PageBytesPerPlane()
	if layout == LayoutPerLayer {
		return (int64(plane)*int64(numPages) + int64(page)) * pp
	}
	return ((int64(page)*int64(g.Layers)+int64(layer))*int64(g.Planes) + int64(plane)) * pp
}
