package savewrite

import (
	"fmt"
	"sync/atomic"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/admission"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/staging"
	"github.com/tutti-io/tutti/sched"
	"golang.org/x/sys/unix"
)

// Save is one save's writes as the pipeline sees them.
type Save struct {
	Txn *admission.Txn
	// Pages is the save's block table, the engine's: page j of chain
	// block i is Pages[i*ChunkPages+j]; read until Gathered is closed.
	Pages []int32
	// AfterEvent, if not 0, is the engine's CUDA event after which the
	// pages hold the KV to save (mover.Write.AfterEvent).
	AfterEvent uintptr
	// Gathered is closed once the save no longer reads the pages (every
	// write gathered or given up); Drive closes it if the writes did not.
	Gathered chan struct{}
	// StartNs is the scheduler's clock at the save's call.
	StartNs int64
}

// Timing is where the save's writes' time went, each figure from StartNs.
type Timing struct {
	FirstWriteNs int64 // its first write went to a stage worker (0: none did)
	WritesNs     int64 // its last write was retired
	// DeviceWritesNs is each device's span from its first write's
	// submission to its last completion (0: the device wrote nothing).
	DeviceWritesNs []int64
}

// driver is a save's driver goroutine's state.
type driver struct {
	p          *Pipeline
	txn        *admission.Txn
	pages      []int32
	afterEvent uintptr
	sink       chan *buf // completions of the save's writes; room for every buffer it can hold
	gathered   chan struct{}
	gatherLeft atomic.Int64 // writes not yet gathered (driver and stage workers)
	startNs    int64
	timing     Timing
	writesLeft int        // dispatched writes not yet retired
	queue      []sched.IO // dispatched, waiting for a write buffer
	held       []*staging.Slot
	free       []*buf // idle write buffers of the held slots
	busy       int    // write buffers being staged or written
	// The save's writes, one batch per device for the device models:
	// each device is credited with the writes it served.
	batches   []iosched.Batch
	withReads bool
}

// Drive is the save's driver, on the caller's goroutine: it hands the
// writes the scheduler dispatches to the stage workers (which gather,
// checksum and submit them) as write buffers allow, retires their
// completions, and settles the transaction in chain order (a block is
// committed only after its parent). Settling waits until none of the save's
// writes is in flight (the end of the save, or a pause in what the
// scheduler dispatches), so that a commit's syncs never leave the devices
// idle while writes wait. It returns once every write is retired and every
// run settled; Gathered is closed by then.
func (p *Pipeline) Drive(sv Save) Timing {
	d := &driver{p: p, txn: sv.Txn, pages: sv.Pages, afterEvent: sv.AfterEvent, gathered: sv.Gathered, startNs: sv.StartNs,
		writesLeft: sv.Txn.Writes(), sink: make(chan *buf, cap(p.slotTokens)*p.perSlot)}
	d.gatherLeft.Store(int64(sv.Txn.GatherWrites()))
	d.queue = make([]sched.IO, 0, d.writesLeft)
	sc := p.cfg.Sched
	for d.writesLeft > 0 {
		d.stageQueued()
		if d.writesLeft == 0 {
			break
		}
		if d.busy == 0 {
			// Nothing in flight: the staging goes back to loads and other
			// saves while the scheduler holds the rest back.
			d.releaseSlots()
			d.txn.Settle()
		}
		select {
		case io := <-d.txn.IOs():
			d.queue = append(d.queue, io)
		case b := <-d.sink:
			d.completed(b)
		}
	}
	d.timing.WritesNs = sc.NowNs() - d.startNs
	d.releaseSlots()
	d.txn.Settle()
	d.timing.DeviceWritesNs = make([]int64, p.cfg.Pool.Layout.Dirs())
	for dev, b := range d.batches {
		if b.Ops > 0 {
			sc.ObserveWrites(dev, b.Bytes, int(b.Ops), b.LastNs-b.FirstNs, d.withReads)
			d.timing.DeviceWritesNs[dev] = b.LastNs - b.FirstNs
		}
	}
	select {
	case <-d.gathered:
	default:
		close(d.gathered)
	}
	return d.timing
}

// stageQueued hands queued writes to the stage workers while write buffers
// are free; writes of runs not written (given up) are retired at once.
func (d *driver) stageQueued() {
	p := d.p
	for len(d.queue) > 0 {
		io := d.queue[0]
		ri := d.txn.RunOf(io.ReqID)
		if !d.txn.Writable(ri) {
			d.queue = d.queue[1:]
			if d.txn.Gathers(ri) {
				d.gathered1()
			}
			d.retire(io, ri)
			continue
		}
		b := d.takeBuf()
		if b == nil {
			return
		}
		d.queue = d.queue[1:]
		b.d, b.io, b.run = d, io, ri
		b.ioBytes = (io.Bytes + objmap.BlockBytes - 1) &^ (objmap.BlockBytes - 1)
		now := p.cfg.Sched.NowNs()
		if d.timing.FirstWriteNs == 0 {
			d.timing.FirstWriteNs = max(1, now-d.startNs)
		}
		iosched.BatchOf(&d.batches, io.Device).Start(now, b.ioBytes)
		mover.Count(p.cfg.WriteBytes, io.Device, b.ioBytes)
		d.withReads = d.withReads || p.cfg.LoadsInFlight()
		d.txn.Started(ri)
		d.busy++
		p.cfg.WriteIOs.Add(1)
		p.stager.Submit(b)
	}
}

// takeBuf returns a free write buffer, taking another staging slot when
// the store's saves hold fewer than their share; nil when none is free now.
// With nothing in flight it blocks for a slot (the save cannot progress
// otherwise, and loads and other saves give theirs back).
func (d *driver) takeBuf() *buf {
	if n := len(d.free); n > 0 {
		b := d.free[n-1]
		d.free = d.free[:n-1]
		return b
	}
	p := d.p
	var sl *staging.Slot
	if d.busy == 0 {
		p.slotTokens <- struct{}{}
		sl = p.cfg.Staging.Acquire()
	} else {
		select {
		case p.slotTokens <- struct{}{}:
		default:
			return nil
		}
		if sl = p.cfg.Staging.TryAcquire(); sl == nil {
			<-p.slotTokens
			return nil
		}
	}
	d.held = append(d.held, sl)
	bs := p.slotBufs(sl)
	d.free = append(d.free, bs[1:]...)
	return bs[0]
}

// releaseSlots gives every held slot back (none of its buffers is busy).
func (d *driver) releaseSlots() {
	p := d.p
	for _, sl := range d.held {
		p.cfg.Staging.Release(sl)
		<-p.slotTokens
	}
	d.held, d.free = d.held[:0], d.free[:0]
}

// completed retires a finished write (or one whose gather failed): a
// failure fails its run, a success keeps its chunk CRC pieces.
func (d *driver) completed(b *buf) {
	ri := b.run
	d.busy--
	if b.direct {
		b.direct = false
		d.gathered1()
	}
	res, _ := d.txn.Target(ri)
	iosched.BatchOf(&d.batches, b.io.Device).LastNs = d.p.cfg.Sched.NowNs()
	var err error
	switch {
	case b.gatherErr != nil:
		err = b.gatherErr
	case b.req.Err != nil:
		err = fmt.Errorf("writing run %d layer %d: %w", res.ID, b.io.Layer, b.req.Err)
	case b.req.Result != b.ioBytes:
		err = fmt.Errorf("writing run %d layer %d: %d of %d bytes: %w", res.ID, b.io.Layer, b.req.Result, b.ioBytes, unix.EIO)
	}
	d.txn.Completed(ri, b.w.Parts, err)
	io := b.io
	d.free = append(d.free, b)
	d.retire(io, ri)
}

func (d *driver) retire(io sched.IO, ri int) {
	d.writesLeft--
	d.p.cfg.Sched.Complete(io, d.txn.Retire(ri))
}

// gathered1 counts one write gathered (or given up) and closes Gathered
// after the last (on the driver or a stage worker).
func (d *driver) gathered1() {
	if d.gatherLeft.Add(-1) == 0 {
		close(d.gathered)
	}
}
