package sched

import (
	"errors"
	"fmt"
	"math"
)

// IOKind says which way an IO goes.
type IOKind uint8

const (
	IORead  IOKind = iota + 1 // restore part of a cached prefix
	IOWrite                   // save part of a new run
)

func (k IOKind) String() string {
	switch k {
	case IORead:
		return "read"
	case IOWrite:
		return "write"
	}
	return fmt.Sprintf("IOKind(%d)", uint8(k))
}

// IO is one operation for the runtime to submit. It is a value: the planner
// keeps its own record, keyed by ID, until Complete(ID).
type IO struct {
	ID     uint64 // planner handle; pass to Complete
	Kind   IOKind
	ReqID  uint64 // LoadRequest.ID or SaveRequest.ID
	Device int
	Layer  int
	// Reads: Run indexes LoadRequest.Runs; the read covers the run's first
	// Blocks blocks of this layer's object (one contiguous range).
	Run    int
	Blocks int
	// Writes: OffsetBytes is where in the layer's object (of the admitted
	// blocks) this write starts; Bytes its length.
	OffsetBytes int64
	Bytes       int64
	// DeadlineNs: reads, when compute needs the layer (the latest compute
	// start of the layer that does not delay the request's first token);
	// writes, the save's bound.
	DeadlineNs int64
	Promoted   bool // a write dispatched because its bound came near, not into slack
}

// Reason says why part of a request was not admitted.
type Reason uint8

const (
	ReasonNone            Reason = iota
	ReasonRecomputeFaster        // loading these blocks would not make the first token earlier
	ReasonReadBudget             // the device's pending read bytes (MaxPendingReadBytes) are full
	ReasonQueueFull              // the planner's op table (MaxPendingIOs) is full
	ReasonSaveBudget             // the device's pending save bytes (MaxPendingSaveBytes) are full
	ReasonSaveBound              // the device cannot write more within the save bound
)

func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonRecomputeFaster:
		return "recompute-faster"
	case ReasonReadBudget:
		return "read-budget"
	case ReasonQueueFull:
		return "queue-full"
	case ReasonSaveBudget:
		return "save-budget"
	case ReasonSaveBound:
		return "save-bound"
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Rejection names cached blocks [FromBlock, ToBlock) that the plan does not
// load (they are recomputed) and why.
type Rejection struct {
	FromBlock, ToBlock int
	Reason             Reason
}

// Run is a stretch of the cached prefix stored as one extent: its blocks are
// consecutive in the prefix and a leading part of it is one read per layer.
type Run struct {
	Device                int   // index into Config.Devices
	Blocks                int   // chain blocks in the run (≥ 1)
	BytesPerLayerPerBlock int64 // bytes of one block of one layer (K and V together)
}

// LoadRequest describes one prefill that may restore a cached prefix.
type LoadRequest struct {
	ID    uint64
	NowNs int64
	// ComputeReadyNs is the engine's estimate of when this request's prefill
	// can start computing (its turn on the GPU); ≤ NowNs means now. Reads
	// overlap the wait, so a later start makes loading cheaper.
	ComputeReadyNs int64
	Runs           []Run // the cached prefix, in prefix order
	UncachedTokens int   // tokens after the cached prefix, always computed (≥ 0)
	// SegmentsOnly leaves Plan.Reads nil: callers that use Plan.Segments save
	// the O(layers × runs) list (the planner itself never needs it).
	SegmentsOnly bool
}

// Plan is what PlanLoad decided. Blocks [0, LoadBlocks) are loaded; blocks
// [LoadBlocks, CachedBlocks) are recomputed together with the uncached suffix:
// prefill computes ComputeTokens tokens from position ComputeStartPos, and
// layer l's compute may start once its reads completed (Load.WaitLayer).
type Plan struct {
	ID              uint64
	CachedBlocks    int
	LoadBlocks      int
	ComputeStartPos int
	ComputeTokens   int

	LayerComputeNs   int64 // predicted compute time of one layer
	ComputeStartNs   int64 // predicted start of layer 0's compute
	FirstTokenNs     int64 // predicted end of the last layer (the first token, less sampling)
	RecomputeAllNs   int64 // prediction with LoadBlocks = 0
	LoadAdmissibleNs int64 // prediction when loading everything admissible

	// Segments are the reads of every layer: for each layer l and segment s,
	// one read of s.Bytes from layer l's object of run s.Run (its first
	// s.Blocks blocks). The planner keeps them (O(1) per plan and device, not
	// per read) and hands them out through Dispatch in least-slack order.
	Segments []Segment
	// Reads lists the same reads, layer-major (all segments of layer 0, then
	// layer 1, ...), for callers that count them per layer; ID is 0 here (the
	// planner assigns IDs at Dispatch). len(Reads) == Layers × len(Segments).
	Reads []IO
	// Per layer (nil when LoadBlocks == 0): the reads' deadline and their
	// predicted completion; LayerReadDoneNs[l] ≤ LayerDeadlineNs[l].
	LayerDeadlineNs []int64
	LayerReadDoneNs []int64

	// NotAdmitted covers [LoadBlocks, CachedBlocks) exactly, in order.
	NotAdmitted []Rejection
}

// Segment is the part of one run that a plan loads, read once per layer.
type Segment struct {
	Run    int // index into LoadRequest.Runs
	Device int
	Blocks int   // the run's first Blocks blocks
	Bytes  int64 // per layer
}

// SaveRequest asks to save a new run of Blocks chain blocks to Device. Every
// layer's object (Blocks × BytesPerLayerPerBlock bytes) is written; the writes
// are cut at Config.MaxWriteIOBytes.
type SaveRequest struct {
	ID                    uint64
	NowNs                 int64
	Device                int
	Blocks                int
	BytesPerLayerPerBlock int64
}

// SaveTicket is what EnqueueSave admitted: the leading Blocks blocks (0 =
// nothing; the caller then drops the save and counts it). Admitted writes are
// dispatched by DeadlineNs at the latest.
type SaveTicket struct {
	Blocks     int
	Writes     int
	DeadlineNs int64
	Reason     Reason // why blocks were cut; ReasonNone when all were admitted
}

// Stats are counters since NewPlanner.
type Stats struct {
	Plans, CachedBlocks, LoadedBlocks, BudgetCutBlocks int64
	ReadsDispatched, WritesDispatched, WritesPromoted  int64
	Saves, SaveBlocks, SaveCutBlocks                   int64
	Cancelled                                          int64
}

// ErrUnknownIO is returned by Complete for an ID that is not in flight.
var ErrUnknownIO = errors.New("sched: unknown or not-in-flight io")

// ErrBadRequest reports a malformed LoadRequest or SaveRequest.
var ErrBadRequest = errors.New("sched: bad request")

const (
	stateFree uint8 = iota
	stateQueued
	stateInFlight
)

type entry struct {
	io            IO
	gen           uint32
	state         uint8
	pos           int32   // index in the device's in-flight read list
	svcNs         float64 // predicted device busy time at admission
	slackNs       float64 // reads: deadline − planned completion
	plannedDoneNs int64   // reads
	seq           uint64  // FIFO tie-break
}

type devState struct {
	cfg   DeviceConfig
	model DeviceModel

	readQ      []int32 // cursors, min-heap by (deadline of their next read, seq)
	inflightRd []int32 // entries
	saveQ      []int32 // FIFO = EDF, the bound is the same for all saves
	saveHead   int

	readsInFlight, writesInFlight         int
	readBytesInFlight, writeBytesInFlight int64
	pendingReadBytes, pendingSaveBytes    int64
	pendingReadNs                         float64 // admitted, not completed reads
	queuedSaveNs                          float64 // queued writes, at full write rate
	inflightWriteNs                       float64
	plannedTailNs                         int64 // latest planned completion among pending reads
	pendingReads                          int

	// scratch of PlanLoad
	t0, d float64
	nseg  int
}

// cursor is the queued reads of one plan on one device: for layer = 0..L-1,
// for each of its segments, one read. Its place in the device's heap is the
// deadline of its next read.
type cursor struct {
	reqID     uint64
	dev       int
	segs      []Segment
	segNs     []float64 // predicted busy time of each segment's read
	segCumNs  []float64 // len(segs)+1 prefix sums of segNs
	segCumB   []int64   // len(segs)+1 prefix sums of bytes
	deadline  []int64   // per layer, shared by the plan's cursors
	t0, dNs   float64   // layer l's j-th read planned done at t0 + l·dNs + segCumNs[j+1]
	slackMin  []float64 // suffix minima over layers ≥ l of deadline − planned done
	slackMinH []float64 // suffix minima of deadline − (1+SlackFrac)·planned done
	layer, si int       // next read
	seq       uint64
	live      bool
}

// remaining returns the reads, bytes and busy time not yet dispatched.
func (c *cursor) remaining(layers int) (n int, bytes int64, ns float64) {
	left := layers - c.layer
	n = left*len(c.segs) - c.si
	bytes = int64(left)*c.segCumB[len(c.segs)] - c.segCumB[c.si]
	ns = float64(left)*c.segCumNs[len(c.segs)] - c.segCumNs[c.si]
	return n, bytes, ns
}

// Planner is the scheduler's state: models, per-device queues and budgets.
// Single goroutine: not safe for concurrent use (the runtime's I/O goroutine
// owns it, or guards it with one mutex). It never blocks, starts no
// goroutines and reads no clock: time comes in as nanosecond values, which
// must not go backwards between calls.
type Planner struct {
	cfg     Config
	compute ComputeModel
	devs    []devState
	entries []entry
	free    []int32
	cursors []cursor
	cfree   []int32
	seq     uint64
	stats   Stats
}

// NewPlanner validates cfg and fills defaults.
func NewPlanner(cfg Config) (*Planner, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("new planner: %w", err)
	}
	p := &Planner{cfg: c, compute: c.Compute, devs: make([]devState, len(c.Devices))}
	for i, dc := range c.Devices {
		m, err := NewDeviceModel(dc.Profile)
		if err != nil {
			return nil, fmt.Errorf("new planner: device %d: %w", i, err)
		}
		p.devs[i] = devState{cfg: dc, model: m}
	}
	return p, nil
}

// Config returns the configuration with defaults filled in.
func (p *Planner) Config() Config { return p.cfg }

// Compute returns the current compute model (profile and online correction).
func (p *Planner) Compute() ComputeModel { return p.compute }

// Device returns device d's current model.
func (p *Planner) Device(d int) DeviceModel { return p.devs[d].model }

// Stats returns the counters.
func (p *Planner) Stats() Stats { return p.stats }

// ObserveLayer feeds one measured layer compute time (tokens computed from
// startPos) to the compute model; see ComputeModel.Observe.
func (p *Planner) ObserveLayer(tokens, startPos int, measuredNs int64) {
	p.compute.Observe(tokens, startPos, measuredNs)
}

// ObserveReads feeds a batch of completed reads on device d; see
// DeviceModel.ObserveReads. Out-of-range devices are ignored.
func (p *Planner) ObserveReads(d int, bytes int64, ops int, busyNs int64, withWrites bool) {
	if d >= 0 && d < len(p.devs) {
		p.devs[d].model.ObserveReads(bytes, ops, busyNs, withWrites)
	}
}

// ObserveWrites feeds a batch of completed writes on device d.
func (p *Planner) ObserveWrites(d int, bytes int64, ops int, busyNs int64, withReads bool) {
	if d >= 0 && d < len(p.devs) {
		p.devs[d].model.ObserveWrites(bytes, ops, busyNs, withReads)
	}
}

// Pending returns the records the planner holds (bounded by MaxPendingIOs):
// ops in flight, queued save writes, and one per plan and device with reads
// still queued.
func (p *Planner) Pending() int {
	return len(p.entries) - len(p.free) + len(p.cursors) - len(p.cfree)
}

func (p *Planner) alloc() (int32, bool) {
	if p.Pending() >= p.cfg.MaxPendingIOs {
		return 0, false
	}
	if n := len(p.free); n > 0 {
		i := p.free[n-1]
		p.free = p.free[:n-1]
		return i, true
	}
	p.entries = append(p.entries, entry{})
	return int32(len(p.entries) - 1), true
}

func (p *Planner) release(i int32) {
	e := &p.entries[i]
	e.state = stateFree
	e.gen++
	p.free = append(p.free, i)
}

func (p *Planner) id(i int32) uint64 { return uint64(p.entries[i].gen)<<32 | uint64(i) }

func (p *Planner) allocCursor() int32 {
	if n := len(p.cfree); n > 0 {
		i := p.cfree[n-1]
		p.cfree = p.cfree[:n-1]
		return i
	}
	p.cursors = append(p.cursors, cursor{})
	return int32(len(p.cursors) - 1)
}

func (p *Planner) releaseCursor(i int32) {
	p.cursors[i] = cursor{}
	p.cfree = append(p.cfree, i)
}

// ---- read heap (EDF over cursors) ----

func (p *Planner) less(a, b int32) bool {
	ca, cb := &p.cursors[a], &p.cursors[b]
	da, db := ca.deadline[ca.layer], cb.deadline[cb.layer]
	if da != db {
		return da < db
	}
	return ca.seq < cb.seq
}

func (p *Planner) heapPush(d *devState, i int32) {
	d.readQ = append(d.readQ, i)
	j := len(d.readQ) - 1
	for j > 0 {
		parent := (j - 1) / 2
		if !p.less(d.readQ[j], d.readQ[parent]) {
			break
		}
		d.readQ[j], d.readQ[parent] = d.readQ[parent], d.readQ[j]
		j = parent
	}
}

func (p *Planner) heapDown(h []int32, j int) {
	for {
		l := 2*j + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && p.less(h[r], h[l]) {
			m = r
		}
		if !p.less(h[m], h[j]) {
			return
		}
		h[j], h[m] = h[m], h[j]
		j = m
	}
}

func (p *Planner) heapPop(d *devState) int32 {
	h := d.readQ
	top := h[0]
	h[0] = h[len(h)-1]
	d.readQ = h[:len(h)-1]
	p.heapDown(d.readQ, 0)
	return top
}

// ---- load planning ----

// PlanLoad chooses how much of req's cached prefix to load, admits those reads
// into the device queues (Dispatch hands them out) and returns the plan. It is
// partial and never blocks: what does not fit the budgets, or is faster to
// recompute, is listed in Plan.NotAdmitted. Cost: O(layers × runs + blocks),
// the split itself O(blocks + runs) with O(1) per candidate.
//
// After PlanLoad the caller drives Dispatch/Complete until the plan's reads
// completed (or calls Cancel), and may feed ObserveLayer as layers finish.
func (p *Planner) PlanLoad(req LoadRequest) (Plan, error) {
	L := p.cfg.Layers
	B := p.cfg.BlockTokens
	P := 0
	for i, r := range req.Runs {
		if r.Device < 0 || r.Device >= len(p.devs) || r.Blocks <= 0 || r.BytesPerLayerPerBlock <= 0 {
			return Plan{}, fmt.Errorf("plan load %d: run %d %+v: %w", req.ID, i, r, ErrBadRequest)
		}
		P += r.Blocks
	}
	if req.UncachedTokens < 0 || P > (math.MaxInt32-req.UncachedTokens)/B {
		return Plan{}, fmt.Errorf("plan load %d: %d cached blocks, %d uncached tokens: %w", req.ID, P, req.UncachedTokens, ErrBadRequest)
	}
	now := req.NowNs
	cR := float64(max(req.ComputeReadyNs, now))

	// Where each device's reads of this request can start: after what it has
	// admitted already, slowed by writes in flight.
	for i := range p.devs {
		d := &p.devs[i]
		d.t0 = float64(now) + d.model.LatencyNs() + d.pendingReadNs + (1-d.model.ReadShare())*d.inflightWriteNs
		d.d = 0
	}

	// Admission cap: blocks whose reads fit each device's pending read bytes and
	// the op table.
	// Admission cap: blocks whose reads fit each device's pending read bytes,
	// and a cursor per device touched in the planner's record table.
	kmax, capReason := P, ReasonNone
	{
		freeRecs := p.cfg.MaxPendingIOs - p.Pending()
		pos := 0
		for i := range p.devs {
			p.devs[i].nseg = 0
			p.devs[i].d = 0 // bytes admitted so far, as float scratch
		}
		for _, r := range req.Runs {
			d := &p.devs[r.Device]
			if d.nseg == 0 && freeRecs == 0 {
				kmax, capReason = pos, ReasonQueueFull
				break
			}
			room := d.cfg.MaxPendingReadBytes - d.pendingReadBytes - int64(d.d)
			perBlock := int64(L) * r.BytesPerLayerPerBlock
			fit := int(min(int64(r.Blocks), max(room, 0)/perBlock))
			if fit > 0 {
				if d.nseg == 0 {
					freeRecs--
				}
				d.nseg++
				d.d += float64(int64(fit) * perBlock)
			}
			if fit < r.Blocks {
				kmax, capReason = pos+fit, ReasonReadBudget
				break
			}
			pos += r.Blocks
		}
		for i := range p.devs {
			p.devs[i].nseg = 0
			p.devs[i].d = 0
		}
	}

	// Split: F(k) = max(cR + L·C(k), A(k) + L·C(k), Bv(k) + C(k)) where C(k) is
	// one layer's compute of the suffix from block k, and per device with reads
	// A = t0 + D (first layer read), Bv = t0 + L·D (last layer read); D grows
	// with k, so A and Bv are running maxima, O(1) per candidate.
	scale := p.compute.Scale()
	a0, b0, c0 := scale*p.compute.FixedNs, scale*p.compute.PerTokenNs, scale*p.compute.PerPairNs
	total := P*B + req.UncachedTokens
	layerC := func(k int) float64 { // = p.compute.LayerNs(total-k*B, k*B), inlined for the scan
		n := float64(total - k*B)
		if n <= 0 {
			return 0
		}
		return a0 + b0*n + c0*(n*float64(k*B)+n*(n+1)/2)
	}
	fL := float64(L)
	finish := func(k int, A, Bv float64) float64 {
		c := layerC(k)
		return max(cR+fL*c, A+fL*c, Bv+c)
	}
	// The decision rule: the split minimises F(k) + C(k), the first token plus
	// one layer's compute of what it leaves to the GPU, not F(k) alone. F
	// assumes the GPU waits for nobody but this request; a caller that does
	// not know the GPU's queue (ComputeReadyNs = now) would otherwise trade
	// a large recompute (quadratic attention over a long prefix) for a
	// slightly earlier first token, which under load delays every queued prefill while loading would have
	// overlapped the queue. One layer's compute is the least the recomputed
	// tokens add beyond F to what the next prefill waits for; charging the
	// whole L·C(k) instead would forgo splits that shorten the tail when
	// the queue is known (sched/sim's replays).
	A, Bv := math.Inf(-1), math.Inf(-1)
	bestK, bestF := 0, finish(0, A, Bv)
	bestS := bestF + layerC(0) // the rule's score of the best k so far
	recomputeAll := bestF
	lastF := bestF
	k := 0
	for _, r := range req.Runs {
		if k >= kmax {
			break
		}
		d := &p.devs[r.Device]
		prof := d.model.Profile()
		nsPerByte, floorNs := 1e9/prof.ReadBytesPerSec, 1e9/prof.ReadIOPS // ReadNs, inlined
		bpb := float64(r.BytesPerLayerPerBlock)
		prev := 0.0
		for j := 1; j <= r.Blocks && k < kmax; j++ {
			ns := float64(j) * bpb * nsPerByte
			if ns < floorNs {
				ns = floorNs
			}
			d.d += ns - prev
			prev = ns
			if v := d.t0 + d.d; v > A {
				A = v
			}
			if v := d.t0 + fL*d.d; v > Bv {
				Bv = v
			}
			k++
			c := layerC(k)
			f := cR + fL*c
			if v := A + fL*c; v > f {
				f = v
			}
			if v := Bv + c; v > f {
				f = v
			}
			lastF = f
			if sc := f + c; sc < bestS {
				bestK, bestF, bestS = k, f, sc
			}
		}
	}

	plan := Plan{
		ID:               req.ID,
		CachedBlocks:     P,
		LoadBlocks:       bestK,
		ComputeStartPos:  bestK * B,
		ComputeTokens:    (P-bestK)*B + req.UncachedTokens,
		RecomputeAllNs:   ceilNs(recomputeAll),
		LoadAdmissibleNs: ceilNs(lastF),
	}
	c := layerC(bestK)
	plan.LayerComputeNs = ceilNs(c)
	plan.FirstTokenNs = ceilNs(bestF)
	if bestK < kmax {
		plan.NotAdmitted = append(plan.NotAdmitted, Rejection{bestK, kmax, ReasonRecomputeFaster})
	}
	if kmax < P {
		plan.NotAdmitted = append(plan.NotAdmitted, Rejection{kmax, P, capReason})
	}
	p.stats.Plans++
	p.stats.CachedBlocks += int64(P)
	p.stats.LoadedBlocks += int64(bestK)
	p.stats.BudgetCutBlocks += int64(P - kmax)
	if bestK == 0 {
		plan.ComputeStartNs = ceilNs(cR)
		return plan, nil
	}

	// Segments of [0, bestK) and each device's per-layer read time.
	plan.Segments = make([]Segment, 0, len(req.Runs))
	{
		k := 0
		for ri, r := range req.Runs {
			if k >= bestK {
				break
			}
			n := min(r.Blocks, bestK-k)
			k += n
			plan.Segments = append(plan.Segments, Segment{Run: ri, Device: r.Device, Blocks: n, Bytes: int64(n) * r.BytesPerLayerPerBlock})
		}
	}
	for i := range p.devs {
		p.devs[i].d, p.devs[i].nseg = 0, 0
	}
	for _, sg := range plan.Segments {
		d := &p.devs[sg.Device]
		d.d += d.model.ReadNs(sg.Bytes)
		d.nseg++
	}
	if !req.SegmentsOnly {
		plan.Reads = make([]IO, 0, L*len(plan.Segments))
	}
	plan.LayerDeadlineNs = make([]int64, L)
	plan.LayerReadDoneNs = make([]int64, L)
	r0 := math.Inf(-1)
	for i := range p.devs {
		if d := &p.devs[i]; d.nseg > 0 {
			r0 = max(r0, d.t0+d.d)
		}
	}
	plan.ComputeStartNs = ceilNs(max(cR, r0))
	for l := 0; l < L; l++ {
		var done int64
		for i := range p.devs {
			if d := &p.devs[i]; d.nseg > 0 {
				done = max(done, ceilNs(d.t0+float64(l+1)*d.d))
			}
		}
		// Rounding can put the read a nanosecond past the float deadline.
		plan.LayerDeadlineNs[l] = max(ceilNs(bestF-float64(L-l)*c), done)
		plan.LayerReadDoneNs[l] = done
		for _, sg := range plan.Segments {
			if req.SegmentsOnly {
				break
			}
			plan.Reads = append(plan.Reads, IO{Kind: IORead, ReqID: req.ID, Device: sg.Device, Layer: l, Run: sg.Run,
				Blocks: sg.Blocks, Bytes: sg.Bytes, DeadlineNs: plan.LayerDeadlineNs[l]})
		}
	}
	f := p.cfg.SlackFrac
	for di := range p.devs {
		d := &p.devs[di]
		if d.nseg == 0 {
			continue
		}
		ci := p.allocCursor()
		cu := &p.cursors[ci]
		p.seq++
		*cu = cursor{reqID: req.ID, dev: di, deadline: plan.LayerDeadlineNs, t0: d.t0, dNs: d.d, seq: p.seq, live: true,
			segs: make([]Segment, 0, d.nseg), segNs: make([]float64, 0, d.nseg),
			segCumNs: make([]float64, 1, d.nseg+1), segCumB: make([]int64, 1, d.nseg+1),
			slackMin: make([]float64, L+1), slackMinH: make([]float64, L+1)}
		for _, sg := range plan.Segments {
			if sg.Device == di {
				ns := d.model.ReadNs(sg.Bytes)
				cu.segs = append(cu.segs, sg)
				cu.segNs = append(cu.segNs, ns)
				cu.segCumNs = append(cu.segCumNs, cu.segCumNs[len(cu.segCumNs)-1]+ns)
				cu.segCumB = append(cu.segCumB, cu.segCumB[len(cu.segCumB)-1]+sg.Bytes)
			}
		}
		cu.slackMin[L], cu.slackMinH[L] = math.Inf(1), math.Inf(1)
		for l := L - 1; l >= 0; l-- {
			done := d.t0 + float64(l+1)*d.d
			dl := float64(plan.LayerDeadlineNs[l])
			cu.slackMin[l] = min(cu.slackMin[l+1], dl-done)
			cu.slackMinH[l] = min(cu.slackMinH[l+1], dl-(1+f)*done)
		}
		p.heapPush(d, ci)
		d.pendingReadBytes += int64(L) * cu.segCumB[len(cu.segs)]
		d.pendingReadNs += float64(L) * d.d
		d.pendingReads += L * len(cu.segs)
		d.plannedTailNs = max(d.plannedTailNs, ceilNs(d.t0+float64(L)*d.d))
	}
	return plan, nil
}

func ceilNs(v float64) int64 {
	if math.IsInf(v, -1) {
		return math.MinInt64
	}
	if v >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(math.Ceil(v))
}

// Cancel drops the queued (not yet dispatched) reads of load request id, e.g.
// when the engine aborted it; reads in flight still need Complete. It returns
// the number of reads dropped. O(queued plans).
func (p *Planner) Cancel(id uint64) int {
	n := 0
	for di := range p.devs {
		d := &p.devs[di]
		q := d.readQ[:0]
		for _, ci := range d.readQ {
			c := &p.cursors[ci]
			if c.reqID != id {
				q = append(q, ci)
				continue
			}
			reads, bytes, ns := c.remaining(p.cfg.Layers)
			d.pendingReadBytes -= bytes
			d.pendingReadNs -= ns
			d.pendingReads -= reads
			if d.pendingReads == 0 {
				d.pendingReadNs, d.plannedTailNs = 0, 0
			}
			n += reads
			p.releaseCursor(ci)
		}
		d.readQ = q
		for j := len(q)/2 - 1; j >= 0; j-- {
			p.heapDown(q, j)
		}
	}
	p.stats.Cancelled += int64(n)
	return n
}

func (p *Planner) retireRead(d *devState, e *entry) {
	d.pendingReadBytes -= e.io.Bytes
	d.pendingReadNs -= e.svcNs
	d.pendingReads--
	if d.pendingReads == 0 {
		// Start the next plan from exact zeros, not accumulated float error.
		d.pendingReadNs, d.plannedTailNs = 0, 0
	}
}

// ---- saves ----

// EnqueueSave admits the leading blocks of a save that fit the device's
// pending save bytes and its save bound, cuts them into writes and queues
// them. It never blocks; SaveTicket.Blocks == 0 means nothing was admitted.
// The writes come out of Dispatch: into read slack when they can, promoted
// when their bound comes near.
func (p *Planner) EnqueueSave(req SaveRequest) (SaveTicket, error) {
	if req.Device < 0 || req.Device >= len(p.devs) || req.Blocks <= 0 || req.BytesPerLayerPerBlock <= 0 {
		return SaveTicket{}, fmt.Errorf("enqueue save %d: %+v: %w", req.ID, req, ErrBadRequest)
	}
	d := &p.devs[req.Device]
	L := int64(p.cfg.Layers)
	perBlock := L * req.BytesPerLayerPerBlock
	// Write time budget: all queued and in-flight write work, at the share
	// writes get next to reads, must fit the bound less two margins.
	ws := d.model.WriteShare()
	budgetNs := float64(p.cfg.SaveBoundNs-2*p.cfg.SlackMarginNs)*ws - d.queuedSaveNs - d.inflightWriteNs
	writeNs := func(blocks int) (float64, int) {
		per := int64(blocks) * req.BytesPerLayerPerBlock
		full := per / p.cfg.MaxWriteIOBytes
		rest := per % p.cfg.MaxWriteIOBytes
		ns := float64(full) * d.model.WriteNs(p.cfg.MaxWriteIOBytes)
		n := full
		if rest > 0 {
			ns += d.model.WriteNs(rest)
			n++
		}
		return float64(L) * ns, int(L * n)
	}
	blocks, reason := req.Blocks, ReasonNone
	if room := d.cfg.MaxPendingSaveBytes - d.pendingSaveBytes; int64(blocks)*perBlock > room {
		blocks, reason = int(max(room, 0)/perBlock), ReasonSaveBudget
	}
	// The write time is monotone in blocks: binary search the largest that fits.
	fits := func(b int) bool {
		ns, n := writeNs(b)
		return ns <= budgetNs && n <= p.cfg.MaxPendingIOs-p.Pending()
	}
	if blocks > 0 && !fits(blocks) {
		lo, hi := 0, blocks // fits(lo), !fits(hi)
		for hi-lo > 1 {
			if m := (lo + hi) / 2; fits(m) {
				lo = m
			} else {
				hi = m
			}
		}
		blocks = lo
		if _, n := writeNs(req.Blocks); n > p.cfg.MaxPendingIOs-p.Pending() {
			reason = ReasonQueueFull
		} else {
			reason = ReasonSaveBound
		}
	}
	p.stats.Saves++
	p.stats.SaveBlocks += int64(blocks)
	p.stats.SaveCutBlocks += int64(req.Blocks - blocks)
	t := SaveTicket{Blocks: blocks, Reason: reason, DeadlineNs: req.NowNs + p.cfg.SaveBoundNs}
	if blocks == 0 {
		return t, nil
	}
	per := int64(blocks) * req.BytesPerLayerPerBlock
	for l := 0; l < p.cfg.Layers; l++ {
		for off := int64(0); off < per; off += p.cfg.MaxWriteIOBytes {
			n := min(p.cfg.MaxWriteIOBytes, per-off)
			idx, _ := p.alloc() // checked by fits
			e := &p.entries[idx]
			p.seq++
			*e = entry{gen: e.gen, state: stateQueued, svcNs: d.model.WriteNs(n), seq: p.seq}
			e.io = IO{ID: p.id(idx), Kind: IOWrite, ReqID: req.ID, Device: req.Device, Layer: l,
				OffsetBytes: off, Bytes: n, DeadlineNs: t.DeadlineNs}
			d.saveQ = append(d.saveQ, idx)
			d.queuedSaveNs += e.svcNs
			d.pendingSaveBytes += n
			t.Writes++
		}
	}
	return t, nil
}

// promoteAtNs is the latest time the device's save queue can start draining
// and still finish every queued write by its deadline less the margin, with
// writes at their share next to reads and after the writes in flight.
func (p *Planner) promoteAtNs(d *devState) int64 {
	ws := d.model.WriteShare()
	cum := d.inflightWriteNs / ws
	at := int64(math.MaxInt64)
	for _, i := range d.saveQ[d.saveHead:] {
		e := &p.entries[i]
		cum += e.svcNs / ws
		at = min(at, e.io.DeadlineNs-p.cfg.SlackMarginNs-ceilNs(cum))
	}
	return at
}

// minReadSlackNs is the least slack among the device's pending reads, each
// discounted by SlackFrac of its remaining horizon, less the amount by which
// the device runs behind the plans that admitted them.
func (p *Planner) minReadSlackNs(d *devState, now int64) float64 {
	m := math.Inf(1)
	f := p.cfg.SlackFrac
	for _, ci := range d.readQ {
		c := &p.cursors[ci]
		m = min(m, c.slackMin[c.layer], c.slackMinH[c.layer]+f*float64(now))
	}
	for _, i := range d.inflightRd {
		e := &p.entries[i]
		m = min(m, e.slackNs-f*float64(max(0, e.plannedDoneNs-now)))
	}
	tail := float64(now) + d.pendingReadNs + (1-d.model.ReadShare())*d.inflightWriteNs
	if drift := tail - float64(d.plannedTailNs); drift > 0 {
		m -= drift
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
			at = min(at, p.promoteAtNs(d))
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
// time. Call it after PlanLoad, EnqueueSave, every Complete, and at NextWakeNs.
func (p *Planner) Dispatch(nowNs int64, dst []IO) []IO {
	for di := range p.devs {
		d := &p.devs[di]
		for len(d.readQ) > 0 && d.readsInFlight < d.cfg.MaxReadsInFlight {
			ci := d.readQ[0]
			c := &p.cursors[ci]
			sg := c.segs[c.si]
			if d.readsInFlight > 0 && d.readBytesInFlight+sg.Bytes > d.cfg.MaxReadBytesInFlight {
				break
			}
			i, ok := p.alloc()
			if !ok {
				break // record table full: the rest waits for completions
			}
			e := &p.entries[i]
			done := c.t0 + float64(c.layer)*c.dNs + c.segCumNs[c.si+1]
			p.seq++
			*e = entry{gen: e.gen, state: stateInFlight, svcNs: c.segNs[c.si], plannedDoneNs: ceilNs(done), seq: p.seq}
			e.io = IO{ID: p.id(i), Kind: IORead, ReqID: c.reqID, Device: di, Layer: c.layer, Run: sg.Run,
				Blocks: sg.Blocks, Bytes: sg.Bytes, DeadlineNs: c.deadline[c.layer]}
			e.slackNs = float64(e.io.DeadlineNs) - done
			if c.si++; c.si == len(c.segs) {
				c.si = 0
				c.layer++
			}
			if c.layer == p.cfg.Layers {
				p.heapPop(d)
				p.releaseCursor(ci)
			} else {
				p.heapDown(d.readQ, 0)
			}
			e.pos = int32(len(d.inflightRd))
			d.inflightRd = append(d.inflightRd, i)
			d.readsInFlight++
			d.readBytesInFlight += e.io.Bytes
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
		promoteAt := p.promoteAtNs(d)
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
			p.stats.WritesDispatched++
			if promoted {
				p.stats.WritesPromoted++
				promoteAt = p.promoteAtNs(d)
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
// the op's queue slot and budgets; feed the device model with ObserveReads and
// ObserveWrites.
func (p *Planner) Complete(id uint64, nowNs int64) error {
	i := int32(id & 0xffffffff)
	if int(i) >= len(p.entries) || p.entries[i].gen != uint32(id>>32) || p.entries[i].state != stateInFlight {
		return fmt.Errorf("complete io %#x: %w", id, ErrUnknownIO)
	}
	e := &p.entries[i]
	d := &p.devs[e.io.Device]
	switch e.io.Kind {
	case IORead:
		last := d.inflightRd[len(d.inflightRd)-1]
		d.inflightRd[e.pos] = last
		p.entries[last].pos = e.pos
		d.inflightRd = d.inflightRd[:len(d.inflightRd)-1]
		d.readsInFlight--
		d.readBytesInFlight -= e.io.Bytes
		p.retireRead(d, e)
	case IOWrite:
		d.writesInFlight--
		d.writeBytesInFlight -= e.io.Bytes
		d.pendingSaveBytes -= e.io.Bytes
		d.inflightWriteNs -= e.svcNs
		if d.writesInFlight == 0 {
			d.inflightWriteNs = 0
		}
	}
	p.release(i)
	return nil
}
