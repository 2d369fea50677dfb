package runtime

// PathCPU's save writes go straight from the engine's pages: one O_DIRECT
// vectored write per save write, its entries the page planes (or their cut
// ends) in object order, checksummed on the stage worker. Nothing is
// copied, so a save costs the CPU its CRCs only, and the engine's pages are
// read until the write completes (Gathered closes then). A write whose pages
// do not meet the pool file's O_DIRECT alignment, or that would need more
// entries than its iovecs hold, is copied into its staging as before and
// counted (Stats.Saves.StagedWrites, StagedReason): the bytes on disk are
// the same.

import "github.com/tutti-io/tutti/uring"

// saveIovecCap is the iovec capacity of one write buffer of wbufBytes.
func saveIovecCap(wbufBytes, planeBytes int64) int { return directIovecCap(wbufBytes, planeBytes) }

// directIovecs lists b's write (b.io, b.ioBytes set) in b.iov: the bytes of
// the engine's pages in object order, contiguous pieces merged, then zero
// padding from b.data up to b.ioBytes. It returns the zero stageWhy when
// every entry meets align (0: buffered I/O, anything goes), else why the
// write must be staged. pages[p] is the p-th page from the run's first chunk.
func (b *wbuf) directIovecs(v *kvViews, pages []int32, align uint32) stageWhy {
	if b.iov == nil {
		return stageWhy{kind: StageNoIovecs, err: b.iovErr}
	}
	d := newDirectIO(b.iov, align, b.io.Layer)
	if w := d.planes(v, pages, b.io.OffsetBytes, b.io.OffsetBytes+b.io.Bytes); w.kind != StageNone {
		return w
	}
	if w := d.flush(); w.kind != StageNone {
		return w
	}
	if pad := b.ioBytes - b.io.Bytes; pad > 0 {
		clear(b.data[:pad]) // deterministic bytes on disk
		if w := d.add(b.sl.buf.Addr()+uintptr(b.off), pad, -1, -1); w.kind != StageNone {
			return w
		}
	}
	return d.flush()
}

// newSaveIovecs gives a PathCPU write buffer its iovecs; on failure the
// buffer's writes are staged, and the error says why (stageWhy).
func (b *wbuf) newSaveIovecs(capacity int) {
	b.iov, b.iovErr = uring.NewIovecs(capacity)
}

// freeIovecs releases b's iovecs (at Close, after every write completed).
func (b *wbuf) freeIovecs() error {
	if b.iov == nil {
		return nil
	}
	err := b.iov.Free()
	b.iov = nil
	return err
}
