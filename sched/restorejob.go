package sched

import "fmt"

// Whole restores (LoadRequest.Whole). A GPU restore is one request to the
// GPU, which then drives its own queue: the caller cannot submit its reads
// one by one as Dispatch hands them out, nor hold some of them back. So the
// plan is admitted like any other (its reads charged to each device's
// pending budgets, one cursor per device with its per-layer deadlines and
// slack) but its cursors stay off the read heaps: Dispatch hands the plan
// out as one IORestore once every device it reads from can take all of it,
// and the reads stay pending, layer by layer, until the caller reports the
// layers the GPU finished (CompleteLayers). Save dispatch sees them through
// the same pending-read state and slack as IORead (minReadSlackNs,
// saveTimes), so saves wait behind a GPU restore within their bound exactly
// as behind CPU reads.

// restoreJob is one Whole plan.
type restoreJob struct {
	reqID uint64
	curs  []int32 // one cursor per device with reads; cursor.layer = next layer not retired, cursor.pos its first read
	done  int     // layers retired
	entry int32   // its IORestore entry once dispatched, -1 before
}

// queueJob records a Whole plan whose cursors admitCursors created.
func (p *Planner) queueJob(reqID uint64, curs []int32) {
	var ji int32
	if n := len(p.jfree); n > 0 {
		ji = p.jfree[n-1]
		p.jfree = p.jfree[:n-1]
	} else {
		p.jobs = append(p.jobs, restoreJob{})
		ji = int32(len(p.jobs) - 1)
	}
	p.jobs[ji] = restoreJob{reqID: reqID, curs: curs, entry: -1}
	p.jobQ = append(p.jobQ, ji)
}

// jobFits says whether every device of job j can take all of its reads now:
// on a device with saves queued or in flight, the reads in flight (CPU
// reads and dispatched jobs) plus all of this job's must stay within the
// read work that keeps those writes within their bound (saveTimes), the
// rule Dispatch applies to each IORead. A device where it does not is
// marked jobHeld, so its writes are promoted this round.
func (p *Planner) jobFits(j *restoreJob, nowNs int64) bool {
	fits := true
	for _, ci := range j.curs {
		c := &p.cursors[ci]
		d := &p.devs[c.dev]
		if d.saveHead == len(d.saveQ) && d.writesInFlight == 0 {
			continue
		}
		if _, maxReadNs := p.saveTimes(d, nowNs); d.inflightReadNs+d.jobReadNs+c.totalNs() > maxReadNs {
			d.jobHeld = true
			fits = false
		}
	}
	return fits
}

// dispatchJobs appends the Whole plans that fit now to dst, in admission
// order; one that does not fit waits without holding back later ones on
// other devices (a later one on a device that held it is held too).
func (p *Planner) dispatchJobs(nowNs int64, dst []IO) []IO {
	q := p.jobQ[:0]
	for _, ji := range p.jobQ {
		j := &p.jobs[ji]
		if !p.jobFits(j, nowNs) {
			q = append(q, ji)
			continue
		}
		i, ok := p.alloc()
		if !ok {
			q = append(q, ji) // record table full: waits for completions
			continue
		}
		e := &p.entries[i]
		p.seq++
		*e = entry{gen: e.gen, state: stateInFlight, pos: ji, seq: p.seq}
		first := p.cursors[j.curs[0]].deadline[0]
		e.io = IO{ID: p.id(i), Kind: IORestore, ReqID: j.reqID, Device: -1, Layer: -1, Run: -1, DeadlineNs: first}
		j.entry = i
		for _, ci := range j.curs {
			c := &p.cursors[ci]
			d := &p.devs[c.dev]
			_, _, ns := c.remaining()
			d.jobReadNs += ns
			d.jobsInFlight++
			p.stats.ReadsDispatched += int64(len(c.reads))
		}
		p.stats.RestoresDispatched++
		dst = append(dst, e.io)
	}
	p.jobQ = q
	return dst
}

// jobSlackNs is the least slack among device d's Whole reads not retired,
// as minReadSlackNs counts a queued read's.
func (p *Planner) jobSlackNs(d *devState, nowNs int64) float64 {
	return p.cursorSlackNs(d.jobCurs, nowNs)
}

// CompleteLayers retires the reads of layers [0, layers) of a dispatched
// IORestore (the GPU finished them; layers complete in order): they leave
// their devices' pending budgets and slack, so writes queued behind them
// may go. Layers already retired are not retired again; Complete retires
// the rest and the IORestore itself.
func (p *Planner) CompleteLayers(id uint64, layers int, nowNs int64) error {
	e, err := p.restoreEntry(id)
	if err != nil {
		return fmt.Errorf("complete layers of %#x: %w", id, err)
	}
	if layers < 0 || layers > p.cfg.Layers {
		return fmt.Errorf("complete layers of %#x: %d layers of %d: %w", id, layers, p.cfg.Layers, ErrBadRequest)
	}
	p.retireJobLayers(&p.jobs[e.pos], layers)
	return nil
}

// restoreEntry is the in-flight IORestore id names.
func (p *Planner) restoreEntry(id uint64) (*entry, error) {
	i, ok := p.inFlight(id)
	if !ok || p.entries[i].io.Kind != IORestore {
		return nil, ErrUnknownIO
	}
	return &p.entries[i], nil
}

// retireJobLayers retires job j's layers [j.done, layers) on every device.
func (p *Planner) retireJobLayers(j *restoreJob, layers int) {
	for ; j.done < layers; j.done++ {
		for _, ci := range j.curs {
			c := &p.cursors[ci]
			d := &p.devs[c.dev]
			end := int(c.layerAt[j.done+1])
			ns := c.cumNs[end] - c.cumNs[c.pos]
			d.retirePending(end-c.pos, c.cumB[end]-c.cumB[c.pos], ns)
			d.jobReadNs -= ns
			c.pos = end
			c.layer++
		}
	}
}

// finishJob retires what is left of the dispatched job ji (Complete of its
// IORestore) and frees its cursors and record.
func (p *Planner) finishJob(ji int32) {
	j := &p.jobs[ji]
	p.retireJobLayers(j, p.cfg.Layers)
	for _, ci := range j.curs {
		d := &p.devs[p.cursors[ci].dev]
		if d.jobsInFlight--; d.jobsInFlight == 0 {
			d.jobReadNs = 0
		}
		p.unlistJobCursor(d, ci)
	}
	p.freeJob(ji)
}

// unlistJobCursor removes cursor ci from d's job list and frees it.
func (p *Planner) unlistJobCursor(d *devState, ci int32) {
	for k, x := range d.jobCurs {
		if x == ci {
			d.jobCurs = append(d.jobCurs[:k], d.jobCurs[k+1:]...)
			break
		}
	}
	p.releaseCursor(ci)
}

func (p *Planner) freeJob(ji int32) {
	p.jobs[ji] = restoreJob{entry: -1}
	p.jfree = append(p.jfree, ji)
}

// cancelJobs drops the queued (not dispatched) Whole plans of request id
// and returns the reads dropped.
func (p *Planner) cancelJobs(id uint64) int {
	n := 0
	q := p.jobQ[:0]
	for _, ji := range p.jobQ {
		j := &p.jobs[ji]
		if j.reqID != id {
			q = append(q, ji)
			continue
		}
		for _, ci := range j.curs {
			d := &p.devs[p.cursors[ci].dev]
			n += p.dropCursor(d, &p.cursors[ci])
			p.unlistJobCursor(d, ci)
		}
		p.freeJob(ji)
	}
	p.jobQ = q
	return n
}
