package sched

import (
	"math/rand/v2"
	"testing"
)

// checkPlan asserts what every plan must satisfy.
func checkPlan(t *testing.T, p *Planner, plan Plan, req LoadRequest) {
	t.Helper()
	L, B := p.cfg.Layers, p.cfg.BlockTokens
	P := 0
	for _, r := range req.Runs {
		P += r.Blocks
	}
	if plan.CachedBlocks != P || plan.LoadBlocks < 0 || plan.LoadBlocks > P {
		t.Fatalf("plan %+v: cached %d", plan, P)
	}
	if plan.ComputeStartPos != plan.LoadBlocks*B || plan.ComputeTokens != (P-plan.LoadBlocks)*B+req.UncachedTokens {
		t.Fatalf("compute range [%d, +%d) does not follow the split %d", plan.ComputeStartPos, plan.ComputeTokens, plan.LoadBlocks)
	}
	at := plan.LoadBlocks
	for _, r := range plan.NotAdmitted {
		if r.FromBlock != at || r.ToBlock <= r.FromBlock || r.Reason == ReasonNone {
			t.Fatalf("not-admitted list %+v does not cover [%d, %d)", plan.NotAdmitted, plan.LoadBlocks, P)
		}
		at = r.ToBlock
	}
	if at != P {
		t.Fatalf("not-admitted list %+v ends at %d, want %d", plan.NotAdmitted, at, P)
	}
	// The rule's score (first token plus one layer's compute) is never
	// worse than recomputing everything.
	gpu := func(k int) int64 {
		return int64(p.compute.LayerNs((P-k)*p.cfg.BlockTokens+req.UncachedTokens, k*p.cfg.BlockTokens))
	}
	if s, s0 := plan.FirstTokenNs+gpu(plan.LoadBlocks), plan.RecomputeAllNs+gpu(0); s > s0+2 {
		t.Fatalf("plan scores %d (finishes at %d), recomputing everything %d (at %d)", s, plan.FirstTokenNs, s0, plan.RecomputeAllNs)
	}
	if plan.LoadBlocks == 0 {
		if len(plan.Reads) != 0 || len(plan.Segments) != 0 {
			t.Fatalf("no blocks loaded but %d reads", len(plan.Reads))
		}
		return
	}
	// Segments: the runs' leading blocks add up to the split, read every layer.
	blocks := 0
	for i, sg := range plan.Segments {
		r := req.Runs[sg.Run]
		if sg.Run != i || sg.Device != r.Device || len(sg.LayerDevices) != len(r.LayerDevices) || sg.Blocks > r.Blocks || (sg.Blocks < r.Blocks && i != len(plan.Segments)-1) ||
			sg.Bytes != int64(sg.Blocks)*r.BytesPerLayerPerBlock {
			t.Fatalf("segment %d %+v does not match run %+v", i, sg, r)
		}
		blocks += sg.Blocks
	}
	if req.SegmentsOnly != (plan.Reads == nil) {
		t.Fatalf("SegmentsOnly %v but %d reads listed", req.SegmentsOnly, len(plan.Reads))
	}
	if blocks != plan.LoadBlocks || (!req.SegmentsOnly && len(plan.Reads) != L*len(plan.Segments)) {
		t.Fatalf("segments %+v cover %d blocks in %d reads, plan loads %d", plan.Segments, blocks, len(plan.Reads), plan.LoadBlocks)
	}
	for i, io := range plan.Reads {
		sg := plan.Segments[i%len(plan.Segments)]
		if io.Kind != IORead || io.Layer != i/len(plan.Segments) || io.Run != sg.Run || io.Bytes != sg.Bytes ||
			io.DeadlineNs != plan.LayerDeadlineNs[io.Layer] || io.Device != sg.DeviceOf(io.Layer) {
			t.Fatalf("read %d %+v does not match segment %+v", i, io, sg)
		}
	}
	// The pipeline of the plan: layer l's compute starts after its reads and
	// the previous layer; each read completes before that start, and the last
	// layer ends by the predicted first token (1 ns per layer of rounding).
	start := max(req.ComputeReadyNs, req.NowNs)
	var s int64
	for l := 0; l < L; l++ {
		if plan.LayerReadDoneNs[l] > plan.LayerDeadlineNs[l] {
			t.Fatalf("layer %d: read completes at %d after its deadline %d", l, plan.LayerReadDoneNs[l], plan.LayerDeadlineNs[l])
		}
		if l > 0 && (plan.LayerReadDoneNs[l] < plan.LayerReadDoneNs[l-1] || plan.LayerDeadlineNs[l] < plan.LayerDeadlineNs[l-1]) {
			t.Fatalf("layer %d: reads done %d, deadline %d, before layer %d's", l, plan.LayerReadDoneNs[l], plan.LayerDeadlineNs[l], l-1)
		}
		if l == 0 {
			s = max(start, plan.LayerReadDoneNs[0])
		} else {
			s = max(s+plan.LayerComputeNs, plan.LayerReadDoneNs[l])
		}
		if s > plan.LayerDeadlineNs[l]+int64(l+1) {
			t.Fatalf("layer %d: compute starts at %d after deadline %d", l, s, plan.LayerDeadlineNs[l])
		}
		if plan.LayerReadDoneNs[l] > s {
			t.Fatalf("layer %d: read completes at %d after compute start %d", l, plan.LayerReadDoneNs[l], s)
		}
	}
	if end := s + plan.LayerComputeNs; end > plan.FirstTokenNs+int64(L) {
		t.Fatalf("pipeline ends at %d, plan says %d", end, plan.FirstTokenNs)
	}
}

// checkLimits asserts the planner's budgets hold.
func checkLimits(t *testing.T, p *Planner, seed uint64) {
	t.Helper()
	if p.Pending() > p.cfg.MaxPendingIOs {
		t.Fatalf("seed %d: %d ops pending, limit %d", seed, p.Pending(), p.cfg.MaxPendingIOs)
	}
	for i := range p.devs {
		d := &p.devs[i]
		c := d.cfg
		switch {
		case d.readsInFlight > c.MaxReadsInFlight, d.writesInFlight > c.MaxWritesInFlight:
			t.Fatalf("seed %d dev %d: %d reads, %d writes in flight", seed, i, d.readsInFlight, d.writesInFlight)
		case d.readsInFlight > 1 && d.readBytesInFlight > c.MaxReadBytesInFlight,
			d.writesInFlight > 1 && d.writeBytesInFlight > c.MaxWriteBytesInFlight:
			t.Fatalf("seed %d dev %d: %d read, %d write bytes in flight", seed, i, d.readBytesInFlight, d.writeBytesInFlight)
		case d.pendingReadBytes > c.MaxPendingReadBytes, d.pendingSaveBytes > c.MaxPendingSaveBytes:
			t.Fatalf("seed %d dev %d: %d read, %d save bytes pending", seed, i, d.pendingReadBytes, d.pendingSaveBytes)
		case d.pendingReadBytes < 0 || d.pendingSaveBytes < 0 || d.pendingReads < 0:
			t.Fatalf("seed %d dev %d: negative accounting %+v", seed, i, d)
		}
	}
}

// randomLayerDevices is nil (a run on one device) half the time, else each
// layer's device: rotated over the devices from a random one (the store's
// placement) or, a third of those times, any device per layer.
func randomLayerDevices(rng *rand.Rand, layers, devices int) []int {
	if devices < 2 || rng.IntN(2) == 0 {
		return nil
	}
	out := make([]int, layers)
	start, anyDev := rng.IntN(devices), rng.IntN(3) == 0
	for l := range out {
		out[l] = (start + l) % devices
		if anyDev {
			out[l] = rng.IntN(devices)
		}
	}
	return out
}

// TestPlanProperties drives one planner with random loads, saves, dispatches
// and completions under tight budgets, with runs on one device and spread
// over several, and checks every plan and the limits after every step.
func TestPlanProperties(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		cfg := Config{Layers: 1 + rng.IntN(80), BlockTokens: 16 << rng.IntN(6), Compute: testCompute(t),
			MaxPendingIOs: 200 + rng.IntN(3000), SaveBoundNs: 3e9, MaxWriteIOBytes: 1 << (16 + rng.IntN(8))}
		for n := 1 + rng.IntN(3); n > 0; n-- {
			cfg.Devices = append(cfg.Devices, DeviceConfig{Profile: testDevice(0.2 + 8*rng.Float64()),
				MaxReadsInFlight: 1 + rng.IntN(16), MaxWritesInFlight: 1 + rng.IntN(4),
				MaxReadBytesInFlight: 1 << (20 + rng.IntN(6)), MaxWriteBytesInFlight: 1 << (18 + rng.IntN(6)),
				MaxPendingReadBytes: 1 << (28 + rng.IntN(6)), MaxPendingSaveBytes: 1 << (26 + rng.IntN(6))})
		}
		p, err := NewPlanner(cfg)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		var inflight []IO
		plans := map[uint64]Plan{}
		cancelled := map[uint64]bool{}
		reads := map[uint64]int{}
		now := int64(0)
		for step := 0; step < 400; step++ {
			now += int64(rng.IntN(5e6))
			switch op := rng.IntN(10); {
			case op < 3:
				var runs []Run
				for n := rng.IntN(5); n > 0; n-- {
					runs = append(runs, Run{Device: rng.IntN(len(cfg.Devices)), LayerDevices: randomLayerDevices(rng, cfg.Layers, len(cfg.Devices)),
						Blocks: 1 + rng.IntN(60), BytesPerLayerPerBlock: int64(cfg.BlockTokens) * int64(1+rng.IntN(4096))})
				}
				req := LoadRequest{ID: uint64(step), NowNs: now, ComputeReadyNs: now + int64(rng.IntN(300))*1e6,
					Runs: runs, UncachedTokens: rng.IntN(3000), SegmentsOnly: rng.IntN(4) == 0}
				plan, err := p.PlanLoad(req)
				if err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				checkPlan(t, p, plan, req)
				plans[req.ID] = plan
				if rng.IntN(20) == 0 {
					p.Cancel(req.ID)
					cancelled[req.ID] = true
				}
			case op < 5:
				tk, err := p.EnqueueSave(SaveRequest{ID: uint64(step), NowNs: now, Device: rng.IntN(len(cfg.Devices)),
					LayerDevices: randomLayerDevices(rng, cfg.Layers, len(cfg.Devices)),
					Blocks:       1 + rng.IntN(30), BytesPerLayerPerBlock: int64(cfg.BlockTokens) * int64(1+rng.IntN(4096))})
				if err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				if tk.Blocks > 0 && (tk.Writes == 0 || tk.DeadlineNs != now+cfg.SaveBoundNs) {
					t.Fatalf("seed %d step %d: ticket %+v", seed, step, tk)
				}
			case op < 8:
				before := len(inflight)
				inflight = p.Dispatch(now, inflight)
				last := map[int]int64{}
				for _, io := range inflight[before:] {
					if io.Kind == IORead {
						pl := plans[io.ReqID]
						if io.DeadlineNs != pl.LayerDeadlineNs[io.Layer] || io.Run >= len(pl.Segments) ||
							io.Bytes != pl.Segments[io.Run].Bytes || io.Device != pl.Segments[io.Run].DeviceOf(io.Layer) {
							t.Fatalf("seed %d step %d: read %+v not in its plan %+v", seed, step, io, pl.Segments)
						}
						reads[io.ReqID]++
						if io.DeadlineNs < last[io.Device] {
							t.Fatalf("seed %d step %d: reads of device %d out of deadline order", seed, step, io.Device)
						}
						last[io.Device] = io.DeadlineNs
					}
				}
			default:
				for n := rng.IntN(8); n > 0 && len(inflight) > 0; n-- {
					j := rng.IntN(len(inflight))
					if err := p.Complete(inflight[j].ID, now); err != nil {
						t.Fatalf("seed %d step %d: %v", seed, step, err)
					}
					if err := p.Complete(inflight[j].ID, now); err == nil {
						t.Fatalf("seed %d step %d: completing twice succeeded", seed, step)
					}
					inflight[j] = inflight[len(inflight)-1]
					inflight = inflight[:len(inflight)-1]
				}
			}
			checkLimits(t, p, seed)
		}
		// Drain: everything admitted eventually comes out and completes.
		for guard := 0; p.Pending() > 0; guard++ {
			if guard > 1e6 {
				t.Fatalf("seed %d: %d ops never drained", seed, p.Pending())
			}
			now = max(now+1e6, min(p.NextWakeNs(), now+1e9))
			before := len(inflight)
			inflight = p.Dispatch(now, inflight)
			for j, io := range inflight {
				if io.Kind == IORead && j >= before {
					reads[io.ReqID]++
				}
				if err := p.Complete(io.ID, now); err != nil {
					t.Fatalf("seed %d: drain: %v", seed, err)
				}
			}
			inflight = inflight[:0]
			checkLimits(t, p, seed)
		}
		for id, pl := range plans {
			if want := cfg.Layers * len(pl.Segments); !cancelled[id] && reads[id] != want {
				t.Fatalf("seed %d: plan %d had %d reads, %d dispatched", seed, id, want, reads[id])
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	p := testPlanner(t, 2)
	for _, req := range []LoadRequest{
		{Runs: []Run{{Device: 1, Blocks: 1, BytesPerLayerPerBlock: 1}}},
		{Runs: []Run{{Device: 0, Blocks: 0, BytesPerLayerPerBlock: 1}}},
		{Runs: []Run{{Device: 0, Blocks: 1, BytesPerLayerPerBlock: 0}}},
		{UncachedTokens: -1},
	} {
		if _, err := p.PlanLoad(req); err == nil {
			t.Fatalf("%+v: no error", req)
		}
	}
	for _, req := range []LoadRequest{
		{Runs: []Run{{Device: 0, LayerDevices: []int{0}, Blocks: 1, BytesPerLayerPerBlock: 1}}},
		{Runs: []Run{{Device: 0, LayerDevices: make([]int, testLayers), Blocks: 1, BytesPerLayerPerBlock: 1}}},
	} {
		req.Runs[0].LayerDevices[len(req.Runs[0].LayerDevices)-1] = 2
		if _, err := p.PlanLoad(req); err == nil {
			t.Fatalf("layer devices %v: no error", req.Runs[0].LayerDevices)
		}
	}
	if _, err := p.EnqueueSave(SaveRequest{Device: -1, Blocks: 1, BytesPerLayerPerBlock: 1}); err == nil {
		t.Fatal("bad save: no error")
	}
	if _, err := p.EnqueueSave(SaveRequest{Device: 0, LayerDevices: []int{1}, Blocks: 1, BytesPerLayerPerBlock: 1}); err == nil {
		t.Fatal("save with one layer device for 32 layers: no error")
	}
	if err := p.Complete(12345, 0); err == nil {
		t.Fatal("unknown io: no error")
	}
	if _, err := NewPlanner(Config{Layers: 1, BlockTokens: 1, Compute: testCompute(t)}); err == nil {
		t.Fatal("no devices: no error")
	}
}
