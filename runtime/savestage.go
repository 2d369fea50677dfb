package runtime

// A Save's staging: writes are staged in write buffers carved from the
// staging slots the save holds (a slot is far larger than one write), and
// gathered and checksummed by a pool of stage workers shared by the store's
// saves, so that copies, CRCs and writes to every device overlap.

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/sched"
	"github.com/tutti-io/tutti/uring"
)

// wbuf is one save write's staging: a piece of a staging slot with the I/O
// request that writes it. The wbufs of a slot are made the first time a save
// holds it and kept with it (nothing is allocated per write).
type wbuf struct {
	sl   *slot
	off  int64 // offset in sl
	data []byte
	req  ring.Req
	sink chan *wbuf // the holding save's; room for every wbuf it can hold

	// Per write, set by the driver: what it stages.
	io      sched.IO
	run     int   // index in Save.runs
	ioBytes int64 // io.Bytes rounded up to O_DIRECT blocks
	// Set by the stage worker: the CRC32C of each chunk piece the write
	// covers, or why it could not gather.
	parts     []crcPart
	gatherErr error
	// PathGPU: the GPU's CRC32C of each page plane the write gathers
	// (kernels.Restorer.GatherLane), room for a whole wbuf of planes.
	planeCRCs []uint32
	// PathCPU: the write's entries over the engine's pages (savedirect.go),
	// or why there are none (iovErr); direct is set while a write from
	// the pages is in flight (Gathered counts it at its completion).
	iov    *uring.Iovecs
	iovErr error
	direct bool
}

// ioDone runs on the I/O worker goroutine (or a stage worker for a write
// that failed before submission): it never blocks.
func (b *wbuf) IODone(*ring.Req) { b.sink <- b }

// crcPart is the CRC32C of bytes [off, off+n) of chunk entry idx of a run
// (layer*chunks + chunk, objmap's chunk table order).
type crcPart struct {
	idx    int
	off, n int64
	crc    uint32
}

// saveWriteBytes is the scheduler's save write size (each layer's object
// is cut at its multiples): at most limit, whole O_DIRECT blocks and, where
// a chunk fits, whole chunks. A chunk cut between two writes leaves CRC
// pieces that the commit combines after the last write, on the save's
// critical path; a chunk that does not divide the limit (MLA's) would be
// cut in nearly every layer of every run. Whole chunks are whole pages, as
// PathGPU's gathers need (gpuWriteUnit).
func saveWriteBytes(g kvshape.Geometry, limit int64, gpu bool) int64 {
	if u := lcm(g.ChunkBytesPerLayer(), objmap.BlockBytes); u <= limit {
		return limit / u * u
	}
	if gpu {
		u := gpuWriteUnit(g)
		return max(u, limit/u*u)
	}
	return limit
}

// lcm is the least common multiple of a and b (both > 0).
func lcm(a, b int64) int64 {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}

// wbufBytes is the staging of one save write: the scheduler's largest
// write, rounded up to O_DIRECT blocks.
func (s *Store) wbufBytes() int64 {
	return (s.maxWriteIOBytes + objmap.BlockBytes - 1) &^ (objmap.BlockBytes - 1)
}

// wbufsPerSlot is how many write buffers one staging slot holds.
func (s *Store) wbufsPerSlot() int { return int(s.staging.slotBytes / s.wbufBytes()) }

// saveWbufs returns sl's write buffers, carving them on first use.
func (s *Store) saveWbufs(sl *slot) []*wbuf {
	if sl.wbufs != nil {
		return sl.wbufs
	}
	wb := s.wbufBytes()
	parts := int(wb/s.geo.ChunkBytesPerLayer()) + 2
	for off := int64(0); off+wb <= s.staging.slotBytes; off += wb {
		b := &wbuf{sl: sl, off: off, data: sl.data[off : off+wb], parts: make([]crcPart, 0, parts)}
		if s.cfg.Path == PathGPU {
			b.planeCRCs = make([]uint32, 0, int(wb/s.geo.PageBytesPerPlane()))
		} else {
			b.newSaveIovecs(saveIovecCap(wb, s.geo.PageBytesPerPlane()))
		}
		b.req.Owner = b
		sl.wbufs = append(sl.wbufs, b)
	}
	return sl.wbufs
}

// saveSlotLimit is how many staging slots the store's saves hold at once:
// on PathCPU half (loads stage their reads in the others), on PathGPU all
// (its loads stage in the kernels' memory).
func saveSlotLimit(slots int, path Path) int {
	if path == PathGPU {
		return slots
	}
	return max(1, slots/2)
}

// stageJob is one save write for the store's stage pool (Store.stager),
// which gathers and checksums it and submits it, so that copies, CRCs and
// writes to every device overlap. Its queue has room for every wbuf of the
// staging pool, so queueing never blocks.
type stageJob struct {
	sv *Save
	b  *wbuf
}

func newStagePool(wbufs int) *workerPool[stageJob] {
	return newWorkerPool(wbufs, func(j stageJob) { j.sv.stageWrite(j.b) })
}

// stageWrite (on a stage worker) gathers b's write from the engine's pages,
// checksums it and submits it; a failed gather is reported as a failed
// write. On PathCPU the write goes from the pages themselves where they meet
// O_DIRECT's alignment (savedirect.go). The save's runs are only read here
// (their fields are the driver's to change, and it changes none of a
// write's run while it stages).
func (sv *Save) stageWrite(b *wbuf) {
	s := sv.s
	g := s.geo
	r := sv.runs[b.run]
	io := b.io
	buf := b.data[:b.ioBytes]
	b.parts = b.parts[:0]
	b.gatherErr = nil
	f := s.m.Files()[r.res.File]
	objOff, _ := objmap.ObjectOffset(g, r.res.Chunks, io.Layer)
	fileOff := uint64(r.res.Offset + objOff + io.OffsetBytes)
	if s.gpu != nil {
		// Writes are cut at whole pages on this path (gpuWriteUnit). The
		// GPU checksums the planes it gathers: the CPU never reads them.
		pb := g.PageBytesPerLayer()
		first := r.chainPos*g.ChunkPages + int(io.OffsetBytes/pb)
		pages := sv.pages[first : first+int(io.Bytes/pb)]
		b.planeCRCs = b.planeCRCs[:len(pages)*g.Planes]
		t0 := time.Now()
		if err := s.gpu.gather(pages, io.Layer, b.sl.buf.Addr()+uintptr(b.off), io.Bytes, b.planeCRCs); err != nil {
			b.gatherErr = fmt.Errorf("gathering run %d layer %d from the GPU: %w", r.res.ID, io.Layer, err)
		} else {
			t1 := time.Now()
			s.stats.saveCopyNs.Add(int64(t1.Sub(t0)))
			b.combinePlaneCRCs(g, r.res.Chunks, s.gpu.planeShift)
			s.stats.saveChecksumNs.Add(int64(time.Since(t1)))
		}
	} else {
		pages := sv.pages[r.chainPos*g.ChunkPages:]
		why := b.directIovecs(s.kv, pages, f.DirectAlign)
		t0 := time.Now()
		if why.kind == 0 {
			b.copyAndChecksum(s.kv, g, r.res.Chunks, pages, nil)
			s.stats.saveChecksumNs.Add(int64(time.Since(t0)))
			s.stats.saveDirectWrites.Add(1)
			b.direct = true // gathered at its completion (saveDriver.completed)
			b.req.C.PrepWritev(f, b.iov, fileOff)
			s.worker.Submit(&b.req)
			return
		}
		s.stats.staged(why)
		b.copyAndChecksum(s.kv, g, r.res.Chunks, pages, buf[:io.Bytes])
		s.stats.saveCopyNs.Add(int64(time.Since(t0)))
	}
	clear(buf[io.Bytes:]) // padding: deterministic bytes on disk
	sv.gathered1()
	if b.gatherErr != nil {
		b.req.Result, b.req.Err = 0, b.gatherErr
		b.IODone(&b.req)
		return
	}
	b.req.C.PrepWrite(f, b.sl.buf.Addr()+uintptr(b.off), uint32(b.ioBytes), fileOff)
	s.worker.Submit(&b.req)
}

// copyAndChecksum copies b's object bytes from the pages into buf one page
// plane at a time, each checksummed while it is still in the CPU's cache;
// with buf nil it only checksums them (a write from the pages).
func (b *wbuf) copyAndChecksum(v *kvViews, g kvshape.Geometry, chunks int, pages []int32, buf []byte) {
	start, end := b.io.OffsetBytes, b.io.OffsetBytes+b.io.Bytes
	pb := v.planeBytes
	for u := start / pb; u*pb < end; u++ {
		us := u * pb
		lo, hi := max(us, start), min(us+pb, end)
		src := v.plane(b.io.Layer, int(u%v.planes), pages[u/v.planes])[lo-us : hi-us]
		if buf != nil {
			dst := buf[lo-start : hi-start]
			copy(dst, src)
			src = dst
		}
		b.addCRC(g, chunks, lo, src)
	}
}

// combinePlaneCRCs folds b.planeCRCs, the CRC32C of each page plane of the
// write in object order (PathGPU's writes are whole pages), into the chunk
// pieces; shift is the plane length's CRCShift (a new piece starts from 0,
// and Combine(0, crc) is crc).
func (b *wbuf) combinePlaneCRCs(g kvshape.Geometry, chunks int, shift *objmap.CRCShift) {
	ppb := g.PageBytesPerPlane()
	off := b.io.OffsetBytes
	for _, crc := range b.planeCRCs {
		part := b.part(g, chunks, off, ppb)
		part.crc = shift.Combine(part.crc, crc)
		off += ppb
	}
}

// addCRC adds p, the object bytes at off (within one chunk), to the chunk
// piece it continues or to a new one.
func (b *wbuf) addCRC(g kvshape.Geometry, chunks int, off int64, p []byte) {
	part := b.part(g, chunks, off, int64(len(p)))
	part.crc = objmap.UpdateCRC32C(part.crc, p)
}

// part is the chunk piece that n object bytes at off (within one chunk)
// extend: the last piece when they continue it, else a new one with CRC 0.
// The caller folds the bytes' CRC into it.
func (b *wbuf) part(g kvshape.Geometry, chunks int, off, n int64) *crcPart {
	cb := g.ChunkBytesPerLayer()
	idx, in := b.io.Layer*chunks+int(off/cb), off%cb
	if k := len(b.parts); k > 0 && b.parts[k-1].idx == idx && b.parts[k-1].off+b.parts[k-1].n == in {
		last := &b.parts[k-1]
		last.n += n
		return last
	}
	b.parts = append(b.parts, crcPart{idx: idx, off: in, n: n})
	return &b.parts[len(b.parts)-1]
}

var errCRCCoverage = errors.New("runtime: save's chunk CRC pieces do not cover the run")

// chunkCRCs folds the run's chunk pieces (from writes completed in any
// order) into objmap's chunk table: CRC32C of each (layer, chunk).
func (r *saveRun) chunkCRCs(chunkBytes int64) error {
	sortPieces(r.parts)
	i := 0
	for idx := range r.crcs {
		j := i
		for j < len(r.parts) && r.parts[j].idx == idx {
			j++
		}
		crc, err := foldPieces(r.parts[i:j], chunkBytes)
		if err != nil {
			return fmt.Errorf("run %d chunk entry %d: %w", r.res.ID, idx, err)
		}
		r.crcs[idx] = crc
		i = j
	}
	if i != len(r.parts) {
		return fmt.Errorf("run %d: %d pieces beyond its %d chunk entries: %w", r.res.ID, len(r.parts)-i, len(r.crcs), errCRCCoverage)
	}
	return nil
}

// sortPieces orders chunk pieces by chunk entry, then offset.
func sortPieces(ps []crcPart) {
	slices.SortFunc(ps, func(a, b crcPart) int {
		if a.idx != b.idx {
			return a.idx - b.idx
		}
		return int(a.off - b.off)
	})
}

// foldPieces is the CRC32C of one chunk of chunkBytes from its pieces
// (sorted by offset), which must cover it exactly, each once. The save's
// writes and a split read's segments both checksum a chunk in pieces.
func foldPieces(ps []crcPart, chunkBytes int64) (uint32, error) {
	crc, at := uint32(0), int64(0)
	for _, p := range ps {
		if p.off != at {
			return 0, fmt.Errorf("piece at %d, want %d: %w", p.off, at, errCRCCoverage)
		}
		if at == 0 {
			crc = p.crc
		} else {
			crc = objmap.CombineCRC32C(crc, p.crc, p.n)
		}
		at += p.n
	}
	if at != chunkBytes {
		return 0, fmt.Errorf("%d of %d bytes checksummed: %w", at, chunkBytes, errCRCCoverage)
	}
	return crc, nil
}
