// Package savewrite is the store's save write pipeline: the writes the
// scheduler dispatches for a save are staged in write buffers carved from
// the staging slots the saves hold (a slot is far larger than one write),
// gathered from the engine's KV memory and checksummed by the mover's
// Gatherers on a pool of stage workers shared by the store's saves, so that
// copies, CRCs and writes to every device overlap, and submitted to the
// store's ring. A save's driver (Drive) hands its writes out, retires them,
// and settles its transaction (package admission) whenever none of its
// writes is in flight.
package savewrite

import (
	"fmt"
	"sync/atomic"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/runtime/internal/staging"
	"github.com/tutti-io/tutti/runtime/internal/workpool"
	"github.com/tutti-io/tutti/sched"
)

// MaxWriteBytes bounds one save write (a smaller staging slot bounds it
// more).
const MaxWriteBytes = 4 << 20

// WriteBytes is the scheduler's save write size (each layer's object is
// cut at its multiples): at most limit, whole O_DIRECT blocks and, where a
// chunk fits, whole chunks. A chunk cut between two writes leaves CRC
// pieces that the commit combines after the last write, on the save's
// critical path; a chunk that does not divide the limit (MLA's) would be
// cut in nearly every layer of every run. unit is the mover's WriteUnit
// (0: none): whole chunks are whole pages, as PathGPU's gathers need.
func WriteBytes(g kvshape.Geometry, limit, unit int64) int64 {
	if u := mover.BlockMultiple(g.ChunkBytesPerLayer()); u <= limit {
		return limit / u * u
	}
	if unit > 0 {
		return max(unit, limit/unit*unit)
	}
	return limit
}

// Config is what the pipeline works with: the store's parts, shared, which
// outlive it.
type Config struct {
	Geometry kvshape.Geometry
	// Pool is where the store's runs lie: every write's file and offset
	// (a write's device is the scheduler's, sched.IO.Device).
	Pool    mover.Pool
	Staging *staging.Pool
	Worker  *ring.Worker
	Sched   *iosched.Scheduler
	Mover   mover.Mover
	// MaxWriteIOBytes is the scheduler's largest save write (WriteBytes).
	MaxWriteIOBytes int64
	// WriteIOs counts payload writes submitted (Stats); LoadsInFlight
	// says whether a load runs now (the device models learn whether a
	// save's writes ran beside reads).
	WriteIOs      *atomic.Int64
	LoadsInFlight func() bool
	// WriteBytes counts the bytes written on each device (mover.Counters').
	WriteBytes []atomic.Int64
}

// Pipeline is the store's save write machinery, shared by its saves.
type Pipeline struct {
	cfg       Config
	wbufBytes int64
	perSlot   int
	// slotTokens holds one token per staging slot the saves hold (at most
	// the mover's SaveSlots).
	slotTokens chan struct{}
	// bufs are each slot's write buffers (by slot ID), carved the first
	// time a save holds it and kept (nothing is allocated per write); a
	// slot's entry is its holder's to touch.
	bufs   [][]*buf
	stager *workpool.Pool[*buf]
}

// New starts the pipeline's stage workers.
func New(cfg Config) *Pipeline {
	p := &Pipeline{cfg: cfg}
	// The staging of one save write: the scheduler's largest write, rounded
	// up to O_DIRECT blocks.
	p.wbufBytes = (cfg.MaxWriteIOBytes + objmap.BlockBytes - 1) &^ (objmap.BlockBytes - 1)
	p.perSlot = int(cfg.Staging.SlotBytes / p.wbufBytes)
	saveSlots := cfg.Mover.SaveSlots(len(cfg.Staging.Slots()))
	p.slotTokens = make(chan struct{}, saveSlots)
	p.bufs = make([][]*buf, len(cfg.Staging.Slots()))
	// Room for every write buffer the saves can hold: queueing never blocks.
	p.stager = workpool.New(saveSlots*p.perSlot, func(b *buf) { b.d.stage(b) })
	return p
}

// BufsPerSlot is how many write buffers one staging slot holds.
func (p *Pipeline) BufsPerSlot() int { return p.perSlot }

// Close stops the stage workers and frees the gatherers (every save ended).
func (p *Pipeline) Close() error {
	p.stager.Close()
	var first error
	for _, bs := range p.bufs {
		for _, b := range bs {
			if err := b.g.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// buf is one save write's staging: a piece of a staging slot with the
// ring request that writes it and the mover's gatherer for it.
type buf struct {
	sl   *staging.Slot
	off  int64 // offset in sl
	data []byte
	g    mover.Gatherer
	req  ring.Req

	// Per write, set by the driver: whose it is, what it stages.
	d       *driver
	io      sched.IO
	run     int   // the save's run
	ioBytes int64 // io.Bytes rounded up to O_DIRECT blocks
	// Set by the stage worker: the write as the gatherer saw it (its chunk
	// pieces), or why it could not gather; direct while a write from the
	// pages is in flight (Gathered counts it at its completion).
	w         mover.Write
	gatherErr error
	direct    bool
}

// IODone runs on the ring's goroutine (or a stage worker's for a write
// that failed before submission): it never blocks (the save's sink has
// room for every buffer it can hold).
func (b *buf) IODone(*ring.Req) { b.d.sink <- b }

// slotBufs returns sl's write buffers, carving them on first use (by its
// holder).
func (p *Pipeline) slotBufs(sl *staging.Slot) []*buf {
	if bs := p.bufs[sl.ID]; bs != nil {
		return bs
	}
	wb := p.wbufBytes
	parts := int(wb/p.cfg.Geometry.ChunkBytesPerLayer()) + 2
	var bs []*buf
	for off := int64(0); off+wb <= p.cfg.Staging.SlotBytes; off += wb {
		b := &buf{sl: sl, off: off, data: sl.Data[off : off+wb]}
		b.g = p.cfg.Mover.NewGatherer(b.data, sl.Buf.Addr()+uintptr(off))
		b.w.Parts = make([]mover.Piece, 0, parts)
		b.req.Owner = b
		bs = append(bs, b)
	}
	p.bufs[sl.ID] = bs
	return bs
}

// stage (on a stage worker) gathers b's write through the mover, checksums
// it and submits it; a failed gather is reported as a failed write. The
// save's runs are only read here (where a run writes does not change once
// admitted).
func (d *driver) stage(b *buf) {
	p := d.p
	g := p.cfg.Geometry
	io := b.io
	res, chainPos := d.txn.Target(b.run)
	obj, f := p.cfg.Pool.At(res.Place(), io.Layer, 0)
	b.w = mover.Write{Layer: io.Layer, Off: io.OffsetBytes, Bytes: io.Bytes, IOBytes: b.ioBytes, Chunks: res.Chunks,
		Pages: d.pages[chainPos*g.ChunkPages:], AfterEvent: d.afterEvent, File: f, FileOff: uint64(obj.Offset + io.OffsetBytes), Parts: b.w.Parts[:0]}
	b.gatherErr = nil
	direct, err := b.g.Gather(&b.w, &b.req)
	if err != nil {
		b.gatherErr = fmt.Errorf("gathering run %d layer %d %w", res.ID, io.Layer, err)
	}
	if direct {
		b.direct = true // gathered at its completion (driver.completed)
		p.cfg.Worker.Submit(&b.req)
		return
	}
	d.gathered1()
	if b.gatherErr != nil {
		b.req.Result, b.req.Err = 0, b.gatherErr
		b.IODone(&b.req)
		return
	}
	p.cfg.Worker.Submit(&b.req)
}
