package runtime

// A Save's I/O phase: the goroutine that hands the writes the scheduler
// dispatches to the stage workers (savestage.go), retires their completions
// and commits runs in chain order.

import (
	"fmt"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/sched"
	"golang.org/x/sys/unix"
)

// drive is the save's goroutine: it hands the writes the scheduler
// dispatches to the stage workers (which gather, checksum and submit them)
// as write buffers allow, retires their completions, and commits runs in
// chain order (a block is committed only after its parent). Commits wait
// until none of the save's writes is in flight (the end of the save, or a
// pause in what the scheduler dispatches), so that a commit's syncs never
// leave the devices idle while writes wait.
func (sv *Save) drive() {
	s := sv.s
	d := &saveDriver{sv: sv, queue: make([]sched.IO, 0, sv.writesLeft),
		inflight: make([]int, len(sv.runs)), remaining: make([]int, len(sv.runs))}
	for i, r := range sv.runs {
		d.remaining[i] = r.writes
	}
	for sv.writesLeft > 0 {
		d.stageQueued()
		if sv.writesLeft == 0 {
			break
		}
		if d.busy == 0 {
			// Nothing in flight: the staging goes back to loads and other
			// saves while the scheduler holds the rest back.
			d.releaseSlots()
			d.nextCommit = sv.commitReady(d.nextCommit, d.remaining, d.inflight)
		}
		select {
		case io := <-sv.ios:
			d.queue = append(d.queue, io)
		case b := <-sv.sink:
			d.completed(b)
		}
	}
	sv.timing.WritesNs = s.sched.NowNs() - sv.startNs
	d.releaseSlots()
	sv.commitReady(d.nextCommit, d.remaining, d.inflight)
	sv.timing.DeviceWritesNs = make([]int64, len(s.cfg.Dirs))
	for dev, b := range sv.batches {
		if b.ops > 0 {
			s.sched.ObserveWrites(dev, b.bytes, int(b.ops), b.lastNs-b.firstNs, sv.withReads)
			sv.timing.DeviceWritesNs[dev] = b.lastNs - b.firstNs
		}
	}
	sv.finish()
}

// saveDriver is the driver goroutine's state.
type saveDriver struct {
	sv         *Save
	queue      []sched.IO // dispatched, waiting for a write buffer
	held       []*slot    // staging slots held (each holds a save slot token)
	free       []*wbuf    // idle write buffers of the held slots
	busy       int        // write buffers being staged or written
	inflight   []int      // per run: writes being staged or written
	remaining  []int      // per run: writes not retired
	nextCommit int        // first run not committed or given up
}

// stageQueued hands queued writes to the stage workers while write buffers
// are free; writes of runs given up are retired at once.
func (d *saveDriver) stageQueued() {
	sv := d.sv
	s := sv.s
	for len(d.queue) > 0 {
		io := d.queue[0]
		ri := sv.runOf(io.ReqID)
		r := sv.runs[ri]
		if r.skip || r.failed != nil {
			d.queue = d.queue[1:]
			if r.admitted {
				sv.gathered1()
			}
			d.retire(io, ri)
			continue
		}
		b := d.takeBuf()
		if b == nil {
			return
		}
		d.queue = d.queue[1:]
		b.io, b.run, b.sink = io, ri, sv.sink
		b.ioBytes = (io.Bytes + objmap.BlockBytes - 1) &^ (objmap.BlockBytes - 1)
		now := s.sched.NowNs()
		if sv.timing.FirstWriteNs == 0 {
			sv.timing.FirstWriteNs = max(1, now-sv.startNs)
		}
		sv.batch(s.cat.DeviceOf(r.res.File)).start(now, b.ioBytes)
		sv.withReads = sv.withReads || len(s.loadN) > 0
		d.inflight[ri]++
		d.busy++
		s.stats.writeIOs.Add(1)
		s.stager.submit(stageJob{sv: sv, b: b})
	}
}

// takeBuf returns a free write buffer, taking another staging slot when
// the store's saves hold fewer than their share; nil when none is free now.
// With nothing in flight it blocks for a slot (the save cannot progress
// otherwise, and loads and other saves give theirs back).
func (d *saveDriver) takeBuf() *wbuf {
	if n := len(d.free); n > 0 {
		b := d.free[n-1]
		d.free = d.free[:n-1]
		return b
	}
	s := d.sv.s
	var sl *slot
	if d.busy == 0 {
		s.saveSlotTokens <- struct{}{}
		sl = s.staging.acquire()
	} else {
		select {
		case s.saveSlotTokens <- struct{}{}:
		default:
			return nil
		}
		if sl = s.staging.tryAcquire(); sl == nil {
			<-s.saveSlotTokens
			return nil
		}
	}
	d.held = append(d.held, sl)
	bs := s.saveWbufs(sl)
	d.free = append(d.free, bs[1:]...)
	return bs[0]
}

// releaseSlots gives every held slot back (none of its buffers is busy).
func (d *saveDriver) releaseSlots() {
	s := d.sv.s
	for _, sl := range d.held {
		s.staging.release(sl)
		<-s.saveSlotTokens
	}
	d.held, d.free = d.held[:0], d.free[:0]
}

// completed retires a finished write (or one whose gather failed): a
// failure gives its run up, a success keeps its chunk CRC pieces.
func (d *saveDriver) completed(b *wbuf) {
	sv := d.sv
	s := sv.s
	ri := b.run
	r := sv.runs[ri]
	d.inflight[ri]--
	d.busy--
	if b.direct {
		b.direct = false
		sv.gathered1()
	}
	sv.batch(s.cat.DeviceOf(r.res.File)).lastNs = s.sched.NowNs()
	if r.failed == nil {
		switch {
		case b.gatherErr != nil:
			r.failed = b.gatherErr
		case b.req.Err != nil:
			r.failed = fmt.Errorf("writing run %d layer %d: %w", r.res.ID, b.io.Layer, b.req.Err)
		case b.req.Result != b.ioBytes:
			r.failed = fmt.Errorf("writing run %d layer %d: %d of %d bytes: %w", r.res.ID, b.io.Layer, b.req.Result, b.ioBytes, unix.EIO)
		default:
			r.parts = append(r.parts, b.parts...)
		}
	}
	io := b.io
	d.free = append(d.free, b)
	d.retire(io, ri)
}

func (d *saveDriver) retire(io sched.IO, ri int) {
	d.remaining[ri]--
	d.sv.writesLeft--
	d.sv.s.sched.Complete(io, d.remaining[ri] == 0)
}

// ioBatch is one device's share of a save's writes or a load's reads: bytes
// and ops submitted, from the first submission to the last completion.
type ioBatch struct {
	bytes, ops, firstNs, lastNs int64
}

func (b *ioBatch) start(nowNs, bytes int64) {
	if b.ops == 0 {
		b.firstNs = nowNs
	}
	b.bytes += bytes
	b.ops++
}

// batch is device dev's ioBatch (the store's devices are few: one per
// directory).
func (sv *Save) batch(dev int) *ioBatch { return batchOf(&sv.batches, dev) }

// batchOf is device dev's entry of bs, grown to hold it.
func batchOf(bs *[]ioBatch, dev int) *ioBatch {
	if dev >= len(*bs) {
		*bs = append(*bs, make([]ioBatch, dev+1-len(*bs))...)
	}
	return &(*bs)[dev]
}

// gathered1 counts one write gathered (or given up) and closes Gathered
// after the last (on the driver or a stage worker).
func (sv *Save) gathered1() {
	if sv.gatherLeft.Add(-1) == 0 {
		close(sv.gathered)
	}
}

// commitReady commits (or gives up) runs in chain order from next on, as
// far as their writes are done, and returns the first run not done. Runs
// ready together are committed together: one parent-log sync, one objmap
// Commit (one fdatasync per pool file, one journal group).
func (sv *Save) commitReady(next int, remaining, inflight []int) int {
	ready := func(i int) bool { return remaining[i] == 0 && inflight[i] == 0 }
	cb := sv.s.geo.ChunkBytesPerLayer()
	for next < len(sv.runs) {
		r := sv.runs[next]
		switch {
		case r.done:
			next++
		case !ready(next):
			return next
		case r.mapAbort:
			_ = sv.s.m.Abort(r.res)
			r.done = true
			next++
		case r.failed != nil:
			sv.abortRuns(next, skipCauseOf(r.failed), remaining, inflight)
			sv.s.fails.note(r.failed)
			next++
		case r.skip:
			next++
		default:
			if err := r.chunkCRCs(cb); err != nil {
				r.failed = err // given up on the next pass
				continue
			}
			j := next + 1
			for j < len(sv.runs) && j-next < objmap.MaxCommitBatch && ready(j) {
				if x := sv.runs[j]; x.done || x.mapAbort || x.failed != nil || x.skip {
					break
				} else if err := x.chunkCRCs(cb); err != nil {
					x.failed = err
					break
				}
				j++
			}
			sv.commit(next, j, remaining, inflight)
			next = j
		}
	}
	return next
}

// commit makes runs [i, j) durable (their payload writes all completed):
// objmap writes each header (with its parent) and chunk CRC table,
// fdatasyncs, and journals the commits as one group; then they are served.
// On a failure they and every later run are given up.
func (sv *Save) commit(i, j int, remaining, inflight []int) {
	s := sv.s
	batch := sv.runs[i:j]
	reqs := make([]objmap.CommitRequest, len(batch))
	for k, r := range batch {
		reqs[k] = objmap.CommitRequest{Res: r.res, Chain: sv.chain[r.chainPos : r.chainPos+r.res.Chunks], ChunkCRCs: r.crcs}
		if r.chainPos > 0 {
			reqs[k].Parent, reqs[k].HasParent = sv.chain[r.chainPos-1], true
		}
	}
	if err := s.m.Commit(reqs); err != nil {
		// objmap aborted the reservations unless the journal failed; either
		// way nothing of them is served.
		var blocks []uint64
		for _, r := range batch {
			r.done = true
			blocks = append(blocks, sv.chain[r.chainPos:r.chainPos+r.res.Chunks]...)
		}
		// The later runs' blocks hang below these, and an index abort takes
		// a block's pending descendants with it: abort them first.
		sv.abortRuns(j, skipCauseOf(err), remaining, inflight)
		sv.abortIDs(blocks)
		sv.fail(err, len(blocks))
		return
	}
	for k, r := range batch {
		chain := reqs[k].Chain
		s.cat.Commit(r.res.ID, chain)
		r.done = true
		sv.mu.Lock()
		sv.saved += len(chain)
		sv.mu.Unlock()
		s.stats.savedBlocks.Add(int64(len(chain)))
		s.stats.savedBytes.Add(int64(len(chain)) * s.geo.ChunkBytes())
		s.stats.committedRuns.Add(1)
	}
}

func (sv *Save) finish() {
	sv.timing.DoneNs = sv.s.sched.NowNs() - sv.startNs
	select {
	case <-sv.gathered:
	default:
		close(sv.gathered)
	}
	close(sv.done)
	sv.s.endOp()
	sv.s.mu.Lock()
	sv.s.savesLive--
	sv.s.mu.Unlock()
	sv.s.savesCond.Broadcast()
}
