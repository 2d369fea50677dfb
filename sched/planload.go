package sched

import (
	"fmt"
	"math"
)

// PlanLoad chooses how much of req's cached prefix to load, admits those reads
// into the device queues (Dispatch hands them out) and returns the plan. It is
// partial and never blocks: what does not fit the budgets, or is faster to
// recompute, is listed in Plan.NotAdmitted. Cost: O(layers × runs + blocks ×
// devices touched), the split itself O(blocks × devices touched).
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
	}
	p.runShares(req.Runs)
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
	curs := p.planCursors(&plan)
	p.planLayers(&plan, req, curs, cR, sp.bestF, c)
	p.admitCursors(curs, req.Whole)
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
		if r.Device < 0 || r.Device >= len(p.devs) || r.Blocks <= 0 || r.BytesPerLayerPerBlock <= 0 || !p.validLayerDevices(r.LayerDevices) {
			return 0, fmt.Errorf("plan load %d: run %d %+v: %w", req.ID, i, r, ErrBadRequest)
		}
		P += r.Blocks
	}
	if req.UncachedTokens < 0 || P > (math.MaxInt32-req.UncachedTokens)/B {
		return 0, fmt.Errorf("plan load %d: %d cached blocks, %d uncached tokens: %w", req.ID, P, req.UncachedTokens, ErrBadRequest)
	}
	return P, nil
}

// validLayerDevices says whether devs is nil or names a device for each
// layer.
func (p *Planner) validLayerDevices(devs []int) bool {
	if devs == nil {
		return true
	}
	if len(devs) != p.cfg.Layers {
		return false
	}
	for _, d := range devs {
		if d < 0 || d >= len(p.devs) {
			return false
		}
	}
	return true
}

// share is one run's reads on one device: how many layers' objects lie
// there, and the first and last of those layers.
type share struct {
	dev, layers, first, last int32
}

// runShares fills the planner's shares of runs: run i's are
// p.shares[p.shareIdx[i]:p.shareIdx[i+1]], in the order of their first
// layers. O(layers) per run spread over devices, O(1) per run on one.
func (p *Planner) runShares(runs []Run) {
	L := int32(p.cfg.Layers)
	p.shares, p.shareIdx = p.shares[:0], append(p.shareIdx[:0], 0)
	if len(p.devLayer) < len(p.devs) {
		p.devLayer = make([]int32, len(p.devs))
	}
	for _, r := range runs {
		start := len(p.shares)
		if r.LayerDevices == nil {
			p.shares = append(p.shares, share{dev: int32(r.Device), layers: L, first: 0, last: L - 1})
		} else {
			for l, d := range r.LayerDevices {
				k := p.devLayer[d] // 1 + d's share in p.shares, 0 when none yet
				if k == 0 {
					p.shares = append(p.shares, share{dev: int32(d), first: int32(l)})
					k = int32(len(p.shares))
					p.devLayer[d] = k
				}
				sh := &p.shares[k-1]
				sh.layers++
				sh.last = int32(l)
			}
			for _, sh := range p.shares[start:] {
				p.devLayer[sh.dev] = 0
			}
		}
		p.shareIdx = append(p.shareIdx, int32(len(p.shares)))
	}
}

// sharesOf is run i's shares (runShares).
func (p *Planner) sharesOf(i int) []share { return p.shares[p.shareIdx[i]:p.shareIdx[i+1]] }

// admissionCap returns how many of the P leading blocks the budgets admit and,
// when fewer than P, why: blocks whose reads fit each device's pending read
// bytes, and a cursor per device touched in the planner's record table. It
// uses the devices' n and total as scratch and leaves them zero.
func (p *Planner) admissionCap(runs []Run, P int) (int, Reason) {
	kmax, capReason := P, ReasonNone
	freeRecs := p.cfg.MaxPendingIOs - p.Pending()
	pos := 0
	for i := range p.devs {
		p.devs[i].n, p.devs[i].total = 0, 0 // touched; bytes admitted so far
	}
	for ri, r := range runs {
		shares := p.sharesOf(ri)
		need := 0 // cursor records this run adds
		fit := r.Blocks
		for _, sh := range shares {
			d := &p.devs[sh.dev]
			if d.n == 0 {
				need++
			}
			room := d.cfg.MaxPendingReadBytes - d.pendingReadBytes - int64(d.total)
			perBlock := int64(sh.layers) * r.BytesPerLayerPerBlock
			fit = int(min(int64(fit), max(room, 0)/perBlock))
		}
		if need > freeRecs {
			kmax, capReason = pos, ReasonQueueFull
			break
		}
		if fit > 0 {
			for _, sh := range shares {
				d := &p.devs[sh.dev]
				if d.n == 0 {
					freeRecs--
				}
				d.n++
				d.total += float64(int64(fit) * int64(sh.layers) * r.BytesPerLayerPerBlock)
			}
		}
		if fit < r.Blocks {
			kmax, capReason = pos+fit, ReasonReadBudget
			break
		}
		pos += r.Blocks
	}
	for i := range p.devs {
		p.devs[i].n, p.devs[i].total = 0, 0
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

// chooseSplit scans k = 0..kmax. Each device reads its share of every layer
// in layer order, so F(k) = max(cR + L·C(k), max_d A_d(k), max_d Bv_d(k))
// where C(k) is one layer's compute of the suffix from block k and, per
// device with reads, A_d = t0 + first + (L − firstL)·C (its first layer
// read, then the compute of that layer and every later one) and Bv_d = t0
// + total + (L − lastL)·C (its last layer read, then the rest). For runs
// on one device each (firstL = 0, lastL = L−1, total = L·first) that is
// max(cR + L·C, t0 + D + L·C, t0 + L·D + C); a run spread over W devices
// reads W layers at once, one per device, and its last W layers complete
// together. Those two reads per device bound every layer's when each
// device's share is spread evenly over the layers, as the placement
// spreads it. It accumulates the devices' total and first (zeroed here),
// O(devices touched) per candidate.
func (p *Planner) chooseSplit(runs []Run, kmax int, cR float64, lc layerCost, queueUnknown bool) split {
	L := p.cfg.Layers
	fL := float64(L)
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
	for i := range p.devs {
		d := &p.devs[i]
		d.total, d.first, d.firstL, d.lastL, d.n = 0, 0, L, -1, 0
	}
	active := p.activeDevs[:0]
	c0 := lc.at(0)
	f0 := cR + fL*c0
	s := split{bestK: 0, bestF: f0, recomputeAll: f0, lastF: f0}
	bestS := f0 + w*lc.at(0) // the rule's score of the best k so far
	k := 0
	for ri, r := range runs {
		if k >= kmax {
			break
		}
		shares := p.sharesOf(ri)
		prev := p.prevNs[:0]
		for _, sh := range shares {
			d := &p.devs[sh.dev]
			if d.lastL < 0 {
				active = append(active, int(sh.dev))
			}
			if int(sh.first) < d.firstL {
				d.firstL, d.first = int(sh.first), 0
			}
			d.lastL = max(d.lastL, int(sh.last))
			prev = append(prev, 0)
		}
		bpb := float64(r.BytesPerLayerPerBlock)
		for j := 1; j <= r.Blocks && k < kmax; j++ {
			for si, sh := range shares {
				d := &p.devs[sh.dev]
				prof := d.model.Profile()
				ns := float64(j) * bpb * 1e9 / prof.ReadBytesPerSec // ReadNs, inlined
				if floorNs := 1e9 / prof.ReadIOPS; ns < floorNs {
					ns = floorNs
				}
				delta := ns - prev[si]
				prev[si] = ns
				d.total += float64(sh.layers) * delta
				if int(sh.first) == d.firstL {
					d.first += delta
				}
			}
			k++
			c := lc.at(k)
			f := cR + fL*c
			for _, di := range active {
				d := &p.devs[di]
				if v := d.t0 + d.first + float64(L-d.firstL)*c; v > f {
					f = v
				}
				if v := d.t0 + d.total + float64(L-d.lastL)*c; v > f {
					f = v
				}
			}
			s.lastF = f
			if sc := f + w*c; sc < bestS {
				s.bestK, s.bestF, bestS = k, f, sc
			}
		}
		p.prevNs = prev
	}
	p.activeDevs = active
	return s
}

// planSegments fills plan.Segments, the reads of [0, LoadBlocks).
func (p *Planner) planSegments(plan *Plan, req LoadRequest) {
	plan.Segments = make([]Segment, 0, len(req.Runs))
	k := 0
	for ri, r := range req.Runs {
		if k >= plan.LoadBlocks {
			break
		}
		n := min(r.Blocks, plan.LoadBlocks-k)
		k += n
		plan.Segments = append(plan.Segments, Segment{Run: ri, Device: r.Device, LayerDevices: r.LayerDevices, Blocks: n,
			Bytes: int64(n) * r.BytesPerLayerPerBlock})
	}
}

// planCursors makes the plan's cursors, one per device with reads (not yet
// admitted): each holds the device's reads of the plan's segments, layer by
// layer, with their predicted busy time (the deadlines come with
// planLayers).
func (p *Planner) planCursors(plan *Plan) []int32 {
	L := p.cfg.Layers
	for i := range p.devs {
		p.devs[i].n = 0
	}
	for l := 0; l < L; l++ {
		for _, sg := range plan.Segments {
			p.devs[sg.DeviceOf(l)].n++
		}
	}
	var curs []int32
	for di := range p.devs {
		d := &p.devs[di]
		if d.n == 0 {
			continue
		}
		ci := p.allocCursor()
		p.seq++
		p.cursors[ci] = cursor{reqID: plan.ID, dev: di, t0: d.t0, seq: p.seq, live: true,
			reads: make([]cread, 0, d.n), layerAt: make([]int32, L+1)}
		d.n = int(ci) + 1 // the device's cursor, while the reads are placed
		curs = append(curs, ci)
	}
	for l := 0; l < L; l++ {
		for _, ci := range curs {
			c := &p.cursors[ci]
			c.layerAt[l] = int32(len(c.reads))
		}
		for si, sg := range plan.Segments {
			c := &p.cursors[p.devs[sg.DeviceOf(l)].n-1]
			c.reads = append(c.reads, cread{layer: int32(l), seg: int32(si), ns: p.devs[c.dev].model.ReadNs(sg.Bytes)})
		}
	}
	for _, ci := range curs {
		c := &p.cursors[ci]
		n := len(c.reads)
		c.layerAt[L] = int32(n)
		c.segs = plan.Segments
		c.cumNs, c.cumB = make([]float64, n+1), make([]int64, n+1)
		for i, r := range c.reads {
			c.cumNs[i+1] = c.cumNs[i] + r.ns
			c.cumB[i+1] = c.cumB[i] + plan.Segments[r.seg].Bytes
		}
		p.devs[c.dev].n = 0
	}
	return curs
}

// planLayers fills the plan's compute start, per-layer deadlines and read
// completions and (unless SegmentsOnly) its Reads, from its cursors; bestF
// is the predicted first token and c one layer's compute. A layer is read
// when the last of its reads is, on whichever device, and every earlier
// layer is (the engine computes the layers in order): so both lists only
// grow, and each device's reads come in deadline order.
func (p *Planner) planLayers(plan *Plan, req LoadRequest, curs []int32, cR, bestF, c float64) {
	L := p.cfg.Layers
	doneAt := make([]float64, L) // the last read of each layer, planned
	for l := range doneAt {
		doneAt[l] = math.Inf(-1)
	}
	for _, ci := range curs {
		cu := &p.cursors[ci]
		for l := 0; l < L; l++ {
			if end := cu.layerAt[l+1]; end > cu.layerAt[l] {
				doneAt[l] = max(doneAt[l], cu.t0+cu.cumNs[end])
			}
		}
	}
	plan.ComputeStartNs = ceilNs(max(cR, doneAt[0]))
	// The pipeline of these reads: chooseSplit's F bounds it where each
	// device's share is spread evenly over the layers; where it is not (an
	// uneven placement), the layer that binds may be another, and the
	// plan's first token and deadlines follow the pipeline.
	s, done := max(cR, doneAt[0]), doneAt[0]
	for l := 1; l < L; l++ {
		done = max(done, doneAt[l])
		s = max(s+c, done)
	}
	if f := s + c; f > bestF+1 {
		bestF = f
		plan.FirstTokenNs = ceilNs(f)
	}
	plan.LayerDeadlineNs = make([]int64, L)
	plan.LayerReadDoneNs = make([]int64, L)
	if !req.SegmentsOnly {
		plan.Reads = make([]IO, 0, L*len(plan.Segments))
	}
	for l := 0; l < L; l++ {
		done := ceilNs(doneAt[l])
		if l > 0 {
			done = max(done, plan.LayerReadDoneNs[l-1])
		}
		// Rounding can put the read a nanosecond past the float deadline.
		plan.LayerDeadlineNs[l] = max(ceilNs(bestF-float64(L-l)*c), done)
		plan.LayerReadDoneNs[l] = done
		for _, sg := range plan.Segments {
			if req.SegmentsOnly {
				break
			}
			plan.Reads = append(plan.Reads, IO{Kind: IORead, ReqID: req.ID, Device: sg.DeviceOf(l), Layer: l, Run: sg.Run,
				Blocks: sg.Blocks, Bytes: sg.Bytes, DeadlineNs: plan.LayerDeadlineNs[l]})
		}
	}
	for _, ci := range curs {
		p.cursors[ci].deadline = plan.LayerDeadlineNs
	}
}

// admitCursors queues the plan's cursors (planCursors; their deadlines set
// by planLayers): each pushed on its device's heap (whole: kept on the
// device's job list instead), its reads charged to the device's budgets.
func (p *Planner) admitCursors(curs []int32, whole bool) {
	f := p.cfg.SlackFrac
	for _, ci := range curs {
		cu := &p.cursors[ci]
		d := &p.devs[cu.dev]
		n := len(cu.reads)
		cu.slackMin, cu.slackMinH = make([]float64, n+1), make([]float64, n+1)
		cu.slackMin[n], cu.slackMinH[n] = math.Inf(1), math.Inf(1)
		for i := n - 1; i >= 0; i-- {
			done := cu.t0 + cu.cumNs[i+1]
			dl := float64(cu.deadline[cu.reads[i].layer])
			cu.slackMin[i] = min(cu.slackMin[i+1], dl-done)
			cu.slackMinH[i] = min(cu.slackMinH[i+1], dl-(1+f)*done)
		}
		if whole {
			d.jobCurs = append(d.jobCurs, ci)
		} else {
			p.heapPush(d, ci)
		}
		d.pendingReadBytes += cu.cumB[n]
		d.pendingReadNs += cu.totalNs()
		d.pendingReads += n
		d.plannedTailNs = max(d.plannedTailNs, ceilNs(cu.t0+cu.totalNs()))
	}
}

// dropCursor takes c's reads not yet retired off device d's budgets and
// returns how many there were.
func (p *Planner) dropCursor(d *devState, c *cursor) int {
	reads, bytes, ns := c.remaining()
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
