package runtime

// PathCPU's load reads go straight into the engine's pages: one O_DIRECT
// vectored read per segment, its entries the page planes the segment's
// payload fills (cut at the segment's ends), with the slot's own memory for
// the bytes the O_DIRECT rounding reads before and after the payload. The
// consume pool then only checksums the payload where it landed, in the
// pages; nothing is copied. A segment whose pages do not meet the pool
// file's O_DIRECT alignment, or would need more entries than the slot's
// iovecs hold, is read into its slot and copied as before, counted
// (Stats.Loads.StagedReads, StagedReason). Either way a run that fails
// leaves its pages holding unspecified bytes (Load's contract).

import (
	"github.com/tutti-io/tutti/uring"
)

// newReadIovecs gives every slot of p its iovecs for direct reads of
// planeBytes planes; a slot without them (the allocation failed) stages its
// reads, and the error says why.
func (p *stagingPool) newReadIovecs(planeBytes int64) {
	for _, sl := range p.all {
		sl.iov, sl.iovErr = uring.NewIovecs(directIovecCap(p.slotBytes, planeBytes))
	}
}

// directRead lists seg's read into sl.iov: the slot's memory for the bytes
// before the payload and after it (at the offsets a staged read would put
// them), the pages of r between. The zero stageWhy: the read can go to the
// pages; payload reports whether it has any (a segment of rounding alone
// is read into the slot, counted as neither).
func (l *Load) directRead(sl *slot, seg *segment, r loadRun, align uint32) (why stageWhy, payload bool) {
	sp := &seg.span
	start, end := seg.objOff, seg.objOff+seg.ioBytes
	lo, hi := max(start, sp.Skip), min(end, sp.Skip+sp.DataBytes)
	if lo >= hi {
		return stageWhy{}, false
	}
	if sl.iov == nil {
		return stageWhy{kind: StageNoIovecs, err: sl.iovErr}, true
	}
	d := newDirectIO(sl.iov, align, seg.io.Layer)
	if lo > start {
		if w := d.add(sl.buf.Addr(), lo-start, -1, -1); w.kind != StageNone {
			return w, true
		}
		if w := d.flush(); w.kind != StageNone {
			return w, true
		}
	}
	if w := d.planes(l.s.kv, l.pages[r.chainPos*l.s.geo.ChunkPages:], lo-sp.Skip, hi-sp.Skip); w.kind != StageNone {
		return w, true
	}
	if w := d.flush(); w.kind != StageNone {
		return w, true
	}
	if hi < end {
		if w := d.add(sl.buf.Addr()+uintptr(hi-start), end-hi, -1, -1); w.kind != StageNone {
			return w, true
		}
	}
	return d.flush(), true
}

// prepRead prepares sl's read of seg from file f at off: into the pages
// when directRead allows, else into the slot (counted when it had payload).
func (l *Load) prepRead(sl *slot, seg *segment, r loadRun, f *uring.File, off uint64) {
	why, payload := l.directRead(sl, seg, r, f.DirectAlign)
	switch {
	case payload && why.kind == StageNone:
		seg.direct = true
		l.s.stats.loadDirectReads.Add(1)
		sl.req.C.PrepReadv(f, sl.iov, off)
		return
	case payload:
		l.s.stats.stagedRead(why)
	}
	sl.req.C.PrepRead(f, sl.buf.Addr(), uint32(seg.ioBytes), off)
}

// checkPages is restorePages for a read that went to the pages: ver sees
// the bytes [start, end) of layer in order, where they landed.
func (v *kvViews) checkPages(layer int, pages []int32, start, end int64, ver chunkChecker) error {
	pb := v.planeBytes
	for u := start / pb; u*pb < end; u++ {
		us := u * pb
		lo, hi := max(us, start), min(us+pb, end)
		kv := v.plane(layer, int(u%v.planes), pages[u/v.planes])
		if err := ver.Update(kv[lo-us : hi-us]); err != nil {
			return err
		}
	}
	return nil
}
