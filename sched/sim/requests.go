package sim

// The simulated requests: arrival (lookup, the plan, the reads), the GPU
// running their layers, and the saves they leave behind.

import (
	"math"

	"github.com/tutti-io/tutti/sched"
)

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
		if s.cfg.QueueUnknown {
			ready = 0
		}
		plan, err := s.planner.PlanLoad(sched.LoadRequest{ID: uint64(i), NowNs: s.now, ComputeReadyNs: ready,
			Runs: r.segs, UncachedTokens: uncached, SegmentsOnly: true, QueueUnknown: s.cfg.QueueUnknown})
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
