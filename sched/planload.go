package sched

import (
	"fmt"
	"math"
)

// PlanLoad chooses how much of req's cached prefix to load, admits those reads
// into the device queues (Dispatch hands them out) and returns the plan. It is
// partial and never blocks: what does not fit the budgets, or is faster to
// recompute, is listed in Plan.NotAdmitted. Cost: O(layers × runs + blocks),
// the split itself O(blocks + runs) with O(1) per candidate.
//
// After PlanLoad the caller drives Dispatch/Complete until the plan's reads
// completed (or calls Cancel), and may feed ObserveLayer as layers finish.
func (p *Planner) PlanLoad(req LoadRequest) (Plan, error) {
	P, err := p.checkLoad(req)
	if err != nil {
		return Plan{}, err
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
	kmax, capReason := p.admissionCap(req.Runs, P)
	lc := p.newLayerCost(P*p.cfg.BlockTokens + req.UncachedTokens)
	sp := p.chooseSplit(req.Runs, kmax, cR, lc, req.QueueUnknown)

	B := p.cfg.BlockTokens
	plan := Plan{
		ID:               req.ID,
		CachedBlocks:     P,
		LoadBlocks:       sp.bestK,
		ComputeStartPos:  sp.bestK * B,
		ComputeTokens:    (P-sp.bestK)*B + req.UncachedTokens,
		RecomputeAllNs:   ceilNs(sp.recomputeAll),
		LoadAdmissibleNs: ceilNs(sp.lastF),
	}
	c := lc.at(sp.bestK)
	plan.LayerComputeNs = ceilNs(c)
	plan.FirstTokenNs = ceilNs(sp.bestF)
	if sp.bestK < kmax {
		plan.NotAdmitted = append(plan.NotAdmitted, Rejection{sp.bestK, kmax, ReasonRecomputeFaster})
	}
	if kmax < P {
		plan.NotAdmitted = append(plan.NotAdmitted, Rejection{kmax, P, capReason})
	}
	p.stats.Plans++
	p.stats.CachedBlocks += int64(P)
	p.stats.LoadedBlocks += int64(sp.bestK)
	p.stats.BudgetCutBlocks += int64(P - kmax)
	if sp.bestK == 0 {
		plan.ComputeStartNs = ceilNs(cR)
		return plan, nil
	}
	p.planSegments(&plan, req)
	p.planLayers(&plan, req, cR, sp.bestF, c)
	curs := p.admitCursors(&plan, req.Whole)
	if req.Whole {
		p.queueJob(plan.ID, curs)
	}
	return plan, nil
}

// checkLoad validates req and returns its cached blocks.
func (p *Planner) checkLoad(req LoadRequest) (int, error) {
	B := p.cfg.BlockTokens
	P := 0
	for i, r := range req.Runs {
		if r.Device < 0 || r.Device >= len(p.devs) || r.Blocks <= 0 || r.BytesPerLayerPerBlock <= 0 {
			return 0, fmt.Errorf("plan load %d: run %d %+v: %w", req.ID, i, r, ErrBadRequest)
		}
		P += r.Blocks
	}
	if req.UncachedTokens < 0 || P > (math.MaxInt32-req.UncachedTokens)/B {
		return 0, fmt.Errorf("plan load %d: %d cached blocks, %d uncached tokens: %w", req.ID, P, req.UncachedTokens, ErrBadRequest)
	}
	return P, nil
}

// admissionCap returns how many of the P leading blocks the budgets admit and,
// when fewer than P, why: blocks whose reads fit each device's pending read
// bytes, and a cursor per device touched in the planner's record table. It
// uses the devices' nseg and d as scratch and leaves them zero.
func (p *Planner) admissionCap(runs []Run, P int) (int, Reason) {
	L := p.cfg.Layers
	kmax, capReason := P, ReasonNone
	freeRecs := p.cfg.MaxPendingIOs - p.Pending()
	pos := 0
	for i := range p.devs {
		p.devs[i].nseg = 0
		p.devs[i].d = 0 // bytes admitted so far, as float scratch
	}
	for _, r := range runs {
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
	return kmax, capReason
}

// layerCost is one layer's compute of the suffix from block k, the compute
// model's LayerNs(total-k·B, k·B) with its scale applied once, for the scan.
type layerCost struct {
	a0, b0, c0 float64
	total, B   int
}

func (p *Planner) newLayerCost(totalTokens int) layerCost {
	scale := p.compute.Scale()
	return layerCost{a0: scale * p.compute.FixedNs, b0: scale * p.compute.PerTokenNs, c0: scale * p.compute.PerPairNs,
		total: totalTokens, B: p.cfg.BlockTokens}
}

func (lc layerCost) at(k int) float64 {
	n := float64(lc.total - k*lc.B)
	if n <= 0 {
		return 0
	}
	return lc.a0 + lc.b0*n + lc.c0*(n*float64(k*lc.B)+n*(n+1)/2)
}

// split is what chooseSplit found: the blocks to load and the predicted first
// token with them, with none, and with all admissible blocks.
type split struct {
	bestK                      int
	bestF, recomputeAll, lastF float64
}

// chooseSplit scans k = 0..kmax. F(k) = max(cR + L·C(k), A(k) + L·C(k),
// Bv(k) + C(k)) where C(k) is one layer's compute of the suffix from block k,
// and per device with reads A = t0 + D (first layer read), Bv = t0 + L·D
// (last layer read); D grows with k, so A and Bv are running maxima, O(1) per
// candidate. It accumulates each device's D in d.d (zeroed by admissionCap).
func (p *Planner) chooseSplit(runs []Run, kmax int, cR float64, lc layerCost, queueUnknown bool) split {
	fL := float64(p.cfg.Layers)
	// The decision rule: the split minimises F(k) + w·C(k), the first token
	// plus w layers' compute of what it leaves to the GPU, not F(k) alone. F
	// assumes the GPU waits for nobody but this request; a caller that does
	// not know the GPU's queue would otherwise trade a large recompute
	// (quadratic attention over a long prefix) for a slightly earlier first
	// token, which under load delays every queued prefill while loading
	// would have overlapped the queue. With the queue known (ComputeReadyNs;
	// sched/sim's replays) w = 1: one layer's compute is the least the
	// recomputed tokens add beyond F to what the next prefill waits for, and
	// charging more would forgo splits that shorten the tail. With it
	// unknown (QueueUnknown) w = L, the whole GPU time: nothing is
	// recomputed that costs the GPU more than it saves this first token.
	w := 1.0
	if queueUnknown {
		w = fL
	}
	A, Bv := math.Inf(-1), math.Inf(-1)
	c0 := lc.at(0)
	f0 := max(cR+fL*c0, A+fL*c0, Bv+c0)
	s := split{bestK: 0, bestF: f0, recomputeAll: f0, lastF: f0}
	bestS := f0 + w*lc.at(0) // the rule's score of the best k so far
	k := 0
	for _, r := range runs {
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
			c := lc.at(k)
			f := cR + fL*c
			if v := A + fL*c; v > f {
				f = v
			}
			if v := Bv + c; v > f {
				f = v
			}
			s.lastF = f
			if sc := f + w*c; sc < bestS {
				s.bestK, s.bestF, bestS = k, f, sc
			}
		}
	}
	return s
}

// planSegments fills plan.Segments, the reads of [0, LoadBlocks), and leaves
// in each device's d its per-layer read time and in nseg its segment count.
func (p *Planner) planSegments(plan *Plan, req LoadRequest) {
	plan.Segments = make([]Segment, 0, len(req.Runs))
	k := 0
	for ri, r := range req.Runs {
		if k >= plan.LoadBlocks {
			break
		}
		n := min(r.Blocks, plan.LoadBlocks-k)
		k += n
		plan.Segments = append(plan.Segments, Segment{Run: ri, Device: r.Device, Blocks: n, Bytes: int64(n) * r.BytesPerLayerPerBlock})
	}
	for i := range p.devs {
		p.devs[i].d, p.devs[i].nseg = 0, 0
	}
	for _, sg := range plan.Segments {
		d := &p.devs[sg.Device]
		d.d += d.model.ReadNs(sg.Bytes)
		d.nseg++
	}
}

// planLayers fills the plan's compute start, per-layer deadlines and read
// completions and (unless SegmentsOnly) its Reads, from the devices' t0, d and
// nseg; bestF is the predicted first token and c one layer's compute.
func (p *Planner) planLayers(plan *Plan, req LoadRequest, cR, bestF, c float64) {
	L := p.cfg.Layers
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
}

// admitCursors queues the plan's reads: one cursor per device with segments,
// pushed on the device's heap (whole: kept on the device's job list
// instead, and returned), and charges them to the device's budgets.
func (p *Planner) admitCursors(plan *Plan, whole bool) []int32 {
	var curs []int32
	L := p.cfg.Layers
	f := p.cfg.SlackFrac
	for di := range p.devs {
		d := &p.devs[di]
		if d.nseg == 0 {
			continue
		}
		ci := p.allocCursor()
		cu := &p.cursors[ci]
		p.seq++
		*cu = cursor{reqID: plan.ID, dev: di, deadline: plan.LayerDeadlineNs, t0: d.t0, dNs: d.d, seq: p.seq, live: true,
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
		if whole {
			d.jobCurs = append(d.jobCurs, ci)
			curs = append(curs, ci)
		} else {
			p.heapPush(d, ci)
		}
		d.pendingReadBytes += int64(L) * cu.segCumB[len(cu.segs)]
		d.pendingReadNs += float64(L) * d.d
		d.pendingReads += L * len(cu.segs)
		d.plannedTailNs = max(d.plannedTailNs, ceilNs(d.t0+float64(L)*d.d))
	}
	return curs
}

// dropCursor takes c's reads not yet retired off device d's budgets and
// returns how many there were.
func (p *Planner) dropCursor(d *devState, c *cursor) int {
	reads, bytes, ns := c.remaining(p.cfg.Layers)
	d.retirePending(reads, bytes, ns)
	return reads
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
// when the engine aborted it; reads in flight still need Complete. A Whole
// plan not dispatched yet is dropped whole; once dispatched, only Complete
// retires it. It returns the number of reads dropped. O(queued plans).
func (p *Planner) Cancel(id uint64) int {
	n := p.cancelJobs(id)
	for di := range p.devs {
		d := &p.devs[di]
		q := d.readQ[:0]
		for _, ci := range d.readQ {
			c := &p.cursors[ci]
			if c.reqID != id {
				q = append(q, ci)
				continue
			}
			n += p.dropCursor(d, c)
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
