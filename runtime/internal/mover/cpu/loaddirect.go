package cpu

// Restore reads go straight into the engine's pages: one O_DIRECT vectored
// read per segment, its entries the page planes the segment's payload fills
// (cut at the segment's ends), with the slot's own memory for the bytes the
// O_DIRECT rounding reads before and after the payload. The consume pool
// then only checksums the payload where it landed, in the pages; nothing is
// copied. A segment whose pages do not meet the pool file's O_DIRECT
// alignment, or would need more entries than the slot's iovecs hold, is
// read into its slot and copied as before, counted (Counters.StagedReads).
// Either way a run that fails leaves its pages holding unspecified bytes.

import (
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/staging"
	"github.com/tutti-io/tutti/uring"
)

// newReadIovecs gives every staging slot its iovecs for direct reads of
// planeBytes planes; a slot without them (the allocation failed) stages
// its reads, and the error says why.
func (m *Mover) newReadIovecs(planeBytes int64) {
	for i := range m.slots {
		st := &m.slots[i]
		st.iov, st.iovErr = uring.NewIovecs(directIovecCap(m.staging.SlotBytes, planeBytes))
	}
}

// directRead lists seg's read into sl's iovecs: the slot's memory for the
// bytes before the payload and after it (at the offsets a staged read would
// put them), the pages of r between. The zero stageWhy: the read can go to
// the pages; payload reports whether it has any (a segment of rounding
// alone is read into the slot, counted as neither).
func (rs *restore) directRead(sl *staging.Slot, seg *segment, r mover.Run, align uint32) (why stageWhy, payload bool) {
	sp := &seg.span
	start, end := seg.objOff, seg.objOff+seg.ioBytes
	lo, hi := max(start, sp.Skip), min(end, sp.Skip+sp.DataBytes)
	if lo >= hi {
		return stageWhy{}, false
	}
	st := &rs.m.slots[sl.ID]
	if st.iov == nil {
		return stageWhy{kind: mover.StageNoIovecs, err: st.iovErr}, true
	}
	d := newDirectIO(st.iov, align, seg.io.Layer)
	if lo > start {
		if w := d.add(sl.Buf.Addr(), lo-start, -1, -1); w.kind != mover.StageNone {
			return w, true
		}
		if w := d.flush(); w.kind != mover.StageNone {
			return w, true
		}
	}
	if w := d.planes(rs.m.kv, rs.r.Pages[r.ChainPos*rs.m.g.ChunkPages:], lo-sp.Skip, hi-sp.Skip); w.kind != mover.StageNone {
		return w, true
	}
	if w := d.flush(); w.kind != mover.StageNone {
		return w, true
	}
	if hi < end {
		if w := d.add(sl.Buf.Addr()+uintptr(hi-start), end-hi, -1, -1); w.kind != mover.StageNone {
			return w, true
		}
	}
	return d.flush(), true
}

// prepRead prepares sl's read of seg of run r at off of the pool file its
// span reads: into the pages when directRead allows, else into the slot
// (counted when it had payload).
func (rs *restore) prepRead(sl *staging.Slot, seg *segment, r mover.Run, off uint64) {
	c := rs.m.counters
	f := rs.m.pool.Files[seg.span.File]
	why, payload := rs.directRead(sl, seg, r, f.DirectAlign)
	switch {
	case payload && why.kind == mover.StageNone:
		seg.direct = true
		c.DirectReads.Add(1)
		sl.Req.C.PrepReadv(f, rs.m.slots[sl.ID].iov, off)
		return
	case payload:
		mover.CountStaged(&c.StagedReads, &c.FirstStagedRead, why.kind, why.String)
	}
	sl.Req.C.PrepRead(f, sl.Buf.Addr(), uint32(seg.ioBytes), off)
}
