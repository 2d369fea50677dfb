package sched

import "testing"

// Llama-3-8B-like shape on a datacenter-class GPU: 32 layers, 8 KV heads × 128 dims,
// BF16, K and V: 2 MiB per layer per 512-token block.
const (
	testLayers     = 32
	testBlockBytes = 512 * 8 * 128 * 2 * 2
)

func testCompute(t testing.TB) ComputeModel {
	t.Helper()
	m, err := ComputeFromFLOPs(FLOPsProfile{
		LinearFLOPsPerToken: 2 * 218e6,    // 7B non-embedding weights / 32 layers
		AttnFLOPsPerPair:    4 * 32 * 128, // 32 query heads × 128 dims
		GEMMFLOPsPerSec:     400e12,       // dense BF16, sustained
		AttnFLOPsPerSec:     200e12,       // flash attention, sustained
		FixedNs:             20e3,         // launches per layer
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func testDevice(readGBps float64) DeviceProfile {
	return DeviceProfile{
		ReadBytesPerSec:      readGBps * 1e9,
		WriteBytesPerSec:     readGBps * 0.8e9,
		ReadIOPS:             250e3,
		WriteIOPS:            150e3,
		ReadLatencyNs:        100e3,
		ReadShareUnderWrites: 0.6,
		WriteShareUnderReads: 0.6,
	}
}

func testPlanner(t testing.TB, readGBps ...float64) *Planner {
	t.Helper()
	cfg := Config{Layers: testLayers, BlockTokens: 512, Compute: testCompute(t)}
	for _, g := range readGBps {
		cfg.Devices = append(cfg.Devices, DeviceConfig{Profile: testDevice(g)})
	}
	p, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
