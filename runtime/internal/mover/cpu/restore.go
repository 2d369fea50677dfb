package cpu

import (
	"fmt"
	"slices"
	"sort"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/staging"
	"github.com/tutti-io/tutti/sched"
)

// restore is one load's restore: the state of its driver goroutine (drive).
type restore struct {
	m *Mover
	r *mover.Restore

	remaining []int // per layer: reads not finished
	readsLeft int
	ready     int        // layers reported done
	burst     []sched.IO // scratch of takeReads
	consumed  chan consumed
	done      chan *staging.Slot // completed reads; room for every slot
	res       mover.Result
	batches   []iosched.Batch // the reads per device, for the device models
}

// segment is what one staging slot holds for a restore: part of one
// (layer, run) read (a dispatched sched.IO).
type segment struct {
	rs   *restore
	io   sched.IO
	span objmap.Span // the (layer, run) read this segment is part of
	// objOff is where the staged bytes start, relative to the span's read;
	// ioBytes are transferred (BlockBytes-aligned).
	objOff, ioBytes int64
	last            bool // last segment of its sched.IO
	// direct: the payload was read into the pages, not the slot
	// (loaddirect.go).
	direct bool
	// split is the read's verification state when it takes several
	// segments (nil when one slot holds it whole).
	split *splitRead
}

// Restore starts the driver of r's reads (r.Plan.Reads, routed on r.IOs).
func (m *Mover) Restore(r *mover.Restore) mover.StreamWaiter {
	rs := &restore{m: m, r: r, remaining: make([]int, m.g.Layers), readsLeft: len(r.Plan.Reads),
		done: make(chan *staging.Slot, len(m.staging.Slots()))}
	for _, io := range r.Plan.Reads {
		rs.remaining[io.Layer]++
	}
	if rs.readsLeft == 0 {
		r.Load.LayersDone(m.g.Layers)
		r.Load.Done(mover.Result{})
		return nil
	}
	go rs.drive()
	return nil
}

// span is the one read of (layer, run), where the store's pool puts the
// layer: exactly the loaded chunks [First, First+K), rounded out to
// O_DIRECT blocks; each chunk is verified against its own CRC32C from the
// run's chunk table.
func (rs *restore) span(r mover.Run, layer int) objmap.Span {
	sp, _ := rs.m.pool.Span(r, layer)
	return sp
}

// drive is the restore's goroutine: it stages and submits the reads the
// scheduler dispatches (as many as staging slots allow) by deadline and
// layer across devices (insertRead), hands completed segments to the
// consume pool (verified and scattered there, a split read's segments in
// any order: splitread.go), and reports layers done. It holds at least one
// slot whenever it waits for one, and its oldest segment always completes,
// so restores never deadlock on staging.
func (rs *restore) drive() {
	m := rs.m
	slotBytes := m.staging.SlotBytes
	queue := make([]sched.IO, 0, len(rs.r.Plan.Reads))       // dispatched, not yet fully submitted
	ring := make([]*staging.Slot, 0, len(m.staging.Slots())) // submitted, not yet handed to the pool
	var off int64                                            // progress within queue[0]
	var split *splitRead                                     // queue[0]'s, when it is split
	segs := 0
	for _, io := range rs.r.Plan.Reads {
		segs += int((rs.span(rs.r.Runs[io.Run], io.Layer).IOBytes + slotBytes - 1) / slotBytes)
	}
	rs.consumed = make(chan consumed, segs) // room for every segment: workers never block
	inPool := 0                             // segments handed to the pool and not yet back
	for rs.readsLeft > 0 {
		for len(queue) > 0 {
			io := queue[0]
			run := rs.r.Runs[io.Run]
			if off == 0 && !rs.r.Load.Valid(io.Run) {
				queue = queue[1:]
				rs.finishRead(io)
				continue
			}
			var sl *staging.Slot
			if len(ring) == 0 {
				sl = m.staging.Acquire()
			} else if sl = m.staging.TryAcquire(); sl == nil {
				break
			}
			sp := rs.span(run, io.Layer)
			seg := segment{rs: rs, io: io, span: sp, objOff: off, ioBytes: min(slotBytes, sp.IOBytes-off)}
			if sp.IOBytes > slotBytes {
				if off == 0 {
					split = rs.newSplit(run, sp, int((sp.IOBytes+slotBytes-1)/slotBytes))
				}
				seg.split = split
			}
			off += seg.ioBytes
			if off == sp.IOBytes {
				seg.last = true
				queue, off, split = queue[1:], 0, nil
			}
			st := &m.slots[sl.ID]
			sl.Sink, st.completed = rs.done, false
			rs.prepRead(sl, &seg, run, uint64(sp.Off+seg.objOff))
			st.seg = seg
			ring = append(ring, sl)
			rs.res.IOs++
			iosched.BatchOf(&rs.batches, sp.Device).Start(m.sched.NowNs(), seg.ioBytes)
			mover.Count(m.counters.ReadBytes, sp.Device, seg.ioBytes)
			if seg.objOff > 0 {
				rs.res.SplitIOs++
			}
			m.worker.Submit(&sl.Req)
		}
		if len(ring) == 0 && len(queue) == 0 && inPool == 0 {
			if rs.readsLeft == 0 {
				break
			}
			queue = rs.takeReads(queue, false, <-rs.r.IOs)
			continue
		}
		if i := slices.IndexFunc(ring, func(sl *staging.Slot) bool { return m.slots[sl.ID].completed }); i >= 0 {
			// Any completed segment goes on at once (the pool verifies and
			// scatters in any order): waiting for the oldest left finished
			// slots idle behind a read still in flight on a slower device.
			sl := ring[i]
			ring = slices.Delete(ring, i, i+1)
			inPool++
			m.consumers.Submit(sl)
			continue
		}
		select {
		case io := <-rs.r.IOs:
			queue = rs.takeReads(queue, off > 0, io)
		case sl := <-rs.done:
			m.slots[sl.ID].completed = true
		case c := <-rs.consumed:
			inPool--
			rs.res.OverreadBytes += c.overreadBytes
			if c.readDone {
				rs.finishRead(c.io)
			}
		}
	}
	// One batch per device: busy time is the span in which its reads were
	// in flight (iosched.Batch).
	for dev, b := range rs.batches {
		if b.Ops > 0 {
			m.sched.ObserveReads(dev, b.Bytes, int(b.Ops), m.sched.NowNs()-b.FirstNs)
		}
	}
	rs.r.Load.Done(rs.res)
}

// finishRead retires one (layer, run) read and reports layers done in
// order.
func (rs *restore) finishRead(io sched.IO) {
	rs.remaining[io.Layer]--
	rs.readsLeft--
	rs.m.sched.Complete(io, rs.readsLeft == 0)
	advanced := false
	for rs.ready < len(rs.remaining) && rs.remaining[rs.ready] == 0 {
		rs.ready++
		advanced = true
	}
	if advanced {
		rs.r.Load.LayersDone(rs.ready)
	}
}

// newSplit starts the check of a split read of span sp of run r in segs
// segments.
func (rs *restore) newSplit(r mover.Run, sp objmap.Span, segs int) *splitRead {
	sr, err := newSplitRead(r.Info.LayerChunkCRCs(sp.Layer), sp, segs)
	if err != nil {
		panic(fmt.Sprintf("cpu mover: run %d: %v", r.Info.ID, err)) // recovery and commit keep every run's chunk CRCs
	}
	return sr
}

// takeReads adds io and every other read dispatched to the restore so far
// (a dispatch round whole: the scheduler routes a round's reads one by one)
// to queue, so the order among them is decided before any is submitted.
func (rs *restore) takeReads(queue []sched.IO, keepHead bool, io sched.IO) []sched.IO {
	queue = insertRead(queue, keepHead, io)
	rs.burst = rs.m.sched.TakeRouted(rs.r.IOs, rs.burst[:0])
	for _, io := range rs.burst {
		queue = insertRead(queue, keepHead, io)
	}
	return queue
}

// insertRead adds a dispatched read to the reads waiting for staging, in
// submission order: by deadline (the scheduler's least slack first), then
// layer, then run. The scheduler dispatches per device, each device's reads
// in deadline order but one device after another; submitted as they came,
// a load striped over several devices would read one device's share of many
// layers before the next device's first layer (layer 0 ready only after
// most of the load was read, the devices taking turns instead of reading
// together). keepHead holds queue[0] in place (it is partly submitted).
func insertRead(queue []sched.IO, keepHead bool, io sched.IO) []sched.IO {
	lo := 0
	if keepHead && len(queue) > 0 {
		lo = 1
	}
	i := lo + sort.Search(len(queue)-lo, func(j int) bool { return readBefore(io, queue[lo+j]) })
	queue = append(queue, sched.IO{})
	copy(queue[i+1:], queue[i:])
	queue[i] = io
	return queue
}

// readBefore orders reads for submission: deadline, layer, run.
func readBefore(a, b sched.IO) bool {
	if a.DeadlineNs != b.DeadlineNs {
		return a.DeadlineNs < b.DeadlineNs
	}
	if a.Layer != b.Layer {
		return a.Layer < b.Layer
	}
	return a.Run < b.Run
}
