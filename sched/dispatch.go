package sched

import (
	"fmt"
	"math"
)

// minReadSlackNs is the least slack among the device's pending reads, each
// discounted by SlackFrac of its remaining horizon, less the amount by which
// the device runs behind the plans that admitted them.
func (p *Planner) minReadSlackNs(d *devState, now int64) float64 {
	m := p.cursorSlackNs(d.readQ, now)
	f := p.cfg.SlackFrac
	for _, i := range d.inflightRd {
		e := &p.entries[i]
		m = min(m, e.slackNs-f*float64(max(0, e.plannedDoneNs-now)))
	}
	m = min(m, p.jobSlackNs(d, now))
	tail := float64(now) + d.pendingReadNs + (1-d.model.ReadShare())*d.inflightWriteNs
	if drift := tail - float64(d.plannedTailNs); drift > 0 {
		m -= drift
	}
	return m
}

// cursorSlackNs is the least slack of the cursors' remaining reads, each
// discounted by SlackFrac of its remaining horizon (+Inf for none).
func (p *Planner) cursorSlackNs(curs []int32, nowNs int64) float64 {
	m := math.Inf(1)
	f := p.cfg.SlackFrac
	for _, ci := range curs {
		c := &p.cursors[ci]
		m = min(m, c.slackMin[c.pos], c.slackMinH[c.pos]+f*float64(nowNs))
	}
	return m
}

// NextWakeNs is when Dispatch must be called next even if nothing completes
// (a queued save reaches its promotion time); math.MaxInt64 when never.
func (p *Planner) NextWakeNs() int64 {
	at := int64(math.MaxInt64)
	for i := range p.devs {
		d := &p.devs[i]
		if d.saveHead < len(d.saveQ) && d.writesInFlight < d.cfg.MaxWritesInFlight {
			promoteAt, _ := p.saveTimes(d, 0)
			at = min(at, promoteAt)
		}
	}
	return at
}

// Dispatch appends to dst the ops to submit now and marks them in flight.
// Per device: reads by earliest deadline (least slack) up to the read queue
// depth and bytes; then queued save writes, oldest first, up to the write
// depth and bytes, each only if the device has no pending reads, or the
// pending reads keep SlackMarginNs of slack after the delay the write causes
// them ((1 − ReadShare) × its time), or the save queue reached its promotion
// time. Whole plans go first, each as one IORestore once every device it
// reads from can take all of its reads under the same rule (dispatchJobs).
// Call it after PlanLoad, EnqueueSave, every Complete and CompleteLayers,
// and at NextWakeNs.
func (p *Planner) Dispatch(nowNs int64, dst []IO) []IO {
	dst = p.dispatchJobs(nowNs, dst)
	for di := range p.devs {
		d := &p.devs[di]
		maxReadNs := math.Inf(1)
		if d.saveHead < len(d.saveQ) || d.writesInFlight > 0 {
			_, maxReadNs = p.saveTimes(d, nowNs)
		}
		// A read (or a whole restore) waits so that the queued saves keep their bound.
		held := d.jobHeld
		d.jobHeld = false
		for len(d.readQ) > 0 && d.readsInFlight < d.cfg.MaxReadsInFlight {
			ci := d.readQ[0]
			c := &p.cursors[ci]
			rd := c.reads[c.pos]
			sg := c.segs[rd.seg]
			if d.readsInFlight > 0 && d.readBytesInFlight+sg.Bytes > d.cfg.MaxReadBytesInFlight {
				break
			}
			if d.inflightReadNs+d.jobReadNs+rd.ns > maxReadNs {
				held = true
				break
			}
			i, ok := p.alloc()
			if !ok {
				break // record table full: the rest waits for completions
			}
			e := &p.entries[i]
			done := c.t0 + c.cumNs[c.pos+1]
			p.seq++
			*e = entry{gen: e.gen, state: stateInFlight, svcNs: rd.ns, plannedDoneNs: ceilNs(done), seq: p.seq}
			e.io = IO{ID: p.id(i), Kind: IORead, ReqID: c.reqID, Device: di, Layer: int(rd.layer), Run: sg.Run,
				Blocks: sg.Blocks, Bytes: sg.Bytes, DeadlineNs: c.deadline[rd.layer]}
			e.slackNs = float64(e.io.DeadlineNs) - done
			if c.pos++; c.pos == len(c.reads) {
				p.heapPop(d)
				p.releaseCursor(ci)
			} else {
				p.heapDown(d.readQ, 0)
			}
			e.pos = int32(len(d.inflightRd))
			d.inflightRd = append(d.inflightRd, i)
			d.readsInFlight++
			d.readBytesInFlight += e.io.Bytes
			d.inflightReadNs += e.svcNs
			p.stats.ReadsDispatched++
			dst = append(dst, e.io)
		}
		if d.saveHead == len(d.saveQ) {
			continue
		}
		slack := math.Inf(1)
		if d.pendingReads > 0 {
			slack = p.minReadSlackNs(d, nowNs)
		}
		promoteAt, _ := p.saveTimes(d, nowNs)
		if held {
			p.stats.ReadHolds++
			promoteAt = nowNs
		}
		for d.saveHead < len(d.saveQ) && d.writesInFlight < d.cfg.MaxWritesInFlight {
			i := d.saveQ[d.saveHead]
			e := &p.entries[i]
			if d.writesInFlight > 0 && d.writeBytesInFlight+e.io.Bytes > d.cfg.MaxWriteBytesInFlight {
				break
			}
			promoted := nowNs >= promoteAt
			if !promoted && d.pendingReads > 0 {
				cost := (1 - d.model.ReadShare()) * e.svcNs / d.model.WriteShare()
				if slack-cost < float64(p.cfg.SlackMarginNs) {
					break
				}
				slack -= cost
			}
			d.saveHead++
			e.state = stateInFlight
			e.io.Promoted = promoted
			d.writesInFlight++
			d.writeBytesInFlight += e.io.Bytes
			d.queuedSaveNs -= e.svcNs
			d.inflightWriteNs += e.svcNs
			d.inflightWr = append(d.inflightWr, i)
			p.stats.WritesDispatched++
			if promoted {
				p.stats.WritesPromoted++
			}
			dst = append(dst, e.io)
		}
		if d.saveHead > 64 && d.saveHead*2 > len(d.saveQ) {
			n := copy(d.saveQ, d.saveQ[d.saveHead:])
			d.saveQ, d.saveHead = d.saveQ[:n], 0
		}
		if d.saveHead == len(d.saveQ) {
			d.saveQ, d.saveHead, d.queuedSaveNs = d.saveQ[:0], 0, 0
		}
	}
	return dst
}

// Complete retires an op that Dispatch handed out (successfully or not: a
// failed read is the runtime's to handle, e.g. recompute the layer). It frees
// the op's queue slot and budgets (an IORestore: every read not retired by
// CompleteLayers); feed the device model with ObserveReads and
// ObserveWrites.
func (p *Planner) Complete(id uint64, nowNs int64) error {
	i, ok := p.inFlight(id)
	if !ok {
		return fmt.Errorf("complete io %#x: %w", id, ErrUnknownIO)
	}
	e := &p.entries[i]
	if e.io.Kind == IORestore {
		p.finishJob(e.pos)
		p.release(i)
		return nil
	}
	d := &p.devs[e.io.Device]
	switch e.io.Kind {
	case IORead:
		last := d.inflightRd[len(d.inflightRd)-1]
		d.inflightRd[e.pos] = last
		p.entries[last].pos = e.pos
		d.inflightRd = d.inflightRd[:len(d.inflightRd)-1]
		d.readsInFlight--
		d.readBytesInFlight -= e.io.Bytes
		d.inflightReadNs -= e.svcNs
		if d.readsInFlight == 0 {
			d.inflightReadNs = 0
		}
		p.retireRead(d, e)
	case IOWrite:
		d.writesInFlight--
		d.writeBytesInFlight -= e.io.Bytes
		d.pendingSaveBytes -= e.io.Bytes
		d.inflightWriteNs -= e.svcNs
		for j, w := range d.inflightWr {
			if w == i {
				d.inflightWr = append(d.inflightWr[:j], d.inflightWr[j+1:]...)
				break
			}
		}
		if d.writesInFlight == 0 {
			d.inflightWriteNs = 0
		}
	}
	p.release(i)
	return nil
}

func (p *Planner) retireRead(d *devState, e *entry) { d.retirePending(1, e.io.Bytes, e.svcNs) }

// retirePending takes reads (of bytes, costing ns) off d's pending budgets:
// completed, retired by CompleteLayers, or dropped.
func (d *devState) retirePending(reads int, bytes int64, ns float64) {
	d.pendingReadBytes -= bytes
	d.pendingReadNs -= ns
	d.pendingReads -= reads
	if d.pendingReads == 0 {
		// Start the next plan from exact zeros, not accumulated float error.
		d.pendingReadNs, d.plannedTailNs = 0, 0
	}
}

// inFlight is the entry id names, if it is in flight.
func (p *Planner) inFlight(id uint64) (int32, bool) {
	i := uint32(id)
	if int64(i) >= int64(len(p.entries)) || p.entries[i].gen != uint32(id>>32) || p.entries[i].state != stateInFlight {
		return 0, false
	}
	return int32(i), true
}
