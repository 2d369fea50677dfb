package sim

// The simulated devices: ops queued per lane, service times, completions,
// and the dispatch of reads and deferred writes.

import (
	"math"

	"github.com/tutti-io/tutti/sched"
)

func (s *state) newOp(write bool, dev, req, layer int, bytes, off int64) int {
	kind := uint64(2)
	if write {
		kind = 3
	}
	o := op{write: write, dev: dev, req: req, layer: layer, bytes: bytes,
		identity: mix(kind ^ uint64(req)<<8 ^ uint64(layer)<<40 ^ uint64(off)<<20 ^ uint64(bytes))}
	p := s.cfg.Device
	n := s.noiseFrac(s.cfg.NoiseFrac, o.identity)
	if write {
		o.workNs = math.Max(float64(bytes)*1e9/(p.WriteBytesPerSec*s.cfg.WriteSkew), 1e9/p.WriteIOPS) * n
	} else {
		o.workNs = math.Max(float64(bytes)*1e9/(p.ReadBytesPerSec*s.cfg.ReadSkew), 1e9/p.ReadIOPS) * n
	}
	if write && s.cfg.FreeWrites {
		o.workNs = 1
	}
	s.ops = append(s.ops, o)
	return len(s.ops) - 1
}

// submit hands a baseline op to its device's policy queue.
func (s *state) submit(oi int) {
	d := &s.devs[s.ops[oi].dev]
	switch s.cfg.Policy {
	case PolicyFIFO:
		d.fifo = append(d.fifo, oi)
	default:
		if s.ops[oi].write {
			d.wpend = append(d.wpend, oi)
		} else {
			d.rpend = append(d.rpend, oi)
		}
	}
	s.pump(s.ops[oi].dev)
}

func (l *lane) idle() bool { return l.cur < 0 && len(l.queue) == 0 }

// pump moves baseline ops onto idle lanes.
func (s *state) pump(di int) {
	d := &s.devs[di]
	switch s.cfg.Policy {
	case PolicyFIFO:
		// Strict order: the head waits for its lane, and everything behind it.
		for len(d.fifo) > 0 {
			o := d.fifo[0]
			ln := laneRead
			if s.ops[o].write {
				ln = laneWrite
			}
			if !d.lanes[ln].idle() {
				return
			}
			d.fifo = d.fifo[1:]
			s.enqueue(di, ln, o)
		}
	case PolicyLoadAll, PolicyRecomputeAll:
		if len(d.rpend) > 0 && d.lanes[laneRead].idle() {
			o := d.rpend[0]
			d.rpend = d.rpend[1:]
			s.enqueue(di, laneRead, o)
		}
		if len(d.wpend) > 0 && len(d.rpend) == 0 && d.lanes[laneRead].idle() && d.lanes[laneWrite].idle() {
			o := d.wpend[0]
			d.wpend = d.wpend[1:]
			s.enqueue(di, laneWrite, o)
		}
	}
}

func (s *state) enqueue(di, ln, oi int) {
	d := &s.devs[di]
	d.lanes[ln].queue = append(d.lanes[ln].queue, oi)
	if d.lanes[ln].cur < 0 {
		s.advance(di)
		s.startNext(di, ln)
		s.retime(di)
	}
}

// advance brings both lanes' progress up to now.
func (s *state) advance(di int) {
	d := &s.devs[di]
	both := d.lanes[0].cur >= 0 && d.lanes[1].cur >= 0
	for ln := range d.lanes {
		l := &d.lanes[ln]
		if l.cur >= 0 {
			dt := float64(s.now - l.lastNs)
			l.remaining = math.Max(0, l.remaining-dt*l.rate)
			if both {
				s.ops[l.cur].overlapNs += dt
			}
		}
		l.lastNs = s.now
	}
}

func (s *state) startNext(di, ln int) {
	l := &s.devs[di].lanes[ln]
	if l.cur >= 0 || len(l.queue) == 0 {
		return
	}
	l.cur = l.queue[0]
	l.queue = l.queue[1:]
	o := &s.ops[l.cur]
	l.remaining = o.workNs
	o.startNs = s.now
}

// retime sets the lanes' rates from who is busy and schedules their ends.
func (s *state) retime(di int) {
	d := &s.devs[di]
	both := d.lanes[0].cur >= 0 && d.lanes[1].cur >= 0
	for ln := range d.lanes {
		l := &d.lanes[ln]
		l.gen++
		if l.cur < 0 {
			continue
		}
		l.rate = 1
		if both {
			if ln == laneRead {
				l.rate = s.cfg.Device.ReadShareUnderWrites
			} else {
				l.rate = s.cfg.Device.WriteShareUnderReads
			}
		}
		s.push(s.now+int64(math.Ceil(l.remaining/l.rate)), evLaneDone, di*2+ln, l.gen)
	}
}

func (s *state) serviceDone(di, ln int) error {
	s.advance(di)
	d := &s.devs[di]
	oi := d.lanes[ln].cur
	d.lanes[ln].cur = -1
	o := &s.ops[oi]
	// Feed the planner what the runtime would measure: an op that ran wholly
	// alone or wholly next to the other direction (mixed ones say little).
	if busy := s.now - o.startNs; s.planner != nil && !s.cfg.NoCalibration && busy > 0 {
		alone, along := o.overlapNs == 0, o.overlapNs >= 0.95*float64(busy)
		switch {
		case o.write && (alone || along):
			s.planner.ObserveWrites(di, o.bytes, 1, busy, along)
		case !o.write && (alone || along):
			s.planner.ObserveReads(di, o.bytes, 1, busy, along)
		}
	}
	s.push(s.now+int64(s.cfg.Device.ReadLatencyNs), evIODone, oi, 0)
	s.startNext(di, ln)
	s.retime(di)
	if s.planner == nil {
		s.pump(di)
	}
	return nil
}

func (s *state) ioDone(oi int) error {
	o := &s.ops[oi]
	if o.write {
		s.res.WriteBytes += o.bytes
	} else {
		s.res.ReadBytes += o.bytes
	}
	if o.hasPlanner {
		if err := s.planner.Complete(o.plannerID, s.now); err != nil {
			return err
		}
	}
	if o.write {
		sv := &s.saves[o.req]
		if sv.writesLeft--; sv.writesLeft == 0 {
			lat := s.now - sv.enqNs
			s.res.MaxSaveNs = max(s.res.MaxSaveNs, lat)
			if s.saveBoundNs > 0 && lat > s.saveBoundNs {
				s.res.SaveBoundMisses++
			}
			for _, id := range sv.ids {
				s.cache.markResident(id, sv.run)
			}
		}
	} else {
		r := &s.reqs[o.req]
		r.readsLeft[o.layer]--
		if s.gpuCur == o.req {
			s.gpuPump()
		}
	}
	return s.dispatch()
}

// dispatch asks the planner for ops (scheduler policy) and arms its wake-up.
func (s *state) dispatch() error {
	if s.planner == nil {
		return nil
	}
	s.ioBuf = s.planner.Dispatch(s.now, s.ioBuf[:0])
	for _, io := range s.ioBuf {
		write := io.Kind == sched.IOWrite
		oi := s.newOp(write, io.Device, int(io.ReqID), io.Layer, io.Bytes, io.OffsetBytes)
		s.ops[oi].plannerID = io.ID
		s.ops[oi].hasPlanner = true
		ln := laneRead
		if write {
			ln = laneWrite
		}
		s.enqueue(io.Device, ln, oi)
	}
	if w := s.planner.NextWakeNs(); w < math.MaxInt64 {
		w = max(w, s.now+1000) // a due save that Dispatch could not start waits for a completion anyway
		if s.wakeAt == 0 || w < s.wakeAt {
			s.wakeAt = w
			s.push(w, evWake, 0, 0)
		}
	}
	return nil
}
