package harness

import (
	"math"
	"time"

	"github.com/tutti-io/tutti/eval/metrics"
)

// Service is what one request cost one backend, measured (load, save) or
// modelled (compute). The timeline replays these at the arrival times.
//
// Durations are nanoseconds in JSON (services.json of a report).
type Service struct {
	ArrivalMs    float64         `json:"arrival_ms"`       // after window, time scale and spreading
	LayerReady   []time.Duration `json:"layer_ready_ns"`   // from load start; empty when nothing was restored
	Load         time.Duration   `json:"load_ns"`          // device busy restoring
	Save         time.Duration   `json:"save_ns"`          // device busy saving
	SaveBlocks   int             `json:"save_blocks"`      // blocks saved: the save yields to loads between blocks
	LayerCompute time.Duration   `json:"layer_compute_ns"` // per layer, for the tokens not restored
	Layers       int             `json:"layers"`
	Bytes        int64           `json:"bytes"` // restored
}

// Outcome is the timeline of one replay.
type Outcome struct {
	TTFTms    []float64 // per request
	StallMs   []float64 // per request: time the GPU waited for loaded layers
	LoadStart []float64 // ms, per request (= arrival when nothing is loaded)
	LoadEnd   []float64
}

// Simulate runs the timeline with arrivals multiplied by scale (1 = as
// given). Two servers: the device serves loads (requested at arrival) first,
// in arrival order, and saves (requested when the request's prefill ends)
// only in its idle time — a save starts only when no load is waiting, and
// once started runs to its end (writes deferred into slack, for every
// backend alike; a save yields between its blocks, so a load waits at most
// for one block's write); the GPU runs one prefill at a time, layer l starting when
// layer l−1 is done and layer l is loaded. Deterministic.
func Simulate(svc []Service, scale float64) Outcome {
	o := Outcome{TTFTms: make([]float64, len(svc)), StallMs: make([]float64, len(svc)),
		LoadStart: make([]float64, len(svc)), LoadEnd: make([]float64, len(svc))}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	var devFree, gpuFree float64
	type save struct{ readyMs, durMs float64 }
	var saves []save // pending, in ready order (prefills end in order)
	for i, s := range svc {
		a := s.ArrivalMs * scale
		// Saves that can start before this arrival do (then run to their end).
		for len(saves) > 0 && math.Max(devFree, saves[0].readyMs) < a {
			devFree = math.Max(devFree, saves[0].readyMs) + saves[0].durMs
			saves = saves[1:]
		}
		loadStart := a
		if len(s.LayerReady) > 0 {
			loadStart = math.Max(a, devFree)
			devFree = loadStart + ms(s.Load)
		}
		o.LoadStart[i], o.LoadEnd[i] = loadStart, loadStart+ms(s.Load)
		t := math.Max(a, gpuFree)
		g0 := t
		c := ms(s.LayerCompute)
		for l := 0; l < s.Layers; l++ {
			if l < len(s.LayerReady) {
				t = math.Max(t, loadStart+ms(s.LayerReady[l]))
			}
			t += c
		}
		gpuFree = t
		o.TTFTms[i] = t - a
		o.StallMs[i] = math.Max(0, (t-g0)-float64(s.Layers)*c)
		if s.Save > 0 {
			n := max(1, s.SaveBlocks)
			for k := 0; k < n; k++ {
				saves = append(saves, save{readyMs: t, durMs: ms(s.Save) / float64(n)})
			}
		}
	}
	return o
}

// RatePoint is the SLO attainment at one request rate.
type RatePoint struct {
	RatePerS   float64
	Attainment float64 // fraction of requests with TTFT ≤ SLO
	P50ms      float64
	P90ms      float64
	P99ms      float64
}

// Sweep replays svc at request rates from 1/64 to 1024 times the base rate
// (log grid, 4 points per doubling) and returns the attainment curve and the
// highest rate whose p90 TTFT meets sloMs (refined by bisection between the
// last passing and first failing grid point; 0 when even the lowest fails).
// When even the highest rate tried meets the SLO, maxRate is that rate and
// the true maximum is higher: MaxRateTried reports it.
func Sweep(svc []Service, sloMs float64) (curve []RatePoint, maxRate float64) {
	if len(svc) < 2 {
		return nil, 0
	}
	base := baseRate(svc)
	if base <= 0 {
		return nil, 0
	}
	p90 := func(speed float64) float64 { return metrics.Percentile(Simulate(svc, 1/speed).TTFTms, 0.9) }
	lastOK, firstBad := 0.0, 0.0
	for k := -24; k <= 40; k++ {
		speed := math.Pow(2, float64(k)/4)
		o := Simulate(svc, 1/speed)
		q := metrics.Summarize(o.TTFTms)
		pt := RatePoint{RatePerS: base * speed, Attainment: metrics.Attainment(o.TTFTms, sloMs), P50ms: q.P50, P90ms: q.P90, P99ms: q.P99}
		curve = append(curve, pt)
		if pt.P90ms <= sloMs {
			if firstBad == 0 {
				lastOK = speed
			}
		} else if firstBad == 0 {
			firstBad = speed
		}
	}
	if lastOK == 0 {
		return curve, 0
	}
	if firstBad == 0 {
		return curve, base * lastOK // meets the SLO at every rate tried
	}
	lo, hi := lastOK, firstBad
	for i := 0; i < 30 && hi/lo > 1.001; i++ {
		mid := math.Sqrt(lo * hi)
		if p90(mid) <= sloMs {
			lo = mid
		} else {
			hi = mid
		}
	}
	return curve, base * lo
}

// baseRate is the window's own request rate (req/s) over its arrivals; 0
// for fewer than two requests or no span.
func baseRate(svc []Service) float64 {
	if len(svc) < 2 {
		return 0
	}
	span := svc[len(svc)-1].ArrivalMs - svc[0].ArrivalMs
	if span <= 0 {
		return 0
	}
	return float64(len(svc)-1) / (span / 1000)
}

// TTFTAt replays svc with its arrivals scaled to ratePerS (the timeline
// Sweep uses) and summarizes the TTFTs; ok is false when svc has no rate.
func TTFTAt(svc []Service, ratePerS float64) (q metrics.Summary, ok bool) {
	base := baseRate(svc)
	if base <= 0 || ratePerS <= 0 {
		return q, false
	}
	return metrics.Summarize(Simulate(svc, base/ratePerS).TTFTms), true
}

// RateTTFT is the timeline at one request rate: every request's TTFT (ms,
// in arrival order) and their nearest-rank percentiles.
type RateTTFT struct {
	RatePerS float64   `json:"rate_per_s"`
	P50ms    float64   `json:"ttft_ms_p50"`
	P90ms    float64   `json:"ttft_ms_p90"`
	P99ms    float64   `json:"ttft_ms_p99"`
	TTFTms   []float64 `json:"ttft_ms"`
}

// RatesTTFT replays svc at each of ratesPerS, with arrivals scaled by
// nominalPerS/rate: svc's ArrivalMs are taken as drawn at nominalPerS
// requests/s (a generated workload's own rate, as eval/vllm/docqa.arrivals_s
// scales the same plan), not at the window's measured rate TTFTAt uses. Nil
// for no services or a rate or nominalPerS that is not > 0.
func RatesTTFT(svc []Service, nominalPerS float64, ratesPerS []float64) []RateTTFT {
	if len(svc) == 0 || !(nominalPerS > 0) {
		return nil
	}
	out := make([]RateTTFT, 0, len(ratesPerS))
	for _, r := range ratesPerS {
		if !(r > 0) {
			return nil
		}
		t := Simulate(svc, nominalPerS/r).TTFTms
		q := metrics.Summarize(t)
		out = append(out, RateTTFT{RatePerS: r, P50ms: q.P50, P90ms: q.P90, P99ms: q.P99, TTFTms: t})
	}
	return out
}

// MaxRateTried reports whether maxRate is the highest rate Sweep tried (so
// the SLO holds beyond it: a lower bound, not the maximum).
func MaxRateTried(curve []RatePoint, maxRate float64) bool {
	return len(curve) > 0 && maxRate > 0 && maxRate >= curve[len(curve)-1].RatePerS*(1-1e-9)
}

// Bandwidth bins restored bytes over the timeline into bins of binMs (each
// load's bytes spread evenly over its interval). Returns bin start times and
// bytes per second.
func Bandwidth(svc []Service, o Outcome, binMs float64) (tMs, bytesPerS []float64) {
	if len(svc) == 0 || binMs <= 0 {
		return nil, nil
	}
	end := 0.0
	for i := range svc {
		end = math.Max(end, o.LoadEnd[i])
	}
	n := int(end/binMs) + 1
	if n > 100000 {
		n = 100000
		binMs = end / float64(n-1)
	}
	bins := make([]float64, n)
	for i, s := range svc {
		a, b := o.LoadStart[i], o.LoadEnd[i]
		if s.Bytes == 0 || b <= a {
			continue
		}
		rate := float64(s.Bytes) / (b - a) // bytes per ms
		for k := int(a / binMs); k < n && float64(k)*binMs < b; k++ {
			lo, hi := math.Max(a, float64(k)*binMs), math.Min(b, float64(k+1)*binMs)
			if hi > lo {
				bins[k] += rate * (hi - lo)
			}
		}
	}
	tMs = make([]float64, n)
	bytesPerS = make([]float64, n)
	for k := range bins {
		tMs[k] = float64(k) * binMs
		bytesPerS[k] = bins[k] / (binMs / 1000)
	}
	return tMs, bytesPerS
}
