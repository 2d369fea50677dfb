package harness

import (
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/eval/metrics"
)

// claimBackend is a backend whose every request restores for loadMs (layer
// by layer) and computes 0.2 ms per layer, arrivals 100 ms apart; every 20th
// request hits nothing (its prefill 10 ms per layer).
func claimBackend(name string, loadMs float64, slo float64) BackendResult {
	const n, layers = 200, 4
	b := BackendResult{Backend: name, Requests: n}
	for i := 0; i < n; i++ {
		s := Service{ArrivalMs: float64(i) * 100, Layers: layers, LayerCompute: 200 * time.Microsecond, Bytes: 1 << 20}
		if i%20 == 0 {
			s.LayerCompute = 10 * time.Millisecond
		} else if loadMs > 0 {
			load := time.Duration(loadMs * float64(time.Millisecond))
			s.Load = load
			for l := 1; l <= layers; l++ {
				s.LayerReady = append(s.LayerReady, load*time.Duration(l)/layers)
			}
			b.RequestsWithHitsRestore++
		}
		b.Services = append(b.Services, s)
	}
	o := Simulate(b.Services, 1)
	q := metrics.Summarize(o.TTFTms)
	b.TTFTmsP50, b.TTFTmsP99 = q.P50, q.P99
	b.Curve, b.MaxRateAtSLO = Sweep(b.Services, slo)
	return b
}

func TestClaims(t *testing.T) {
	const slo = 60.0
	res := &Result{SLOms: slo, Backends: []BackendResult{
		claimBackend("tutti-gpu", 10, slo),
		claimBackend("lmcache-gds", 40, slo),
		claimBackend("vllm-fs", 20, slo),
		claimBackend("lmcache-disk", 30, slo),
		claimBackend("dram", 9, slo),
		{Backend: "recompute", Skipped: "not asked for"},
	}}
	claims := Claims(res)
	for _, c := range claims {
		t.Log(c)
	}
	if len(claims) != 5 {
		t.Fatalf("%d claims, want 5 (p99 and rate against lmcache-gds and vllm-fs, p50 against dram): %v", len(claims), claims)
	}
	byName := map[string]Claim{}
	for _, c := range claims {
		byName[c.Name] = c
		if c.Backend != "tutti-gpu" {
			t.Errorf("%s measured %s, want tutti-gpu", c.Name, c.Backend)
		}
	}
	gds, vfs := res.Backends[1], res.Backends[2]
	p99 := byName["p99 TTFT against lmcache-gds"]
	if p99.RatePerS != gds.MaxRateAtSLO {
		t.Errorf("p99 taken at %.3f req/s, want lmcache-gds's rate at SLO %.3f", p99.RatePerS, gds.MaxRateAtSLO)
	}
	qt, _ := TTFTAt(res.Backends[0].Services, p99.RatePerS)
	qb, _ := TTFTAt(gds.Services, p99.RatePerS)
	if want := qb.P99 / qt.P99; p99.Measured != want || want <= 1 {
		t.Errorf("p99 ratio %.3f, want %.3f (> 1: the slower backend queues)", p99.Measured, want)
	}
	rate := byName["rate at SLO against vllm-fs"]
	if want := res.Backends[0].MaxRateAtSLO / vfs.MaxRateAtSLO; rate.Measured != want || want <= 1 {
		t.Errorf("rate ratio %.3f, want %.3f (> 1)", rate.Measured, want)
	}
	if rate.Met != (rate.Measured >= claimRateGoal) {
		t.Errorf("rate claim met=%v at %.2f× (goal %.1f×)", rate.Met, rate.Measured, claimRateGoal)
	}
	dram := byName["p50 TTFT against dram"]
	if dram.AtLeast || dram.Measured <= 1 || !dram.Met {
		t.Errorf("dram claim %+v: want tutti slightly slower than DRAM, within 1.2×", dram)
	}
	if !p99.Met && !strings.Contains(p99.Detail, "hit nothing") {
		t.Errorf("missed p99 claim without the no-hit reason (5%% of requests hit nothing): %s", p99.Detail)
	}
	if _, ok := byName["p99 TTFT against lmcache-disk"]; ok {
		t.Error("lmcache-disk compared although vllm-fs is the faster CPU-issued design")
	}

	// tutti-cpu stands in where tutti-gpu did not run; nothing without either.
	res.Backends[0].Backend = "tutti-cpu"
	if c := Claims(res); len(c) == 0 || c[0].Backend != "tutti-cpu" {
		t.Errorf("claims without tutti-gpu: %v, want tutti-cpu's", c)
	}
	res.Backends[0].Skipped = "no GPU"
	if c := Claims(res); c != nil {
		t.Errorf("claims with no tutti backend: %v", c)
	}
}

func TestRateClaimWithoutRatio(t *testing.T) {
	for _, tc := range []struct {
		name         string
		tRate, bRate float64
		met, noRatio bool
		says         string
	}{
		{"baseline never meets it", 0.63, 0, true, true, "no ratio, vllm-fs never meets the SLO (goal ≥ 2.0×, met)"},
		{"neither meets it", 0, 0, false, true, "no ratio, vllm-fs never meets the SLO (goal ≥ 2.0×, missed)"},
		{"both meet it", 4, 2, true, false, "2.00× (goal ≥ 2.0×, met)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rateClaim(&BackendResult{Backend: "tutti-cpu", MaxRateAtSLO: tc.tRate}, &BackendResult{Backend: "vllm-fs", MaxRateAtSLO: tc.bRate})
			if c.Met != tc.met || c.NoRatio != tc.noRatio || !strings.Contains(c.String(), tc.says) {
				t.Fatalf("claim %+v, line %q: want met %v, no ratio %v, saying %q", c, c, tc.met, tc.noRatio, tc.says)
			}
		})
	}
}
