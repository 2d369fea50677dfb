package sched

import (
	"math"
	"testing"
)

// With default limits (only the device profile given), EnqueueSave keeps
// every block of a save the device can write within the bound, at the full
// write rate when nothing else is pending and at the write share beside a
// read backlog; a save that cannot fit is cut to the blocks that do, with
// ReasonSaveBound, and counted.
func TestEnqueueSaveDefaultBudget(t *testing.T) {
	prof := testDevice(2) // 1.6 GB/s writes, write share 0.6
	perBlock := float64(testLayers * testBlockBytes)
	boundNs := 2e9 // the default
	// Blocks whose writes take frac of the bound at the full write rate.
	blocksFor := func(frac float64) int { return int(frac * boundNs * prof.WriteBytesPerSec / 1e9 / perBlock) }
	for _, tc := range []struct {
		name       string
		frac       float64 // save size: this fraction of the bound at the full rate
		readBlocks int     // a load of this many cached blocks admitted first
		wantAll    bool
		wantReason Reason
	}{
		{"idle device, half the bound", 0.5, 0, true, ReasonNone},
		{"idle device, 0.95 of the bound", 0.95, 0, true, ReasonNone},
		{"idle device, 1.5 bounds", 1.5, 0, false, ReasonSaveBound},
		{"beside a short load, 0.9 of the bound", 0.9, 4, true, ReasonNone},
		{"beside a long load, 0.9 of the bound", 0.9, 200, false, ReasonSaveBound},
		{"beside a long load, 0.5 of the share", 0.5 * 0.6, 200, true, ReasonNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPlanner(Config{Layers: testLayers, BlockTokens: 512, Compute: testCompute(t),
				Devices: []DeviceConfig{{Profile: prof}}})
			if err != nil {
				t.Fatal(err)
			}
			if tc.readBlocks > 0 {
				plan, err := p.PlanLoad(LoadRequest{ID: 1, ComputeReadyNs: 100e9, UncachedTokens: 1,
					Runs: []Run{{Device: 0, Blocks: tc.readBlocks, BytesPerLayerPerBlock: testBlockBytes}}, SegmentsOnly: true})
				if err != nil || plan.LoadBlocks != tc.readBlocks {
					t.Fatalf("load: %d of %d blocks, %v", plan.LoadBlocks, tc.readBlocks, err)
				}
			}
			n := blocksFor(tc.frac)
			tk, err := p.EnqueueSave(SaveRequest{ID: 2, Device: 0, Blocks: n, BytesPerLayerPerBlock: testBlockBytes})
			if err != nil {
				t.Fatal(err)
			}
			st := p.Stats()
			t.Logf("%d of %d blocks admitted (%v), %d writes", tk.Blocks, n, tk.Reason, tk.Writes)
			if tc.wantAll {
				if tk.Blocks != n || tk.Reason != ReasonNone || st.SaveCutBlocks != 0 {
					t.Fatalf("admitted %d of %d (%v, %d counted cut): the device writes it within the bound", tk.Blocks, n, tk.Reason, st.SaveCutBlocks)
				}
				return
			}
			if tk.Blocks >= n || tk.Blocks == 0 || tk.Reason != tc.wantReason {
				t.Fatalf("admitted %d of %d (%v): want a partial admission with %v", tk.Blocks, n, tk.Reason, tc.wantReason)
			}
			if st.SaveCutBlocks != int64(n-tk.Blocks) {
				t.Fatalf("stats count %d cut blocks, ticket cut %d", st.SaveCutBlocks, n-tk.Blocks)
			}
		})
	}
}

// The write time a save needs beside reads: the full rate with none, the
// share while reads that cannot end in time run, and in between the reads'
// drain at the read share.
func TestSaveNeedNs(t *testing.T) {
	m, err := NewDeviceModel(testDevice(2)) // shares 0.6 / 0.6
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ writeNs, readNs, want float64 }{
		{100, 0, 100},
		{100, 1e9, 100 / 0.6},
		{100, 30, 100 + 0.4*30/0.6}, // reads drain in 50: writes do 30 of 100 meanwhile
		{0, 30, 0},
	} {
		if got := saveNeedNs(m, tc.writeNs, tc.readNs); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("saveNeedNs(%v, %v) = %v, want %v", tc.writeNs, tc.readNs, got, tc.want)
		}
	}
}
