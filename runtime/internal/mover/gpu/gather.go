package gpu

import (
	"fmt"
	"time"

	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/ring"
)

// gatherer is one write buffer's: its staging memory (a registered slot's
// piece) and room for the CRC32C of every page plane it can hold.
type gatherer struct {
	m         *Mover
	buf       []byte
	addr      uintptr
	planeCRCs []uint32
}

// NewGatherer makes a write buffer's gatherer.
func (m *Mover) NewGatherer(buf []byte, addr uintptr) mover.Gatherer {
	return &gatherer{m: m, buf: buf, addr: addr, planeCRCs: make([]uint32, 0, int64(len(buf))/m.cfg.Geometry.PageBytesPerPlane())}
}

// Gather copies w's pages from HBM into the buffer in object layout, the
// GPU checksumming every plane it gathers (the CPU never reads them), and
// folds the plane CRCs into w's chunk pieces. Writes are cut at whole pages
// on this path (WriteUnit).
func (g *gatherer) Gather(w *mover.Write, req *ring.Req) (direct bool, err error) {
	m := g.m
	geo := m.cfg.Geometry
	pb := geo.PageBytesPerLayer()
	first := int(w.Off / pb)
	pages := w.Pages[first : first+int(w.Bytes/pb)]
	g.planeCRCs = g.planeCRCs[:len(pages)*geo.Planes]
	t0 := time.Now()
	if err := m.gather(pages, w.Layer, g.addr, w.Bytes, g.planeCRCs, w.AfterEvent); err != nil {
		return false, fmt.Errorf("from the GPU: %w", err)
	}
	t1 := time.Now()
	m.cfg.Counters.CopyNs.Add(int64(t1.Sub(t0)))
	g.combinePlaneCRCs(w)
	m.cfg.Counters.ChecksumNs.Add(int64(time.Since(t1)))
	clear(g.buf[w.Bytes:w.IOBytes]) // padding: deterministic bytes on disk
	req.C.PrepWrite(w.File, g.addr, uint32(w.IOBytes), w.FileOff)
	return false, nil
}

// gather copies pages of layer from HBM into dst (a registered staging
// slot) in object layout, and the CRC32C of each of their planes into
// planeCRCs (len(pages)*Planes), on a free gather lane: the stage workers'
// gathers run at once, up to the lanes (one lock over them all serialized
// every save behind every other). The copies wait on the device for
// afterEvent, the engine's, where not 0.
func (m *Mover) gather(pages []int32, layer int, dst uintptr, bytes int64, planeCRCs []uint32, afterEvent uintptr) error {
	lane := <-m.lanes
	defer func() { m.lanes <- lane }()
	return m.r.GatherLane(lane, pages, layer, 1, dst, bytes, planeCRCs, afterEvent)
}

// combinePlaneCRCs folds g.planeCRCs, the CRC32C of each page plane of the
// write in object order, into w's chunk pieces with the plane length's
// CRCShift (a new piece starts from 0, and Combine(0, crc) is crc).
func (g *gatherer) combinePlaneCRCs(w *mover.Write) {
	geo := g.m.cfg.Geometry
	ppb := geo.PageBytesPerPlane()
	cb := geo.ChunkBytesPerLayer()
	off := w.Off
	for _, crc := range g.planeCRCs {
		p := mover.AddPiece(&w.Parts, w.Layer, w.Chunks, cb, off, ppb)
		p.CRC = g.m.planeShift.Combine(p.CRC, crc)
		off += ppb
	}
}

// Close does nothing: the buffer is the store's.
func (g *gatherer) Close() error { return nil }
