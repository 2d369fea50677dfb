package sched

import "testing"

// benchPlan plans a 128K-token request on an 80-layer model (Llama-3-70B
// shape: 8 KV heads × 128 dims, BF16) whose prefix is cached in `runs` runs
// striped over two devices, then cancels it so the planner's state stays
// the same from one iteration to the next.
func benchPlan(b *testing.B, blockTokens, runs int, segmentsOnly bool) {
	m, err := ComputeFromFLOPs(FLOPsProfile{LinearFLOPsPerToken: 2 * 862e6, AttnFLOPsPerPair: 4 * 64 * 128,
		GEMMFLOPsPerSec: 400e12, AttnFLOPsPerSec: 200e12, FixedNs: 20e3})
	if err != nil {
		b.Fatal(err)
	}
	p, err := NewPlanner(Config{Layers: 80, BlockTokens: blockTokens, Compute: m,
		Devices: []DeviceConfig{{Profile: testDevice(4)}, {Profile: testDevice(4)}}})
	if err != nil {
		b.Fatal(err)
	}
	const tokens = 128 << 10
	blocks := tokens / blockTokens
	perLayerPerBlock := int64(blockTokens) * 8 * 128 * 2 * 2
	req := LoadRequest{ID: 1, NowNs: 1e9, ComputeReadyNs: 1e9, UncachedTokens: 1000, SegmentsOnly: segmentsOnly}
	for i := 0; i < runs; i++ {
		n := blocks / runs
		if i == runs-1 {
			n = blocks - (runs-1)*(blocks/runs)
		}
		req.Runs = append(req.Runs, Run{Device: i % 2, Blocks: n, BytesPerLayerPerBlock: perLayerPerBlock})
	}
	loaded := 0
	b.ReportAllocs()
	for b.Loop() {
		plan, err := p.PlanLoad(req)
		if err != nil {
			b.Fatal(err)
		}
		loaded = plan.LoadBlocks
		p.Cancel(req.ID)
	}
	b.ReportMetric(float64(loaded), "loaded-blocks")
	b.ReportMetric(float64(blocks), "cached-blocks")
}

// BenchmarkPlan128K80L: 512-token chain blocks (Mooncake), 8 runs, with the
// Plan.Reads list (640 reads).
func BenchmarkPlan128K80L(b *testing.B) { benchPlan(b, 512, 8, false) }

// BenchmarkPlan128K80LSegments: the same without the Plan.Reads list.
func BenchmarkPlan128K80LSegments(b *testing.B) { benchPlan(b, 512, 8, true) }

// BenchmarkPlan128K80LPages16: 16-token blocks (vLLM hashing, 8192 candidates
// for the split), 64 runs: the O(blocks) part of the scan, without the list.
func BenchmarkPlan128K80LPages16(b *testing.B) { benchPlan(b, 16, 64, true) }

// BenchmarkDispatchComplete: the per-I/O cost of the planner in the I/O loop:
// Dispatch hands out the reads of a planned 128K-token, 80-layer request and a
// queued save in batches, Complete retires them.
func BenchmarkDispatchComplete(b *testing.B) {
	m, err := ComputeFromFLOPs(FLOPsProfile{LinearFLOPsPerToken: 2 * 862e6, AttnFLOPsPerPair: 4 * 64 * 128,
		GEMMFLOPsPerSec: 400e12, AttnFLOPsPerSec: 200e12, FixedNs: 20e3})
	if err != nil {
		b.Fatal(err)
	}
	p, err := NewPlanner(Config{Layers: 80, BlockTokens: 512, Compute: m, SaveBoundNs: 60e9,
		Devices: []DeviceConfig{{Profile: testDevice(4), MaxPendingSaveBytes: 64 << 30}, {Profile: testDevice(4), MaxPendingSaveBytes: 64 << 30}}})
	if err != nil {
		b.Fatal(err)
	}
	var runs []Run
	for i := 0; i < 8; i++ {
		runs = append(runs, Run{Device: i % 2, Blocks: 32, BytesPerLayerPerBlock: 2 << 20})
	}
	ios := make([]IO, 0, 256)
	now := int64(0)
	n := 0
	b.ResetTimer()
	for b.Loop() {
		now += 1e9
		if _, err := p.PlanLoad(LoadRequest{ID: uint64(now), NowNs: now, ComputeReadyNs: now + 30e9, Runs: runs, UncachedTokens: 1000, SegmentsOnly: true}); err != nil {
			b.Fatal(err)
		}
		if _, err := p.EnqueueSave(SaveRequest{ID: uint64(now), NowNs: now, Device: 0, Blocks: 8, BytesPerLayerPerBlock: 2 << 20}); err != nil {
			b.Fatal(err)
		}
		for p.Pending() > 0 {
			ios = p.Dispatch(now, ios[:0])
			if len(ios) == 0 {
				now = max(now+1e6, p.NextWakeNs())
				continue
			}
			for _, io := range ios {
				if err := p.Complete(io.ID, now); err != nil {
					b.Fatal(err)
				}
				n++
			}
			now += 1e5
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/io")
}
