package sim

import (
	"fmt"
	"math"

	"github.com/tutti-io/tutti/sched"
)

type evKind uint8

const (
	evArrival   evKind = iota + 1
	evLayerDone        // a = request, b = layer
	evLaneDone         // a = device·2 + lane, b = lane generation
	evIODone           // a = op
	evWake             // planner's NextWakeNs
)

type event struct {
	t    int64
	seq  uint64
	kind evKind
	a, b int
}

type eventHeap struct{ h []event }

func (q *eventHeap) Len() int { return len(q.h) }

func (q *eventHeap) less(i, j int) bool {
	if q.h[i].t != q.h[j].t {
		return q.h[i].t < q.h[j].t
	}
	return q.h[i].seq < q.h[j].seq
}

func (q *eventHeap) push(e event) {
	q.h = append(q.h, e)
	for j := len(q.h) - 1; j > 0; {
		p := (j - 1) / 2
		if !q.less(j, p) {
			break
		}
		q.h[j], q.h[p] = q.h[p], q.h[j]
		j = p
	}
}

func (q *eventHeap) pop() event {
	top := q.h[0]
	n := len(q.h) - 1
	q.h[0] = q.h[n]
	q.h = q.h[:n]
	for j := 0; ; {
		l := 2*j + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q.less(r, l) {
			m = r
		}
		if !q.less(m, j) {
			break
		}
		q.h[j], q.h[m] = q.h[m], q.h[j]
		j = m
	}
	return top
}

const (
	laneRead  = 0
	laneWrite = 1
)

type op struct {
	write      bool
	dev        int
	req        int // request index (read) or save index (write)
	layer      int
	bytes      int64
	workNs     float64 // lane time at full rate
	plannerID  uint64
	startNs    int64
	overlapNs  float64 // time in service while the other lane was busy
	identity   uint64
	hasPlanner bool
}

type lane struct {
	queue     []int // ops waiting, FIFO
	cur       int   // op in service, −1 none
	remaining float64
	rate      float64
	lastNs    int64
	gen       int
}

type device struct {
	lanes [2]lane
	fifo  []int // baseline policies: ops not yet handed to a lane
	rpend []int // load-all / recompute-all: reads and writes waiting
	wpend []int
}

type reqState struct {
	req       *Request
	cached    int // P
	load      int // k
	segs      []sched.Run
	readsLeft []int // per layer
	tokens    int   // computed
	startPos  int
	layerAt   int64
	finishNs  int64
	done      bool

	predGPUNs, predLayerNs int64 // scheduler: the plan's GPU time and layer time
}

type save struct {
	enqNs      int64
	writesLeft int
	ids        []uint64
	run        int
}

type state struct {
	cfg     Config
	now     int64
	events  eventHeap
	seq     uint64
	nEvents int
	reqs    []reqState
	devs    []device
	ops     []op
	saves   []save
	cache   *lru
	planner *sched.Planner
	ioBuf   []sched.IO
	res     Result

	saveBoundNs int64
	wakeAt      int64 // pending wake event time, 0 none

	// GPU
	gpuQueue   []int
	gpuHead    int
	gpuCur     int // −1 idle
	gpuLayer   int
	gpuBusy    bool
	gpuWaiting int64 // start of the current wait for reads, −1 none
}

func (s *state) push(t int64, k evKind, a, b int) {
	s.seq++
	s.events.push(event{t: t, seq: s.seq, kind: k, a: a, b: b})
}

func (s *state) handle(ev event) error {
	switch ev.kind {
	case evArrival:
		return s.arrive(ev.a)
	case evLayerDone:
		return s.layerDone(ev.a, ev.b)
	case evLaneDone:
		d, ln := ev.a/2, ev.a%2
		if s.devs[d].lanes[ln].gen != ev.b {
			return nil // re-timed since
		}
		return s.serviceDone(d, ln)
	case evIODone:
		return s.ioDone(ev.a)
	case evWake:
		if ev.t != s.wakeAt {
			return nil
		}
		s.wakeAt = 0
		return s.dispatch()
	}
	return fmt.Errorf("unknown event %+v", ev)
}

// ---- requests and the GPU ----

func (s *state) arrive(i int) error {
	r := &s.reqs[i]
	B := s.cfg.BlockTokens
	ids := r.req.BlockIDs
	P := 0
	for P < len(ids) && s.cache.resident(ids[P]) {
		P++
	}
	P = min(P, max(0, (r.req.InputTokens-1)/B)) // at least one token is computed
	for j := 0; j < P; j++ {
		s.cache.touch(ids[j])
	}
	r.cached = P
	s.res.CachedBlocks += int64(P)
	// Segments: consecutive blocks of one saved run.
	var prevRun, prevPos int = -1, -1
	for j := 0; j < P; j++ {
		b := s.cache.get(ids[j])
		if n := len(r.segs); n > 0 && b.run == prevRun && b.pos == prevPos+1 {
			r.segs[n-1].Blocks++
		} else {
			r.segs = append(r.segs, sched.Run{Device: b.dev, Blocks: 1, BytesPerLayerPerBlock: s.cfg.BytesPerLayerPerBlock})
		}
		prevRun, prevPos = b.run, b.pos
	}
	uncached := max(1, r.req.InputTokens-P*B)

	switch s.cfg.Policy {
	case PolicyScheduler:
		ready := s.gpuReadyEstimate()
		plan, err := s.planner.PlanLoad(sched.LoadRequest{ID: uint64(i), NowNs: s.now, ComputeReadyNs: ready,
			Runs: r.segs, UncachedTokens: uncached, SegmentsOnly: true})
		if err != nil {
			return err
		}
		r.load = plan.LoadBlocks
		r.predGPUNs = plan.FirstTokenNs - plan.ComputeStartNs
		r.predLayerNs = plan.LayerComputeNs
		if r.load > 0 {
			r.readsLeft = make([]int, s.cfg.Layers)
			for l := range r.readsLeft {
				r.readsLeft[l] = len(plan.Segments)
			}
		}
	case PolicyFIFO, PolicyLoadAll:
		r.load = P
		if P > 0 {
			r.readsLeft = make([]int, s.cfg.Layers)
			for l := 0; l < s.cfg.Layers; l++ {
				for _, sg := range r.segs {
					bytes := int64(sg.Blocks) * sg.BytesPerLayerPerBlock
					s.submit(s.newOp(false, sg.Device, i, l, bytes, 0))
					r.readsLeft[l]++
				}
			}
		}
	case PolicyRecomputeAll:
		r.load = 0
	}
	s.res.LoadedBlocks += int64(r.load)
	r.startPos = r.load * B
	r.tokens = r.req.InputTokens - r.startPos
	s.gpuQueue = append(s.gpuQueue, i)
	if err := s.dispatch(); err != nil {
		return err
	}
	s.gpuPump()
	return nil
}

// gpuReadyEstimate is what an engine knows of when a new prefill would start:
// the running one's remaining layers at the planned layer time, plus the
// planned GPU time of those queued before it.
func (s *state) gpuReadyEstimate() int64 {
	t := s.now
	if s.gpuCur >= 0 {
		r := &s.reqs[s.gpuCur]
		t = max(t, r.layerAt+int64(s.cfg.Layers-s.gpuLayer)*r.predLayerNs)
	}
	for _, i := range s.gpuQueue[s.gpuHead:] {
		t += s.reqs[i].predGPUNs
	}
	return t
}

func (s *state) trueLayerNs(i, layer int) int64 {
	r := &s.reqs[i]
	base := s.cfg.Compute.LayerNs(r.tokens, r.startPos) * s.cfg.ComputeSkew
	return max(1, int64(math.Round(base*s.noiseFrac(s.cfg.ComputeNoiseFrac, 1, uint64(i), uint64(layer)))))
}

func (s *state) gpuPump() {
	if s.gpuBusy {
		return
	}
	if s.gpuCur < 0 {
		if s.gpuHead == len(s.gpuQueue) {
			return
		}
		s.gpuCur = s.gpuQueue[s.gpuHead]
		s.gpuHead++
		s.gpuLayer = 0
	}
	r := &s.reqs[s.gpuCur]
	if r.readsLeft != nil && r.readsLeft[s.gpuLayer] > 0 {
		if s.gpuWaiting < 0 {
			s.gpuWaiting = s.now
		}
		return
	}
	if s.gpuWaiting >= 0 {
		s.res.GPUIdleNs += s.now - s.gpuWaiting
		s.gpuWaiting = -1
	}
	s.gpuBusy = true
	r.layerAt = s.now
	s.push(s.now+s.trueLayerNs(s.gpuCur, s.gpuLayer), evLayerDone, s.gpuCur, s.gpuLayer)
}

func (s *state) layerDone(i, layer int) error {
	r := &s.reqs[i]
	s.gpuBusy = false
	if s.planner != nil && !s.cfg.NoCalibration {
		s.planner.ObserveLayer(r.tokens, r.startPos, s.now-r.layerAt)
	}
	s.gpuLayer++
	if s.gpuLayer == s.cfg.Layers {
		r.finishNs, r.done = s.now, true
		s.gpuCur = -1
		if err := s.saveNew(i); err != nil {
			return err
		}
	}
	s.gpuPump()
	return nil
}

// ---- saves ----

func (s *state) saveNew(i int) error {
	r := &s.reqs[i]
	var ids []uint64
	for _, id := range r.req.BlockIDs {
		if !s.cache.has(id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	si := len(s.saves)
	dev := si % s.cfg.Devices
	sv := save{enqNs: s.now, run: si}
	if s.planner != nil {
		t, err := s.planner.EnqueueSave(sched.SaveRequest{ID: uint64(si), NowNs: s.now, Device: dev,
			Blocks: len(ids), BytesPerLayerPerBlock: s.cfg.BytesPerLayerPerBlock})
		if err != nil {
			return err
		}
		s.res.DroppedBlocks += int64(len(ids) - t.Blocks)
		if t.Blocks < len(ids) {
			if s.res.CutBlocks == nil {
				s.res.CutBlocks = map[sched.Reason]int64{}
			}
			s.res.CutBlocks[t.Reason] += int64(len(ids) - t.Blocks)
		}
		ids = ids[:t.Blocks]
		sv.writesLeft = t.Writes
	} else {
		per := int64(len(ids)) * s.cfg.BytesPerLayerPerBlock
		for l := 0; l < s.cfg.Layers; l++ {
			for off := int64(0); off < per; off += s.cfg.MaxWriteIOBytes {
				s.submit(s.newOp(true, dev, si, l, min(s.cfg.MaxWriteIOBytes, per-off), off))
				sv.writesLeft++
			}
		}
	}
	s.res.SavedBlocks += int64(len(ids))
	sv.ids = ids
	for j, id := range ids {
		s.cache.insert(id, blockInfo{run: si, pos: j, dev: dev, pending: true})
	}
	s.saves = append(s.saves, sv)
	return s.dispatch()
}

// ---- devices ----

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

// ---- LRU over block ids ----

type blockInfo struct {
	run, pos, dev int
	pending       bool
}

type lruNode struct {
	id         uint64
	info       blockInfo
	prev, next int32
}

type lru struct {
	capacity int
	idx      map[uint64]int32
	nodes    []lruNode
	free     []int32
	head     int32 // most recent; −1 empty
	tail     int32
}

func newLRU(capacity int) *lru {
	return &lru{capacity: capacity, idx: make(map[uint64]int32), head: -1, tail: -1}
}

func (c *lru) has(id uint64) bool { _, ok := c.idx[id]; return ok }

func (c *lru) resident(id uint64) bool {
	n, ok := c.idx[id]
	return ok && !c.nodes[n].info.pending
}

func (c *lru) get(id uint64) blockInfo { return c.nodes[c.idx[id]].info }

func (c *lru) unlink(n int32) {
	x := &c.nodes[n]
	if x.prev >= 0 {
		c.nodes[x.prev].next = x.next
	} else {
		c.head = x.next
	}
	if x.next >= 0 {
		c.nodes[x.next].prev = x.prev
	} else {
		c.tail = x.prev
	}
}

func (c *lru) pushFront(n int32) {
	x := &c.nodes[n]
	x.prev, x.next = -1, c.head
	if c.head >= 0 {
		c.nodes[c.head].prev = n
	}
	c.head = n
	if c.tail < 0 {
		c.tail = n
	}
}

func (c *lru) touch(id uint64) {
	if n, ok := c.idx[id]; ok {
		c.unlink(n)
		c.pushFront(n)
	}
}

func (c *lru) insert(id uint64, info blockInfo) {
	if n, ok := c.idx[id]; ok {
		c.nodes[n].info = info
		c.touch(id)
		return
	}
	for len(c.idx) >= c.capacity {
		t := c.tail
		c.unlink(t)
		delete(c.idx, c.nodes[t].id)
		c.free = append(c.free, t)
	}
	var n int32
	if k := len(c.free); k > 0 {
		n = c.free[k-1]
		c.free = c.free[:k-1]
	} else {
		c.nodes = append(c.nodes, lruNode{})
		n = int32(len(c.nodes) - 1)
	}
	c.nodes[n] = lruNode{id: id, info: info}
	c.idx[id] = n
	c.pushFront(n)
}

// markResident flips a block saved by run to resident, unless it was evicted
// (or re-saved by another run) meanwhile.
func (c *lru) markResident(id uint64, run int) {
	if n, ok := c.idx[id]; ok && c.nodes[n].info.run == run {
		c.nodes[n].info.pending = false
	}
}
