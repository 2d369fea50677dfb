package sched

import (
	"math/rand/v2"
	"testing"
)

// The world of TestSavesDoNotDelayGPURestores: a fluid model stepped every
// jobWorldStepNs. Each device serves its reads (restores' layers, in the
// order the GPU issues them: restore by restore, layer by layer) and its
// writes (in dispatch order) at the same time, each at its share of the
// device's rate while the other direction is busy.

type jobWorldPolicy int

const (
	jobWorldScheduler  jobWorldPolicy = iota // saves through the planner
	jobWorldFreeWrites                       // the same, but writes never slow reads
	jobWorldEager                            // saves written as they come, the planner not told
)

const (
	jobWorldStepNs   = int64(50e3)
	jobWorldLimitNs  = int64(30e9)
	jobWorldRequests = 30
	jobWorldSaves    = 30
	jobWorldMeanGap  = 40e6
	jobWorldWriteIO  = 256 << 10
)

type jobWorldResult struct {
	waitNs     float64 // the requests' compute waiting for reads, summed
	maxSaveNs  float64
	savedBytes int64
	boundNs    int64
}

type wRead struct {
	req, layer int
	bytes      float64
}

type wWrite struct {
	id      uint64 // planner IO (0: eager, the planner does not know it)
	save    int
	bytes   float64
	planned bool
}

type wReq struct {
	arrive    int64
	blocks    [2]int
	plan      Plan
	io        IO
	layerLeft []int   // per layer: device reads not finished
	readDone  []int64 // per layer, -1 before
	retired   int
	done      bool
}

type wSave struct {
	arrive     int64
	dev        int
	blocks     int
	writesLeft int
	doneNs     int64
}

type jobWorld struct {
	t      testing.TB
	p      *Planner
	pol    jobWorldPolicy
	now    int64
	reads  [2][]wRead
	writes [2][]wWrite
	reqs   []wReq
	saves  []wSave
	left   int  // requests and saves not finished
	dirty  bool // something arrived or completed since the last Dispatch
}

func runJobWorld(t testing.TB, seed uint64, pol jobWorldPolicy) jobWorldResult {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 21))
	w := &jobWorld{t: t, p: jobPlanner(t, 2, jobWorldWriteIO, 1), pol: pol}
	for _, at := range randomArrivals(rng, jobWorldRequests, jobWorldMeanGap) {
		w.reqs = append(w.reqs, wReq{arrive: at, blocks: [2]int{2 + rng.IntN(5), 2 + rng.IntN(5)}})
	}
	for _, at := range randomArrivals(rng, jobWorldSaves, jobWorldMeanGap) {
		w.saves = append(w.saves, wSave{arrive: at + 5e6, dev: rng.IntN(2), blocks: 1 + rng.IntN(3)})
	}
	w.left = len(w.reqs) + len(w.saves)
	nextReq, nextSave := 0, 0
	for w.left > 0 {
		if w.now > jobWorldLimitNs {
			t.Fatalf("world not done after %d s: %d requests and saves left", jobWorldLimitNs/1e9, w.left)
		}
		for ; nextReq < len(w.reqs) && w.reqs[nextReq].arrive <= w.now; nextReq++ {
			w.arriveRequest(nextReq)
		}
		for ; nextSave < len(w.saves) && w.saves[nextSave].arrive <= w.now; nextSave++ {
			w.arriveSave(nextSave)
		}
		if w.dirty || w.now >= w.p.NextWakeNs() {
			w.dispatch() // as the runtime calls it: on requests, completions and wake-ups
			w.dirty = false
		}
		for d := range w.reads {
			w.serve(d)
		}
		w.now += jobWorldStepNs
	}
	return w.result()
}

func (w *jobWorld) arriveRequest(i int) {
	w.dirty = true
	r := &w.reqs[i]
	plan, err := w.p.PlanLoad(wholeRequest(uint64(i+1), w.now, r.blocks[0], r.blocks[1]))
	if err != nil || plan.LoadBlocks != r.blocks[0]+r.blocks[1] {
		w.t.Fatalf("request %d: plan %+v, %v: want every block loaded", i, plan, err)
	}
	r.plan = plan
	r.layerLeft = make([]int, jobLayers)
	r.readDone = make([]int64, jobLayers)
	for l := range r.readDone {
		r.readDone[l] = -1
	}
}

func (w *jobWorld) arriveSave(i int) {
	w.dirty = true
	s := &w.saves[i]
	if w.pol == jobWorldEager {
		per := int64(s.blocks) * jobBlockBytes
		for range jobLayers {
			for off := int64(0); off < per; off += jobWorldWriteIO {
				w.writes[s.dev] = append(w.writes[s.dev], wWrite{save: i, bytes: float64(min(jobWorldWriteIO, per-off))})
				s.writesLeft++
			}
		}
		return
	}
	tk, err := w.p.EnqueueSave(SaveRequest{ID: uint64(1000 + i), NowNs: w.now, Device: s.dev, Blocks: s.blocks, BytesPerLayerPerBlock: jobBlockBytes})
	if err != nil || tk.Blocks != s.blocks {
		w.t.Fatalf("save %d: ticket %+v, %v: want all admitted", i, tk, err)
	}
	s.writesLeft = tk.Writes
}

func (w *jobWorld) dispatch() {
	for _, io := range w.p.Dispatch(w.now, nil) {
		switch io.Kind {
		case IORestore:
			r := &w.reqs[io.ReqID-1]
			r.io = io
			for l := range jobLayers {
				for _, sg := range r.plan.Segments {
					w.reads[sg.Device] = append(w.reads[sg.Device], wRead{req: int(io.ReqID - 1), layer: l, bytes: float64(sg.Bytes)})
					r.layerLeft[l]++
				}
			}
		case IOWrite:
			w.writes[io.Device] = append(w.writes[io.Device], wWrite{id: io.ID, save: int(io.ReqID - 1000), bytes: float64(io.Bytes), planned: true})
		default:
			w.t.Fatalf("dispatched %+v: the world has only whole restores and writes", io)
		}
	}
}

// serve advances device d by one step.
func (w *jobWorld) serve(d int) {
	prof := w.p.Device(d).Profile()
	rr, wr := prof.ReadBytesPerSec, prof.WriteBytesPerSec
	reading, writing := len(w.reads[d]) > 0, len(w.writes[d]) > 0
	if writing && w.pol != jobWorldFreeWrites {
		rr *= prof.ReadShareUnderWrites
	}
	if reading {
		wr *= prof.WriteShareUnderReads
	}
	budget := rr * float64(jobWorldStepNs) / 1e9
	for budget > 0 && len(w.reads[d]) > 0 {
		h := &w.reads[d][0]
		n := min(budget, h.bytes)
		h.bytes -= n
		budget -= n
		if h.bytes <= 0 {
			w.readDone(w.reads[d][0])
			w.reads[d] = w.reads[d][1:]
		}
	}
	budget = wr * float64(jobWorldStepNs) / 1e9
	for budget > 0 && len(w.writes[d]) > 0 {
		h := &w.writes[d][0]
		n := min(budget, h.bytes)
		h.bytes -= n
		budget -= n
		if h.bytes <= 0 {
			w.writeDone(w.writes[d][0])
			w.writes[d] = w.writes[d][1:]
		}
	}
}

func (w *jobWorld) readDone(rd wRead) {
	r := &w.reqs[rd.req]
	if r.layerLeft[rd.layer]--; r.layerLeft[rd.layer] == 0 {
		r.readDone[rd.layer] = w.now + jobWorldStepNs
	}
	n := r.retired
	for n < jobLayers && r.readDone[n] >= 0 {
		n++
	}
	if n == r.retired {
		return
	}
	r.retired = n
	w.dirty = true
	var err error
	if n < jobLayers {
		err = w.p.CompleteLayers(r.io.ID, n, w.now)
	} else {
		err = w.p.Complete(r.io.ID, w.now)
		r.done = true
		w.left--
	}
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *jobWorld) writeDone(wt wWrite) {
	w.dirty = true
	if wt.planned {
		if err := w.p.Complete(wt.id, w.now); err != nil {
			w.t.Fatal(err)
		}
	}
	s := &w.saves[wt.save]
	if s.writesLeft--; s.writesLeft == 0 {
		s.doneNs = w.now + jobWorldStepNs
		w.left--
	}
}

// result computes each request's layers (one at a time, each once read)
// and sums how long its compute waited for reads beyond computing alone.
func (w *jobWorld) result() jobWorldResult {
	res := jobWorldResult{boundNs: w.p.Config().SaveBoundNs}
	for _, r := range w.reqs {
		c := float64(r.plan.LayerComputeNs)
		end := float64(r.arrive)
		for _, done := range r.readDone {
			end = max(end, float64(done)) + c
		}
		res.waitNs += end - float64(r.arrive) - jobLayers*c
	}
	for _, s := range w.saves {
		res.maxSaveNs = max(res.maxSaveNs, float64(s.doneNs-s.arrive))
		res.savedBytes += int64(s.blocks) * jobLayers * jobBlockBytes
	}
	return res
}
