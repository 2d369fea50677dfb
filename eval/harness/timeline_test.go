package harness

import (
	"math"
	"testing"
	"time"

	"github.com/tutti-io/tutti/eval/metrics"
)

func TestSimulate(t *testing.T) {
	ms := time.Millisecond
	svc := []Service{
		// Loads 2 layers (ready at 4 and 8 ms), computes 1 ms per layer.
		{ArrivalMs: 0, LayerReady: []time.Duration{4 * ms, 8 * ms}, Load: 8 * ms, LayerCompute: ms, Layers: 2, Bytes: 8e6},
		// Arrives at 1 ms, nothing to load, waits for the GPU (free at 9 ms).
		{ArrivalMs: 1, LayerCompute: 2 * ms, Layers: 2, Save: 3 * ms},
		// Arrives at 2 ms, loads after the first load (device free at 8 ms).
		{ArrivalMs: 2, LayerReady: []time.Duration{ms, 2 * ms}, Load: 2 * ms, LayerCompute: ms, Layers: 2, Bytes: 2e6},
	}
	o := Simulate(svc, 1)
	// r0: layers ready 4, 8 → done 9. r1: GPU 9..13 → 12; its save is
	// requested at 13, after r2's load (requested at 2): r2 loads 8..10,
	// computes 13..15 → 13.
	want := []float64{9, 12, 13}
	for i, w := range want {
		if math.Abs(o.TTFTms[i]-w) > 1e-9 {
			t.Fatalf("request %d: TTFT %v want %v (all %v)", i, o.TTFTms[i], w, o.TTFTms)
		}
	}
	// Request 0 stalled 7 ms on loads (9 ms wall, 2 ms compute); request 1 none.
	if o.StallMs[0] != 7 || o.StallMs[1] != 0 {
		t.Fatalf("stalls %v", o.StallMs)
	}
	// Slower arrivals (scale 100): no queueing, each TTFT is its own service.
	o = Simulate(svc, 100)
	if o.TTFTms[1] != 4 || o.TTFTms[2] != 3 {
		t.Fatalf("unloaded TTFTs %v", o.TTFTms)
	}
}

func TestSweepMonotone(t *testing.T) {
	ms := time.Millisecond
	var svc []Service
	for i := 0; i < 50; i++ {
		svc = append(svc, Service{ArrivalMs: float64(i) * 100, LayerReady: []time.Duration{5 * ms}, Load: 5 * ms,
			LayerCompute: 5 * ms, Layers: 1, Bytes: 1e6})
	}
	curve, maxRate := Sweep(svc, 50)
	if len(curve) == 0 || maxRate <= 0 {
		t.Fatalf("max rate %v", maxRate)
	}
	// Each server needs 5 ms per request (200/s); 50 requests queue only so far.
	if maxRate > 400 || maxRate < 10 {
		t.Fatalf("max rate %v", maxRate)
	}
	for i := 1; i < len(curve); i++ {
		if curve[i].P90ms+1e-9 < curve[i-1].P90ms {
			t.Fatalf("p90 not monotone in rate at %d: %+v", i, curve[i-1:i+1])
		}
	}
	if MaxRateTried(curve, maxRate) {
		t.Fatal("a finite maximum reported as a lower bound")
	}
	if c, r := Sweep(svc, 1e9); !MaxRateTried(c, r) {
		t.Fatalf("an SLO met at every rate: %v not flagged as a lower bound", r)
	}
	if _, r := Sweep(svc, 1); r != 0 {
		t.Fatalf("impossible SLO met at %v", r)
	}
}

func TestBandwidth(t *testing.T) {
	svc := []Service{{Bytes: 1000, LayerReady: []time.Duration{time.Second}}}
	o := Outcome{LoadStart: []float64{0}, LoadEnd: []float64{1000}}
	ts, bw := Bandwidth(svc, o, 250)
	var total float64
	for _, b := range bw {
		total += b * 0.25
	}
	if len(ts) != 5 || math.Abs(total-1000) > 1e-6 || math.Abs(bw[0]-1000) > 1e-6 {
		t.Fatalf("ts %v bw %v", ts, bw)
	}
}

// The default SLO follows the recompute backend's own prefills, and every
// backend's curve is swept against it; a given SLO is left alone.
func TestSettleSLO(t *testing.T) {
	svc := func(layerMs float64) []Service {
		var out []Service
		for i := 0; i < 10; i++ {
			out = append(out, Service{ArrivalMs: float64(i) * 1000, Layers: 10,
				LayerCompute: time.Duration(layerMs * float64(i+1) * 1e6)})
		}
		return out
	}
	res := &Result{SLOms: 5, SLOSource: "model"}
	res.Backends = []BackendResult{{Backend: "tutti-cpu", Services: svc(1)}, {Backend: "recompute", Services: svc(2)}}
	settleSLO(Config{}, res)
	// recompute's unloaded TTFTs are 20, 40, ..., 200 ms: p90 interpolates to 182 ms
	want := 2 * metrics.Percentile([]float64{20, 40, 60, 80, 100, 120, 140, 160, 180, 200}, 0.9)
	if res.SLOms != want {
		t.Fatalf("SLO %.2f ms, want %.2f", res.SLOms, want)
	}
	for _, b := range res.Backends {
		if b.MaxRateAtSLO <= 0 || len(b.Curve) == 0 {
			t.Fatalf("%s: not swept against the new SLO (max rate %v)", b.Backend, b.MaxRateAtSLO)
		}
	}
	given := &Result{SLOms: 5, SLOSource: "given", Backends: res.Backends}
	settleSLO(Config{SLOms: 5}, given)
	if given.SLOms != 5 || given.SLOSource != "given" {
		t.Fatalf("a given SLO was replaced: %v (%s)", given.SLOms, given.SLOSource)
	}
}

// RatesTTFT scales arrivals by nominal/rate: at twice the nominal rate it is
// Simulate at half the time scale, whatever the window's measured rate.
func TestRatesTTFT(t *testing.T) {
	svc := []Service{
		{ArrivalMs: 0, Layers: 2, LayerCompute: 10 * time.Millisecond},
		{ArrivalMs: 30, Layers: 2, LayerCompute: 10 * time.Millisecond},
		{ArrivalMs: 35, Layers: 2, LayerCompute: 10 * time.Millisecond},
	}
	got := RatesTTFT(svc, 1, []float64{1, 2})
	if len(got) != 2 {
		t.Fatalf("got %+v", got)
	}
	for i, scale := range []float64{1, 0.5} {
		want := Simulate(svc, scale).TTFTms
		if len(got[i].TTFTms) != len(want) {
			t.Fatalf("rate %g: %v, want %v", got[i].RatePerS, got[i].TTFTms, want)
		}
		for k := range want {
			if got[i].TTFTms[k] != want[k] {
				t.Fatalf("rate %g: %v, want %v", got[i].RatePerS, got[i].TTFTms, want)
			}
		}
	}
	if got[1].P90ms <= got[0].P90ms {
		t.Fatalf("p90 at 2x the rate %g, at 1x %g: want more queueing", got[1].P90ms, got[0].P90ms)
	}
	for _, bad := range [][]float64{{0}, {-1}, {math.NaN()}} {
		if RatesTTFT(svc, 1, bad) != nil {
			t.Fatalf("rates %v: want nil", bad)
		}
	}
	if RatesTTFT(svc, 0, []float64{1}) != nil || RatesTTFT(nil, 1, []float64{1}) != nil {
		t.Fatal("no nominal rate or no services: want nil")
	}
}
