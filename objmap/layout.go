package objmap

import (
	"fmt"

	"github.com/tutti-io/tutti/kvshape"
)

// Placement: the one home of where a run's bytes lie. Every reader and
// writer of a run's objects (the runtime's CPU and GPU paths, its save
// pipeline, recovery, fsck, gpubench, and engines connected to a node's
// service, which build the service's Layout from its hello) asks a Layout;
// nothing else composes a file offset.
//
// A store has Dirs directories (one per device), FilesPerDir pool files in
// each (pool file f lies in directory f % Dirs), and a run width W, a
// divisor of Dirs fixed at creation (the manifest's run_width). The pool
// files form stripe groups of W files, one in each of W consecutive
// directories: group (k, s) is files k*Dirs + s*W ... k*Dirs + s*W + W-1.
// The allocator hands out extents of a group (a "space"): the same byte
// range [Offset, Offset+RunBytes) in each of its W files. A run's home file
// (RunInfo.File) is the group file holding its header and chunk table, at
// Offset; the allocator rotates the home over the group's files, run by
// run. Object l (layer l of the whole run) lies in the group file at
// position (home + l) mod W, in slot l / W of that file's extent:
//
//	file:   group base + (home + l) mod W      (device: file % Dirs)
//	offset: Offset + HeaderRegionBytes(chunks) + (l / W) * ObjectStride(chunks)
//	        + chunk * ChunkBytesPerLayer        (chunk c of the object)
//
// So a run's layers lie on all W devices, Layers/W objects on each (one
// more on Layers mod W of them), and a restore of any leading chunks of
// any run reads the same bytes from each device to within one object,
// still one read per (layer, run) on each device, as does a save's
// writes. Every file of the group keeps ceil(Layers/W) object slots and
// the header region (used only in the home file), so the extent is the
// same in all of them. With W = 1 (every store before manifest version 3,
// and any single-directory store) a run lies whole in its home file: the
// original layout, byte for byte.

// Layout is a store's placement rule (see above). The zero value is not
// usable; a Layout is immutable and safe to share.
type Layout struct {
	g           kvshape.Geometry
	dirs        int
	filesPerDir int
	width       int
	// devs[f] is the device of each layer of a run whose home is pool file
	// f (LayerDevices): files × Layers ints, shared.
	devs [][]int
}

// maxSlotWaste is the object slots a run width may leave empty beyond the
// layers, as a fraction: W·ceil(Layers/W) ≤ Layers·(1 + 1/maxSlotWaste).
const maxSlotWaste = 3

// RunWidth is the run width a new store of layers layers over dirs
// directories gets: the largest divisor W of dirs with W ≤ layers whose
// empty object slots (W·ceil(layers/W) − layers, pool space a run holds
// and never writes) stay within a third of the layers. Real models over a
// few devices get W = dirs (32 layers over 8 devices: 4 each; DeepSeek-V3's
// 61: 8 or 7, 3 slots empty; 28 over 8: 4 empty); a shape with fewer layers
// than directories spreads over fewer.
func RunWidth(layers, dirs int) int {
	best := 1
	for w := 2; w <= dirs; w++ {
		if widthFits(w, layers, dirs) {
			best = w
		}
	}
	return best
}

// widthFits says whether a run width of w > 1 suits layers layers over
// dirs directories (RunWidth's rule).
func widthFits(w, layers, dirs int) bool {
	slots := w * ((layers + w - 1) / w)
	return w <= layers && dirs%w == 0 && (slots-layers)*maxSlotWaste <= layers
}

// NewLayout is the layout of a store of g over dirs directories of
// filesPerDir pool files each whose runs spread over width devices (0:
// RunWidth(g.Layers, dirs)).
func NewLayout(g kvshape.Geometry, dirs, filesPerDir, width int) (Layout, error) {
	if err := checkGeometry(g); err != nil {
		return Layout{}, err
	}
	if width == 0 {
		width = RunWidth(g.Layers, dirs)
	}
	switch {
	case dirs < 1 || dirs > maxDirs || filesPerDir < 1 || filesPerDir > maxFilesPerDir:
		return Layout{}, fmt.Errorf("objmap: layout of %d directories of %d files (want 1..%d of 1..%d)", dirs, filesPerDir, maxDirs, maxFilesPerDir)
	case width != 1 && (width < 1 || !widthFits(width, g.Layers, dirs)):
		return Layout{}, fmt.Errorf("objmap: run width %d over %d directories of a %d-layer geometry (want 1 or a divisor of the directories, at most the layers, that leaves at most a third of them in empty object slots)", width, dirs, g.Layers)
	}
	lay := Layout{g: g, dirs: dirs, filesPerDir: filesPerDir, width: width, devs: make([][]int, dirs*filesPerDir)}
	for f := range lay.devs {
		d := make([]int, g.Layers)
		for l := range d {
			d[l] = lay.Device(lay.layerFile(f, l))
		}
		lay.devs[f] = d
	}
	return lay, nil
}

// Geometry is the KV shape the layout places.
func (lay Layout) Geometry() kvshape.Geometry { return lay.g }

// Dirs is the store's directories (devices).
func (lay Layout) Dirs() int { return lay.dirs }

// Width is the devices one run spreads over.
func (lay Layout) Width() int { return lay.width }

// FilesPerDir is the pool files in each directory.
func (lay Layout) FilesPerDir() int { return lay.filesPerDir }

// Files is the pool files (Map.Files' length).
func (lay Layout) Files() int { return lay.dirs * lay.filesPerDir }

// Device is the directory (device) pool file lies in.
func (lay Layout) Device(file int) int { return file % lay.dirs }

// Slots is the object slots a run's extent holds in each of its files:
// ceil(Layers / Width).
func (lay Layout) Slots() int { return (lay.g.Layers + lay.width - 1) / lay.width }

// RunBytes is the extent a run of chunks chunks takes in each of the
// Width files it spans (at the same offset in each): the header region and
// Slots object strides.
func (lay Layout) RunBytes(chunks int) int64 {
	return HeaderRegionBytes(lay.g, chunks) + int64(lay.Slots())*ObjectStride(lay.g, chunks)
}

// SlotFill is the share of a run's object slots its layers fill:
// Layers / (Width × Slots), 1 where Width divides Layers. The rest of the
// slots are pool space a run holds and never writes.
func (lay Layout) SlotFill() float64 {
	return float64(lay.g.Layers) / float64(lay.width*lay.Slots())
}

// Footprint is the pool bytes a run of chunks chunks takes in all:
// Width × RunBytes.
func (lay Layout) Footprint(chunks int) int64 { return int64(lay.width) * lay.RunBytes(chunks) }

// ChunksThatFit is the largest chunk count whose run fits an extent of
// extentBytes in each of its files (capped at MaxRunChunks), 0 if not even
// one chunk fits.
func (lay Layout) ChunksThatFit(extentBytes int64) int {
	lo, hi := 0, MaxRunChunks(lay.g)
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if lay.RunBytes(mid) <= extentBytes {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// Place is where the allocator put a run: its home pool file (header and
// chunk table), the offset of its extent (the same in every file it
// spans) and its chunks. RunInfo.Place and Reservation.Place give it.
type Place struct {
	File   int
	Offset int64
	Chunks int
}

// Place is where r lies.
func (r *RunInfo) Place() Place { return Place{File: r.File, Offset: r.Offset, Chunks: len(r.Chain)} }

// Place is where r lies.
func (r Reservation) Place() Place { return Place{File: r.File, Offset: r.Offset, Chunks: r.Chunks} }

// Location is a byte of a pool file: Offset in pool file File, which lies
// on device Device.
type Location struct {
	Device int
	File   int
	Offset int64
}

// Where is where chunk chunk of layer layer of the run at p starts (its
// ChunkBytesPerLayer bytes follow): the placement rule itself.
func (lay Layout) Where(p Place, layer, chunk int) (Location, error) {
	if err := lay.checkPlace(p); err != nil {
		return Location{}, err
	}
	switch {
	case layer < 0 || layer >= lay.g.Layers:
		return Location{}, fmt.Errorf("objmap: layer %d of %d: %w", layer, lay.g.Layers, kvshape.ErrOutOfRange)
	case chunk < 0 || chunk >= p.Chunks:
		return Location{}, fmt.Errorf("objmap: chunk %d of a run of %d: %w", chunk, p.Chunks, kvshape.ErrOutOfRange)
	}
	f := lay.layerFile(p.File, layer)
	off := p.Offset + HeaderRegionBytes(lay.g, p.Chunks) + int64(layer/lay.width)*ObjectStride(lay.g, p.Chunks) +
		int64(chunk)*lay.g.ChunkBytesPerLayer()
	return Location{Device: lay.Device(f), File: f, Offset: off}, nil
}

// Span gives the one read that restores chunks [first, first+k) of layer
// of the run at p: only those chunks' bytes rounded out to BlockBytes,
// never the whole object, in the file Where puts the layer.
func (lay Layout) Span(p Place, layer, first, k int) (Span, error) {
	if first < 0 || k < 1 || first > p.Chunks-k {
		return Span{}, fmt.Errorf("objmap: chunks [%d,+%d) of a run of %d: %w", first, k, p.Chunks, kvshape.ErrOutOfRange)
	}
	obj, err := lay.Where(p, layer, 0)
	if err != nil {
		return Span{}, err
	}
	cb := lay.g.ChunkBytesPerLayer()
	start := int64(first) * cb
	end := start + int64(k)*cb
	aStart := start &^ (BlockBytes - 1)
	return Span{Layer: layer, First: first, K: k, Device: obj.Device, File: obj.File, Off: obj.Offset + aStart,
		IOBytes: alignUp(end) - aStart, Skip: start - aStart, DataBytes: end - start, ChunkBytes: cb}, nil
}

// LayerDevices is the device of each layer of a run whose home is pool
// file file (shared: read-only). It depends on nothing else of the run.
func (lay Layout) LayerDevices(file int) []int { return lay.devs[file] }

// RunFiles appends to dst the pool files a run whose home is file spans
// (its stripe group, home first).
func (lay Layout) RunFiles(file int, dst []int) []int {
	for j := range lay.width {
		dst = append(dst, lay.groupFile(file, j))
	}
	return dst
}

func (lay Layout) checkPlace(p Place) error {
	if p.File < 0 || p.File >= lay.Files() || p.Offset < 0 || p.Offset%BlockBytes != 0 || p.Chunks < 1 || p.Chunks > MaxRunChunks(lay.g) {
		return fmt.Errorf("objmap: run at file %d offset %d of %d chunks (pool of %d files, at most %d chunks): %w",
			p.File, p.Offset, p.Chunks, lay.Files(), MaxRunChunks(lay.g), kvshape.ErrOutOfRange)
	}
	return nil
}

// layerFile is the pool file of layer l of a run whose home is file.
func (lay Layout) layerFile(file, l int) int { return lay.groupFile(file, l%lay.width) }

// groupFile is the pool file j places after file in file's stripe group
// (cyclically).
func (lay Layout) groupFile(file, j int) int {
	pos := file % lay.width
	return file - pos + (pos+j)%lay.width
}

// space is the allocator's space (stripe group) of pool file file: the
// groups are numbered file / Width (the files of a group are consecutive).
func (lay Layout) space(file int) int { return file / lay.width }

// spaces is the stripe groups of the pool.
func (lay Layout) spaces() int { return lay.Files() / lay.width }

// homeFile is the pool file at position pos of space s.
func (lay Layout) homeFile(s, pos int) int { return s*lay.width + pos }
