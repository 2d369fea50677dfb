package cpu

// Save writes go straight from the engine's pages: one O_DIRECT vectored
// write per save write, its entries the page planes (or their cut ends) in
// object order, checksummed on the stage worker. Nothing is copied, so a
// save costs the CPU its CRCs only, and the engine's pages are read until
// the write completes. A write whose pages do not meet the pool file's
// O_DIRECT alignment, or that would need more entries than its iovecs hold,
// is copied into its staging as before and counted
// (Counters.StagedWrites): the bytes on disk are the same.

import (
	"time"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/uring"
)

// gatherer is one write buffer's: its staging memory and the iovecs of a
// write from the pages (nil, with iovErr, when they could not be had: its
// writes are staged).
type gatherer struct {
	m      *Mover
	buf    []byte
	addr   uintptr
	iov    *uring.Iovecs
	iovErr error
}

// NewGatherer makes a write buffer's gatherer, with iovecs for direct
// writes of up to len(buf) bytes.
func (m *Mover) NewGatherer(buf []byte, addr uintptr) mover.Gatherer {
	g := &gatherer{m: m, buf: buf, addr: addr}
	g.iov, g.iovErr = uring.NewIovecs(directIovecCap(int64(len(buf)), m.g.PageBytesPerPlane()))
	return g
}

// Gather checksums w from the pages: into the write's iovecs when they
// meet O_DIRECT's rules (direct), else copied into the buffer in the same
// pass. It never fails.
func (g *gatherer) Gather(w *mover.Write, req *ring.Req) (direct bool, err error) {
	c := g.m.counters
	why := g.directIovecs(w)
	t0 := time.Now()
	if why.kind == mover.StageNone {
		g.copyAndChecksum(w, nil)
		c.ChecksumNs.Add(int64(time.Since(t0)))
		c.DirectWrites.Add(1)
		req.C.PrepWritev(w.File, g.iov, w.FileOff)
		return true, nil
	}
	mover.CountStaged(&c.StagedWrites, &c.FirstStagedWrite, why.kind, why.String)
	g.copyAndChecksum(w, g.buf[:w.Bytes])
	c.CopyNs.Add(int64(time.Since(t0)))
	clear(g.buf[w.Bytes:w.IOBytes]) // padding: deterministic bytes on disk
	req.C.PrepWrite(w.File, g.addr, uint32(w.IOBytes), w.FileOff)
	return false, nil
}

// copyAndChecksum copies w's object bytes from the pages into buf one page
// plane at a time, each checksummed while it is still in the CPU's cache;
// with buf nil it only checksums them (a write from the pages).
func (g *gatherer) copyAndChecksum(w *mover.Write, buf []byte) {
	v := g.m.kv
	cb := g.m.g.ChunkBytesPerLayer()
	start, end := w.Off, w.Off+w.Bytes
	pb := v.planeBytes
	for u := start / pb; u*pb < end; u++ {
		us := u * pb
		lo, hi := max(us, start), min(us+pb, end)
		src := v.Plane(w.Layer, int(u%v.planes), w.Pages[u/v.planes])[lo-us : hi-us]
		if buf != nil {
			dst := buf[lo-start : hi-start]
			copy(dst, src)
			src = dst
		}
		p := mover.AddPiece(&w.Parts, w.Layer, w.Chunks, cb, lo, int64(len(src)))
		p.CRC = objmap.UpdateCRC32C(p.CRC, src)
	}
}

// directIovecs lists w in g.iov: the bytes of the engine's pages in object
// order, contiguous pieces merged, then zero padding from the buffer up to
// w.IOBytes. It returns the zero stageWhy when every entry meets the file's
// alignment (0: buffered I/O, anything goes), else why the write must be
// staged.
func (g *gatherer) directIovecs(w *mover.Write) stageWhy {
	if g.iov == nil {
		return stageWhy{kind: mover.StageNoIovecs, err: g.iovErr}
	}
	d := newDirectIO(g.iov, w.File.DirectAlign, w.Layer)
	if why := d.planes(g.m.kv, w.Pages, w.Off, w.Off+w.Bytes); why.kind != mover.StageNone {
		return why
	}
	if why := d.flush(); why.kind != mover.StageNone {
		return why
	}
	if pad := w.IOBytes - w.Bytes; pad > 0 {
		clear(g.buf[:pad]) // deterministic bytes on disk
		if why := d.add(g.addr, pad, -1, -1); why.kind != mover.StageNone {
			return why
		}
	}
	return d.flush()
}

// Close frees the iovecs (after the buffer's last write completed).
func (g *gatherer) Close() error {
	if g.iov == nil {
		return nil
	}
	err := g.iov.Free()
	g.iov = nil
	return err
}
