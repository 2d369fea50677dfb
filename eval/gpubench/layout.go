package gpubench

// Where tutti gpubench puts the prefix on its devices (--stripe,
// --run-pages): every read path of gpubench asks a benchLayout for the
// pieces of a layer's object and reads those, so all paths read the same
// bytes from the same places.

import (
	"fmt"
	"slices"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
)

// Stripes of --stripe.
const (
	// StripeRuns lays the prefix out as the object store does: the pages
	// are cut into runs of consecutive pages, each run placed by
	// objmap.Layout (the store's placement rule, asked here as the store
	// asks it) for a store over D directories: a run's layers spread over
	// the devices, layer l of run r on device (r + l) mod D, its objects
	// after the run's header region (which gpubench does not read).
	StripeRuns = "runs"
	// StripeRunsOneDevice is StripeRuns in a store of run width 1 (a store
	// made before objmap's manifest version 3): run r whole on device r%D
	// (kept for A/B runs).
	StripeRunsOneDevice = "runs-one-device"
	// StripeLayers is gpubench's layout before the runs: layer l's whole
	// object on device l%D at (l/D)*objStride (kept for A/B runs).
	StripeLayers = "layers"
)

// benchLayout places each layer's object bytes (page-major, planes of a
// page together: what testkit.FillObject writes) on D devices. A value is
// immutable once built by newBenchLayout.
type benchLayout struct {
	stripe    string
	devices   int
	layers    int
	pages     int   // pages of the prefix
	pageBytes int64 // one page of one layer, all planes
	// runPages: StripeRuns: pages per run (the last run may hold fewer);
	// StripeLayers: pages (a layer's object is one piece).
	runPages int
	// store and runs: the runs' places in a store over the devices, one
	// pool file per device (StripeRuns, StripeRunsOneDevice).
	store objmap.Layout
	runs  []objmap.Place
}

// layoutPiece is part of one layer's object on one device: request pages
// [first, first+pages), their bytes at file offset off (4 KiB aligned) of
// device dev, padded to 4 KiB on the device.
type layoutPiece struct {
	dev, first, pages int
	off               int64
}

// maxRunPages is the most pages one run of the store may hold.
func maxRunPages(shape kvshape.Geometry) int { return objmap.MaxRunChunks(shape) * shape.ChunkPages }

// defaultRunPages is the run length of --run-pages 0: the fewest runs per
// device (k) that keep every run within maxRun pages, runs of
// ceil(pages/(devices*k)) pages rounded up to whole chain blocks of
// chunkPages (the store saves whole blocks), so that every device holds
// the same number of runs when the pages divide evenly.
func defaultRunPages(pages, devices, maxRun, chunkPages int) int {
	k := max(1, ceilDiv(pages, devices*maxRun)) // ceil(p/(D*k)) <= M  <=>  p <= M*D*k
	return roundUpInt(ceilDiv(pages, devices*k), chunkPages)
}

func ceilDiv(a, b int) int    { return (a + b - 1) / b }
func roundUpInt(a, b int) int { return ceilDiv(a, b) * b }
func alignBlock(n int64) int64 {
	return (n + objmap.BlockBytes - 1) / objmap.BlockBytes * objmap.BlockBytes
}

// newBenchLayout checks --stripe and --run-pages (0: defaultRunPages) for
// pages pages of shape over devices devices; errors name the flag.
func newBenchLayout(shape kvshape.Geometry, pages, devices int, stripe string, runPages int) (benchLayout, error) {
	if err := shape.Validate(); err != nil {
		return benchLayout{}, err
	}
	if pages < 1 || devices < 1 {
		return benchLayout{}, fmt.Errorf("layout of %d pages over %d devices", pages, devices)
	}
	lay := benchLayout{stripe: stripe, devices: devices, layers: shape.Layers, pages: pages, pageBytes: shape.PageBytesPerLayer()}
	switch stripe {
	case StripeLayers:
		if runPages != 0 {
			return benchLayout{}, fmt.Errorf("--run-pages %d: runs are laid out only with --stripe %s", runPages, StripeRuns)
		}
		lay.runPages = pages
	case StripeRuns, StripeRunsOneDevice:
		maxRun := maxRunPages(shape)
		switch {
		case runPages == 0:
			lay.runPages = defaultRunPages(pages, devices, maxRun, shape.ChunkPages)
		case runPages < 0 || runPages > maxRun || runPages%shape.ChunkPages != 0:
			return benchLayout{}, fmt.Errorf("--run-pages %d: want a multiple of the %d pages of a chain block, 1..%d (%d chunks, the most a run of %d layers holds; 0: the default)",
				runPages, shape.ChunkPages, maxRun, objmap.MaxRunChunks(shape), shape.Layers)
		default:
			lay.runPages = runPages
		}
		if err := lay.placeRuns(shape); err != nil {
			return benchLayout{}, err
		}
	default:
		return benchLayout{}, fmt.Errorf("--stripe %q: want %s, %s or %s", stripe, StripeRuns, StripeRunsOneDevice, StripeLayers)
	}
	return lay, nil
}

// placeRuns places the runs as a fresh store of shape over the devices
// (one pool file each) allocates them, one after another: run r's home is
// pool file r%D (the allocator's round-robin), its extent next in its
// stripe group, each run of its own length (a short last run holds
// ceil(pages/ChunkPages) chunks).
func (p *benchLayout) placeRuns(shape kvshape.Geometry) error {
	width := 0
	if p.stripe == StripeRunsOneDevice {
		width = 1
	}
	store, err := objmap.NewLayout(shape, p.devices, 1, width)
	if err != nil {
		return err
	}
	p.store = store
	next := map[int]int64{} // per stripe group (its first file): the next free offset
	for r := 0; r*p.runPages < p.pages; r++ {
		n := min(p.runPages, p.pages-r*p.runPages)
		chunks := ceilDiv(n, shape.ChunkPages)
		home := r % p.devices
		group := store.RunFiles(home, nil)
		key := slices.Min(group)
		p.runs = append(p.runs, objmap.Place{File: home, Offset: next[key], Chunks: chunks})
		next[key] += store.RunBytes(chunks)
	}
	return nil
}

// piecesPerLayer is how many pieces every layer's object is cut into: the
// runs (StripeRuns) or 1 (StripeLayers); the GPU path's extents per layer.
func (p benchLayout) piecesPerLayer() int { return ceilDiv(p.pages, p.runPages) }

// objStride is the device bytes of one object of n pages: its bytes padded
// to 4 KiB (kvshape.Geometry.ObjectStride for whole chunks).
func (p benchLayout) objStride(n int) int64 { return alignBlock(int64(n) * p.pageBytes) }

// pieces appends layer l's pieces to dst, in page order. Every layer is
// cut alike (kernels.Request wants that); only dev and off differ.
func (p benchLayout) pieces(l int, dst []layoutPiece) []layoutPiece {
	if p.stripe == StripeLayers {
		return append(dst, layoutPiece{dev: l % p.devices, off: int64(l/p.devices) * p.objStride(p.pages), first: 0, pages: p.pages})
	}
	for r, place := range p.runs {
		first := r * p.runPages
		loc, err := p.store.Where(place, l, 0)
		if err != nil {
			panic(fmt.Sprintf("gpubench: run %d layer %d: %v", r, l, err)) // placeRuns placed it
		}
		dst = append(dst, layoutPiece{dev: loc.Device, off: loc.Offset, first: first, pages: min(p.runPages, p.pages-first)})
	}
	return dst
}

// slotOffsets are where each piece of a layer lands in the layer's staging
// slot (the same for every layer): pieces in page order, each starting on a
// 4 KiB boundary, as kernels.BuildPlan places extents. slotBytes is the
// slot bytes they take. Pieces of whole 4 KiB blocks (any 70B-like shape;
// an even run length of MLA's 18 KiB pages) leave no gaps: the slot then
// holds the layer's object bytes exactly in page order.
func (p benchLayout) slotOffsets() (offs []int64, slotBytes int64) {
	for _, pc := range p.pieces(0, nil) {
		offs = append(offs, slotBytes)
		slotBytes += p.objStride(pc.pages)
	}
	return offs, slotBytes
}

// pageMap is the host page map of the staging paths: request page i goes
// to engine page dst[i] and sits in the slot where slotOffsets put it.
func (p benchLayout) pageMap(dst []int32) []kernels.PageMap {
	offs, _ := p.slotOffsets()
	pm := make([]kernels.PageMap, 0, p.pages)
	for k, pc := range p.pieces(0, nil) {
		for j := 0; j < pc.pages; j++ {
			i := pc.first + j
			pm = append(pm, kernels.PageMap{DstPage: uint32(dst[i]), SlotOff: uint32(offs[k] + int64(j)*p.pageBytes)})
		}
	}
	return pm
}

// devBytes is the bytes written on each device: up to the end of its last
// object, padding included (what writeData writes and a reused data file
// must hold; the ceiling reads these bytes' whole MiBs).
func (p benchLayout) devBytes() []int64 {
	out := make([]int64, p.devices)
	var ps []layoutPiece
	for l := 0; l < p.layers; l++ {
		ps = p.pieces(l, ps[:0])
		for _, pc := range ps {
			out[pc.dev] = max(out[pc.dev], pc.off+p.objStride(pc.pages))
		}
	}
	return out
}

// objRead is one read of part of a layer's object: len bytes at off of
// device dev into the layer's staging slot at slot; need of them are the
// object's (the rest, if any, is the 4 KiB padding after a piece).
type objRead struct {
	dev       int
	off, slot int64
	len, need int
}

// reads appends the reads of layer l, pieces in page order, each piece cut
// into reads of at most maxIO bytes: padded to 4 KiB (O_DIRECT) or exactly
// the object's bytes (buffered, padded false).
func (p benchLayout) reads(l int, maxIO int64, padded bool, dst []objRead) []objRead {
	offs, _ := p.slotOffsets()
	for k, pc := range p.pieces(l, nil) {
		bytes := int64(pc.pages) * p.pageBytes
		read := bytes
		if padded {
			read = p.objStride(pc.pages)
		}
		for o := int64(0); o < read; o += maxIO {
			n := min(maxIO, read-o)
			dst = append(dst, objRead{dev: pc.dev, off: pc.off + o, slot: offs[k] + o, len: int(n), need: int(min(n, bytes-o))})
		}
	}
	return dst
}

// String is the layout in the header line, e.g. "runs of 512 pages striped
// over 4 devices, 1 per device; 32.0 MiB per layer piece".
func (p benchLayout) String() string {
	devs := fmt.Sprintf("%d devices", p.devices)
	if p.devices == 1 {
		devs = "1 device"
	}
	mib := float64(int64(p.runPages)*p.pageBytes) / (1 << 20)
	if p.stripe == StripeLayers {
		return fmt.Sprintf("layers striped over %s (layer l on device l%%%d), %s per device; %.1f MiB per layer piece",
			devs, p.devices, perDevice(p.layers, p.devices), mib)
	}
	runs := p.piecesPerLayer()
	last := ""
	if n := p.pages - (runs-1)*p.runPages; n != p.runPages {
		last = fmt.Sprintf(" (the last %d)", n)
	}
	if w := p.store.Width(); w > 1 {
		return fmt.Sprintf("runs of %d pages%s spread over %s (layer l of run r on device (r+l)%%%d), %d runs; %.1f MiB per layer piece",
			p.runPages, last, devs, w, runs, mib)
	}
	return fmt.Sprintf("runs of %d pages%s striped over %s, %s per device; %.1f MiB per layer piece",
		p.runPages, last, devs, perDevice(runs, p.devices), mib)
}

// perDevice says how many of n things round-robin over d devices each gets.
func perDevice(n, d int) string {
	lo, hi := n/d, ceilDiv(n, d)
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d or %d", lo, hi)
}

// jsonRunPages is run_pages of a --json row: pages per run, 0 with
// --stripe layers (no runs: a layer's object is one piece).
func (p benchLayout) jsonRunPages() int {
	if p.stripe == StripeLayers {
		return 0
	}
	return p.runPages
}
