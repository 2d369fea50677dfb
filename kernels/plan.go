package kernels

import (
	"fmt"

	"github.com/tutti-io/tutti/kvshape"
)

// Layout is how the engine's paged KV memory is arranged in HBM: kvshape's
// layouts, so one enum names them everywhere.
type Layout = kvshape.Layout

const (
	// LayoutPerLayer: one tensor per layer, [planes, num_pages, page_tokens, kv_heads, head_dim] (vLLM).
	LayoutPerLayer = kvshape.LayoutPerLayer
	// LayoutCrossLayer: one tensor [num_pages, layers, planes, page_tokens, kv_heads, head_dim].
	LayoutCrossLayer = kvshape.LayoutCrossLayer
)

// checkGeometry checks the shape is one the kernels can copy: the model's
// KV shape is kvshape.Geometry (its layout rules have their one home there;
// the chain block size does not matter to a kernel, which sees pages), held
// to 16-byte vectors and the C side's tensor table.
func checkGeometry(g kvshape.Geometry) error {
	if g.Layers <= 0 || g.Layers > maxLayers || g.Planes < 1 || g.Planes > 2 || g.PageTokens <= 0 || g.KVHeads <= 0 ||
		g.HeadDim <= 0 || g.DType.Bytes() <= 0 {
		return fmt.Errorf("geometry %+v: %w", g, ErrInvalid)
	}
	if g.PageBytesPerPlane()%16 != 0 {
		return fmt.Errorf("geometry %+v: plane of %d bytes is not a multiple of 16: %w", g, g.PageBytesPerPlane(), ErrInvalid)
	}
	return nil
}

const (
	maxLayers = 1024
	// StagingAlign is the alignment of every extent's place in a staging slot
	// and of every read length: O_DIRECT's 4 KiB (files of a smaller logical
	// block size divide it).
	StagingAlign = 4096
)

// Extent is part of one layer's object in a file: Pages consecutive pages of
// the request (object layout: page-major, planes of a page contiguous),
// starting at byte Offset of the file.
type Extent struct {
	FD    int32  // file descriptor, or registered file index when Fixed
	Fixed bool   // FD is an index into the ring's registered files
	Align uint32 // the file's O_DIRECT alignment (0: buffered); Offset must be a multiple
	// Offset is the byte offset of the extent's first page in the file.
	Offset int64
	Pages  int
}

// Request is one restore: request page i goes to engine page Pages[i]; layer
// FirstLayer+l is read from Layers[l], whose extents cover the request's pages
// in order. Every layer must split the pages into extents the same way (the
// object map stores every layer of a run alike), so one page map serves all.
type Request struct {
	FirstLayer int
	Pages      []int32
	Layers     [][]Extent
}

// ioEntry mirrors tk_io_entry (32 bytes).
type ioEntry struct {
	FD      int32
	Flags   uint32
	Offset  uint64
	Len     uint32
	SlotOff uint32
	MinLen  uint32
	_       uint32
}

const (
	ioFixedFile = 1
	ioWrite     = 2
	ioFixedBuf  = 4 // set by the Restorer when its staging slots are registered
)

// PageMap mirrors tk_page_map: request page i sits at SlotOff in a layer's
// staging slot (object layout) and goes to engine page DstPage; entries
// [FirstEntry, LastEntry] of its layer cover it.
type PageMap struct {
	DstPage, SlotOff, FirstEntry, LastEntry uint32
}

// Plan is a request turned into descriptors: EntriesPerLayer entries per
// layer (layer-major) and one page map shared by every layer.
type Plan struct {
	Entries         []ioEntry
	Pages           []PageMap
	EntriesPerLayer int
	// EntryExtent[e] is the request extent (index in a layer's extents)
	// that entry e of every layer reads: an extent's entries are
	// consecutive and never cover another extent.
	EntryExtent   []int32
	SlotBytesUsed int64 // bytes of a staging slot one layer occupies
	seen          []uint64
}

// checkPages refuses engine pages out of range or named twice (two request
// pages scattered to one engine page would race).
func (p *Plan) checkPages(pages []int32, numPages int) error {
	words := (numPages + 63) / 64
	if cap(p.seen) < words {
		p.seen = make([]uint64, words)
	}
	p.seen = p.seen[:words]
	defer func() {
		for _, pg := range pages {
			if pg >= 0 && int(pg) < numPages {
				p.seen[pg/64] = 0
			}
		}
	}()
	for i, pg := range pages {
		if pg < 0 || int(pg) >= numPages {
			return fmt.Errorf("request page %d -> engine page %d of %d: %w", i, pg, numPages, ErrInvalid)
		}
		bit := uint64(1) << (pg % 64)
		if p.seen[pg/64]&bit != 0 {
			return fmt.Errorf("request page %d: engine page %d appears twice: %w", i, pg, ErrInvalid)
		}
		p.seen[pg/64] |= bit
	}
	return nil
}

// Limits bound a plan: what the bound context has room for.
type Limits struct {
	Layers     int   // layers of the KV tensors
	NumPages   int   // engine pages
	MaxPages   int   // pages per request
	MaxEntries int   // entries per layer
	SlotBytes  int64 // staging slot size
	MaxIOBytes int   // largest single read (multiple of StagingAlign)
	// MaxRequests is how many restores may be live at once (Restore
	// refuses one more with ErrBusy until one is released); BuildPlan does
	// not read it.
	MaxRequests int
}

// BuildPlan checks req against g and lim and fills p (reusing its slices), so
// that no kernel launched from the plan can touch memory outside the KV
// tensors or the staging slot. It is pure CPU work and allocation-free once p
// has grown to the largest request.
func BuildPlan(g kvshape.Geometry, lim Limits, req Request, p *Plan) error {
	if err := checkGeometry(g); err != nil {
		return err
	}
	if lim.MaxIOBytes <= 0 || lim.MaxIOBytes%StagingAlign != 0 {
		return fmt.Errorf("max I/O %d bytes: not a positive multiple of %d: %w", lim.MaxIOBytes, StagingAlign, ErrInvalid)
	}
	n := len(req.Pages)
	if n == 0 || n > lim.MaxPages {
		return fmt.Errorf("request of %d pages (max %d): %w", n, lim.MaxPages, ErrInvalid)
	}
	if len(req.Layers) == 0 || req.FirstLayer < 0 || req.FirstLayer+len(req.Layers) > lim.Layers {
		return fmt.Errorf("layers [%d,+%d) of %d: %w", req.FirstLayer, len(req.Layers), lim.Layers, ErrInvalid)
	}
	if err := p.checkPages(req.Pages, lim.NumPages); err != nil {
		return err
	}
	pageBytes := g.PageBytesPerLayer()
	maxIO := int64(lim.MaxIOBytes)
	shape := req.Layers[0]
	// The page map and entry split, from layer 0's extents.
	p.Pages = p.Pages[:0]
	p.EntryExtent = p.EntryExtent[:0]
	epl := 0
	var slotOff int64
	page := 0
	for k, x := range shape {
		if x.Pages <= 0 {
			return fmt.Errorf("layer %d extent %d: %d pages: %w", req.FirstLayer, k, x.Pages, ErrInvalid)
		}
		if page+x.Pages > n {
			return fmt.Errorf("layer %d extents cover more than the request's %d pages: %w", req.FirstLayer, n, ErrInvalid)
		}
		bytes := int64(x.Pages) * pageBytes
		readBytes := roundUp(bytes, StagingAlign)
		for i := 0; i < x.Pages; i++ {
			in := int64(i) * pageBytes
			p.Pages = append(p.Pages, PageMap{
				DstPage:    uint32(req.Pages[page+i]),
				SlotOff:    uint32(slotOff + in),
				FirstEntry: uint32(int64(epl) + in/maxIO),
				LastEntry:  uint32(int64(epl) + (in+pageBytes-1)/maxIO),
			})
		}
		for e := int64(0); e < (readBytes+maxIO-1)/maxIO; e++ {
			p.EntryExtent = append(p.EntryExtent, int32(k))
		}
		epl += int((readBytes + maxIO - 1) / maxIO)
		slotOff += readBytes
		page += x.Pages
		if slotOff > lim.SlotBytes || slotOff >= 1<<32 {
			return fmt.Errorf("layer objects of %d bytes exceed the %d-byte staging slot: %w", slotOff, lim.SlotBytes, ErrInvalid)
		}
	}
	if page != n {
		return fmt.Errorf("layer %d extents cover %d of the request's %d pages: %w", req.FirstLayer, page, n, ErrInvalid)
	}
	if epl > lim.MaxEntries {
		return fmt.Errorf("%d entries per layer (max %d): %w", epl, lim.MaxEntries, ErrInvalid)
	}
	p.EntriesPerLayer = epl
	p.SlotBytesUsed = slotOff
	p.Entries = p.Entries[:0]
	for l, xs := range req.Layers {
		if len(xs) != len(shape) {
			return fmt.Errorf("layer %d has %d extents, layer %d has %d: %w", req.FirstLayer+l, len(xs), req.FirstLayer, len(shape), ErrInvalid)
		}
		slotOff = 0
		for k, x := range xs {
			if x.Pages != shape[k].Pages {
				return fmt.Errorf("layer %d extent %d: %d pages, layer %d's has %d: %w", req.FirstLayer+l, k, x.Pages, req.FirstLayer, shape[k].Pages, ErrInvalid)
			}
			if x.FD < 0 || x.Offset < 0 {
				return fmt.Errorf("layer %d extent %d: fd %d offset %d: %w", req.FirstLayer+l, k, x.FD, x.Offset, ErrInvalid)
			}
			if x.Align != 0 && (StagingAlign%x.Align != 0 || x.Offset%int64(x.Align) != 0) {
				return fmt.Errorf("layer %d extent %d: offset %d not aligned to the file's %d bytes: %w", req.FirstLayer+l, k, x.Offset, x.Align, ErrInvalid)
			}
			bytes := int64(x.Pages) * pageBytes
			readBytes := roundUp(bytes, StagingAlign)
			var flags uint32
			if x.Fixed {
				flags = ioFixedFile
			}
			for off := int64(0); off < readBytes; off += maxIO {
				ln := min(maxIO, readBytes-off)
				need := min(ln, bytes-off) // bytes past the object are padding
				p.Entries = append(p.Entries, ioEntry{FD: x.FD, Flags: flags, Offset: uint64(x.Offset + off),
					Len: uint32(ln), SlotOff: uint32(slotOff + off), MinLen: uint32(need)})
			}
			slotOff += readBytes
		}
	}
	return nil
}

func roundUp(v, a int64) int64 { return (v + a - 1) / a * a }
