package winsim

import (
	"container/heap"
	"math/rand/v2"
)

// sim is one Run's state.
type sim struct {
	c   Config
	rng *rand.Rand
	q   events
	ord int64

	n, epl  int
	dev     []int32 // entry -> device
	svcNs   int64   // one read's service time
	lastArr []int64 // per device: the last arrival (the block layer keeps a device's order)
	free    []int64 // per device: when its server is done with what it holds
	busyNs  []int64
	held    []int // per device: reads submitted, completion not yet queued
	maxHeld int
	// heldNs integrates the reads all devices hold over time (heldAll
	// since heldAt).
	heldAll int
	heldAt  int64
	heldNs  float64

	// GPU
	published []bool
	cursor    int // first entry not published
	inflight  int // published, not reaped
	devGPU    []int
	reapedIn  []int   // per layer
	doneAt    []int64 // per layer: its last entry reaped (-1: not yet)
	curLayer  int     // the running I/O kernel's layer
	reads     int     // reaped
	lastReap  int64

	// ring and kick loop
	pub       []int // published, not submitted
	pending   []int // completions queued, not posted
	posted    []int // posted, not reaped (FIFO)
	submitted int
	nPosted   int
	nReaped   int
	startTail int // posted count when the restore began (ramp)
	waiting   bool
	waitSeq   int64
	waitNeed  int
	waitGot   int
	lag       bool
	enters    int
}

func (s *sim) push(at int64, kind evKind, n int, seq int64) {
	s.ord++
	heap.Push(&s.q, event{at: at, kind: kind, n: n, seq: seq, ord: s.ord})
}

func (s *sim) jitter() int64 {
	if s.c.Devices.JitterNs <= 0 {
		return 0
	}
	return s.rng.Int64N(s.c.Devices.JitterNs)
}

// Run models one restore of c. The same Config (Seed included) gives the
// same Result.
func Run(c Config) (Result, error) {
	if err := c.check(); err != nil {
		return Result{}, err
	}
	sh := c.Shape
	s := &sim{c: c, rng: rand.New(rand.NewPCG(c.Seed, 0x77696e73696d)), epl: sh.Extents * sh.ReadsPerExtent}
	s.n = sh.Layers * s.epl
	s.dev = make([]int32, s.n)
	for e := range s.dev {
		l, x := e/s.epl, (e%s.epl)/sh.ReadsPerExtent
		s.dev[e] = int32(sh.device(l, x))
	}
	s.svcNs = int64(float64(sh.ReadBytes)*1e9/c.Devices.BytesPerSec + 0.5)
	s.lastArr, s.free, s.busyNs = make([]int64, sh.Devices), make([]int64, sh.Devices), make([]int64, sh.Devices)
	s.held, s.devGPU = make([]int, sh.Devices), make([]int, sh.Devices)
	s.published = make([]bool, s.n)
	s.reapedIn, s.doneAt = make([]int, sh.Layers), make([]int64, sh.Layers)
	for l := range s.doneAt {
		s.doneAt[l] = -1
	}
	start := c.Pipeline.StartNs
	s.push(start, evPublish, 0, 0)
	if c.Kick.Batch > 0 {
		s.push(start, evEnter, 0, 0)
	}
	for s.q.Len() > 0 && s.reads < s.n {
		ev := heap.Pop(&s.q).(event)
		s.step(ev)
	}
	return s.result(), nil
}

func (s *sim) step(ev event) {
	now := ev.at
	switch ev.kind {
	case evArrive:
		d := s.dev[ev.n]
		st := max(now, s.free[d])
		s.free[d] = st + s.svcNs
		s.busyNs[d] += s.svcNs
		s.push(s.free[d]+s.c.Devices.CompleteNs+s.jitter(), evComplete, ev.n, 0)
	case evComplete:
		s.hold(now, -1)
		s.held[s.dev[ev.n]]--
		if s.c.Kick.Batch == 0 {
			s.post(now, []int{ev.n})
			return
		}
		s.pending = append(s.pending, ev.n)
		if s.waiting {
			s.waitGot++
			if s.waitGot >= s.waitNeed {
				s.push(now, evWake, 0, s.waitSeq)
			}
		}
	case evWake:
		if !s.waiting || ev.seq != s.waitSeq {
			return
		}
		s.waiting = false
		s.post(now, s.pending)
		s.pending = s.pending[:0]
		// The wait ended on completions (the CQ tail moved) or on its
		// timeout (an error return): either way not a lagging GPU.
		s.lag = false
		s.push(now+s.c.Kick.GapNs, evEnter, 0, 0)
	case evEnter:
		s.enter(now)
	case evReap:
		s.reap(now, ev.n)
	case evPublish:
		s.publish(now)
	}
}

// post makes completions visible to the GPU (CQEs posted) and schedules
// their reaping.
func (s *sim) post(now int64, es []int) {
	if len(es) == 0 {
		return
	}
	s.posted = append(s.posted, es...)
	s.nPosted += len(es)
	s.push(now+s.c.GPU.ReapNs, evReap, len(es), 0)
}

// submit hands published SQEs to the devices, in SQ order.
func (s *sim) submit(now int64, es []int) {
	for _, e := range es {
		d := s.dev[e]
		at := max(now+s.c.Devices.SubmitNs+s.jitter(), s.lastArr[d])
		s.lastArr[d] = at
		s.held[d]++
		s.hold(now, 1)
		s.maxHeld = max(s.maxHeld, s.held[d])
		s.push(at, evArrive, e, 0)
	}
	s.submitted += len(es)
}

// enter is one io_uring_enter of tk_kick_loop (exact wait target).
func (s *sim) enter(now int64) {
	k := s.c.Kick
	s.enters++
	tosub := len(s.pub)
	inflight := s.submitted - s.nPosted
	unreaped := s.nPosted - s.nReaped
	if unreaped == 0 {
		s.lag = false
	}
	after := inflight + tosub
	want := min(after/4, k.Batch)
	if k.Ramp > 0 {
		if c := 1 + (s.nPosted-s.startTail)/k.Ramp; want > c {
			want = c
		}
	}
	want = max(want, 1)
	wait := k.BatchWaitNs
	if after == 0 {
		wait = k.IntervalNs
	} else if want == 1 && wait > 4*k.IntervalNs {
		wait = 4 * k.IntervalNs
	}
	minc := want
	if s.lag {
		minc += unreaped
	}
	s.submit(now, s.pub)
	s.pub = s.pub[:0]
	// The wait first runs the task work already queued (posts it), then
	// sleeps until the CQ tail reaches the head it read plus minc.
	head := s.nReaped
	got := len(s.pending)
	s.post(now, s.pending)
	s.pending = s.pending[:0]
	if s.nPosted-head >= minc {
		s.lag = unreaped > 0 && got == 0
		s.push(now+k.GapNs, evEnter, 0, 0)
		return
	}
	s.waiting, s.waitGot, s.waitNeed = true, 0, head+minc-s.nPosted
	s.waitSeq++
	s.push(now+wait, evWake, 0, s.waitSeq)
}

// reap is the GPU reaping n posted completions (in posting order).
func (s *sim) reap(now int64, n int) {
	sh := s.c.Shape
	for _, e := range s.posted[:n] {
		s.inflight--
		s.devGPU[s.dev[e]]--
		l := e / s.epl
		s.reapedIn[l]++
		if s.reapedIn[l] == s.epl {
			s.doneAt[l] = now
		}
	}
	s.posted = s.posted[n:]
	s.nReaped += n
	s.reads += n
	s.lastReap = now
	for s.curLayer < sh.Layers && s.doneAt[s.curLayer] >= 0 {
		s.curLayer++
	}
	s.push(now+s.c.GPU.PublishNs, evPublish, 0, 0)
}

// publish is the GPU writing SQEs into the window's free room: in plan
// order, or with PerDevice the next entries whose device has room.
func (s *sim) publish(now int64) {
	p := s.c.Policy
	sh := s.c.Shape
	if s.curLayer >= sh.Layers {
		return
	}
	bound := min(sh.Layers, s.curLayer+1+p.Lookahead) * s.epl
	room := p.Window - s.inflight
	var out []int
	for e := s.cursor; e < bound && room > 0; e++ {
		if s.published[e] {
			continue
		}
		d := s.dev[e]
		if p.PerDevice > 0 && s.devGPU[d] >= p.PerDevice {
			continue
		}
		s.published[e] = true
		s.devGPU[d]++
		s.inflight++
		room--
		out = append(out, e)
	}
	for s.cursor < s.n && s.published[s.cursor] {
		s.cursor++
	}
	if len(out) == 0 {
		return
	}
	if s.c.Kick.Batch == 0 {
		s.submit(now, out)
		return
	}
	s.pub = append(s.pub, out...)
}

// hold counts reads the devices hold from now on.
func (s *sim) hold(now int64, n int) {
	s.heldNs += float64(s.heldAll) * float64(now-s.heldAt)
	s.heldAll += n
	s.heldAt = now
}

func (s *sim) result() Result {
	sh, pl := s.c.Shape, s.c.Pipeline
	r := Result{ReadsDoneNs: s.lastReap, Enters: s.enters, MaxDeviceInFlight: s.maxHeld}
	if span := s.lastReap - s.c.Pipeline.StartNs; span > 0 {
		r.MeanDeviceInFlight = s.heldNs / float64(span)
	}
	var ready int64
	for l := 0; l < sh.Layers; l++ {
		ready = max(ready, s.doneAt[l]) + pl.LayerCopyNs
		if l == 0 {
			r.FirstLayerNs = ready
		}
	}
	r.TotalNs = ready
	bytes := float64(s.n) * float64(sh.ReadBytes)
	r.IdealNs = int64(bytes * 1e9 / (s.c.Devices.BytesPerSec * float64(sh.Devices)))
	if r.TotalNs > 0 {
		r.Fraction = float64(r.IdealNs) / float64(r.TotalNs)
	}
	r.Busy = make([]float64, sh.Devices)
	for d, b := range s.busyNs {
		if span := r.ReadsDoneNs - pl.StartNs; span > 0 {
			r.Busy[d] = float64(b) / float64(span)
		}
	}
	return r
}
