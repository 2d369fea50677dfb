package harness

import (
	"fmt"
	"strings"
)

// The figures the Tutti paper claims for its design (arXiv 2605.03375:
// Llama3-8B on one GPU, long-document QA, 4 NVMe drives), as goals the
// replay measures side by side.
const (
	claimP99Goal  = 4.6 // p99 TTFT of the GDS design over tutti's at the same rate (−78.3%)
	claimRateGoal = 2.0 // tutti's highest rate at the SLO over the GDS design's
	claimDRAMGoal = 1.2 // tutti's p50 TTFT over the DRAM tier's ("nearly the same")
)

// Claim is one of the paper's figures as this replay measured it.
type Claim struct {
	Name     string  `json:"name"`
	Backend  string  `json:"backend"` // tutti's backend measured (tutti-gpu where it ran)
	Against  string  `json:"against"`
	RatePerS float64 `json:"rate_per_s"` // the request rate the figure is taken at (0: none, a rate ratio)
	Measured float64 `json:"measured"`
	Goal     float64 `json:"goal"`
	AtLeast  bool    `json:"at_least"` // the goal is Measured ≥ Goal (else ≤)
	Met      bool    `json:"met"`
	// NoRatio: the baseline never meets the SLO, so a ratio of rates has no
	// value (Measured 0); Met says whether tutti does.
	NoRatio bool   `json:"no_ratio,omitempty"`
	Detail  string `json:"detail"` // the values compared and, where the goal is missed, what the run shows about why
}

// String is the one line the summary prints.
func (c Claim) String() string {
	op, verdict := "≤", "missed"
	if c.AtLeast {
		op = "≥"
	}
	if c.Met {
		verdict = "met"
	}
	if c.NoRatio {
		return fmt.Sprintf("%s: no ratio, %s never meets the SLO (goal %s %.1f×, %s): %s", c.Name, c.Against, op, c.Goal, verdict, c.Detail)
	}
	return fmt.Sprintf("%s: %.2f× (goal %s %.1f×, %s): %s", c.Name, c.Measured, op, c.Goal, verdict, c.Detail)
}

// Claims measures the paper's figures for tutti (tutti-gpu where it ran,
// else tutti-cpu) against the LMCache-GDS design, the best CPU-issued design
// (lmcache-disk or vllm-fs, by rate at SLO) and the DRAM tier, among the
// backends that ran: p99 TTFT at the baseline's highest rate at the SLO
// (the heaviest load it still serves within the SLO; the window's own rate
// where it never meets it), the highest rates at the SLO, and p50 TTFT at
// the window's rate. Nil when no tutti backend ran.
func Claims(res *Result) []Claim {
	ran := ranBackends(res)
	t := tuttiOf(ran)
	if t == nil {
		return nil
	}
	var against []*BackendResult
	if b := ran["lmcache-gds"]; b != nil {
		against = append(against, b)
	}
	var best *BackendResult
	for _, n := range []string{"lmcache-disk", "vllm-fs"} {
		if b := ran[n]; b != nil && (best == nil || b.MaxRateAtSLO > best.MaxRateAtSLO) {
			best = b
		}
	}
	if best != nil {
		against = append(against, best)
	}
	var out []Claim
	for _, b := range against {
		out = append(out, p99Claim(res, t, b), rateClaim(t, b))
	}
	if d := ran["dram"]; d != nil && d.TTFTmsP50 > 0 {
		c := Claim{Name: "p50 TTFT against " + d.Backend, Backend: t.Backend, Against: d.Backend, RatePerS: baseRate(t.Services),
			Measured: t.TTFTmsP50 / d.TTFTmsP50, Goal: claimDRAMGoal}
		c.Met = c.Measured <= c.Goal
		c.Detail = fmt.Sprintf("%s %.1f ms, %s %.1f ms at the window's %.2f req/s", t.Backend, t.TTFTmsP50, d.Backend, d.TTFTmsP50, c.RatePerS)
		if !c.Met {
			c.Detail += "; " + restoresCompared(t, d)
		}
		if d.BytesPerS > 0 && d.BytesPerS < t.BytesPerS {
			c.Detail += fmt.Sprintf("; the DRAM tier is no bound in this run: its restores measured %.2f GB/s against %s's %.2f", d.BytesPerS/1e9, t.Backend, t.BytesPerS/1e9)
		}
		out = append(out, c)
	}
	return out
}

// ranBackends are the backends of res that ran, by name.
func ranBackends(res *Result) map[string]*BackendResult {
	ran := map[string]*BackendResult{}
	for i := range res.Backends {
		if b := &res.Backends[i]; b.Skipped == "" && len(b.Services) > 0 {
			ran[b.Backend] = b
		}
	}
	return ran
}

// tuttiOf is the tutti backend the claims and gains are about: tutti-gpu
// where it ran, else tutti-cpu; nil when neither ran.
func tuttiOf(ran map[string]*BackendResult) *BackendResult {
	if t := ran["tutti-gpu"]; t != nil {
		return t
	}
	return ran["tutti-cpu"]
}

// coldRequests says which requests of res's workload hit nothing.
func coldRequests(res *Result) string {
	if res.Workload == WorkloadDocQA {
		return "in docqa, each document's first question"
	}
	return "in this window, each request whose prefix no earlier one brought"
}

// p99Claim: b's p99 TTFT over t's at b's highest rate meeting the SLO.
func p99Claim(res *Result, t, b *BackendResult) Claim {
	rate, at := b.MaxRateAtSLO, "its highest rate at the SLO"
	if rate <= 0 {
		rate, at = baseRate(b.Services), "the window's rate (it never meets the SLO)"
	}
	c := Claim{Name: "p99 TTFT against " + b.Backend, Backend: t.Backend, Against: b.Backend, RatePerS: rate, Goal: claimP99Goal, AtLeast: true}
	qt, ok1 := TTFTAt(t.Services, rate)
	qb, ok2 := TTFTAt(b.Services, rate)
	if !ok1 || !ok2 || qt.P99 <= 0 {
		c.Detail = "no rate to compare at (a window of fewer than two requests)"
		return c
	}
	c.Measured = qb.P99 / qt.P99
	c.Met = c.Measured >= c.Goal
	c.Detail = fmt.Sprintf("at %.2f req/s (%s, SLO p90 ≤ %.0f ms): %s p99 %.1f ms, %s p99 %.1f ms", rate, at, res.SLOms, b.Backend, qb.P99, t.Backend, qt.P99)
	if !c.Met {
		var why []string
		if noHit := 1 - float64(t.RequestsWithHitsRestore)/float64(max(1, t.Requests)); noHit > 0.01 {
			why = append(why, fmt.Sprintf("%.1f%% of requests hit nothing and prefill whole (%s), so p99 is a full prefill for every backend", 100*noHit, coldRequests(res)))
		}
		why = append(why, restoresCompared(b, t))
		c.Detail += "; " + strings.Join(why, "; ")
	}
	return c
}

// rateClaim: t's highest rate at the SLO over b's.
func rateClaim(t, b *BackendResult) Claim {
	c := Claim{Name: "rate at SLO against " + b.Backend, Backend: t.Backend, Against: b.Backend, Goal: claimRateGoal, AtLeast: true}
	if b.MaxRateAtSLO <= 0 {
		c.Detail = fmt.Sprintf("%s never meets the SLO; %s up to %.2f req/s", b.Backend, t.Backend, t.MaxRateAtSLO)
		c.NoRatio, c.Met = true, t.MaxRateAtSLO > 0
		return c
	}
	c.Measured = t.MaxRateAtSLO / b.MaxRateAtSLO
	c.Met = c.Measured >= c.Goal
	c.Detail = fmt.Sprintf("%s %.2f req/s, %s %.2f req/s", t.Backend, t.MaxRateAtSLO, b.Backend, b.MaxRateAtSLO)
	if t.MaxRateIsLowerBound {
		c.Detail += fmt.Sprintf(" (%s's is a lower bound: it meets the SLO at every rate tried)", t.Backend)
	}
	if !c.Met {
		c.Detail += "; " + restoresCompared(b, t)
	}
	return c
}

// restoresCompared says what the run measured of x's restores and y's (what
// a missed goal comes down to): bytes per second and of the ceiling, I/Os
// per request, hit ratio, GPU stall.
func restoresCompared(x, y *BackendResult) string {
	return fmt.Sprintf("restores: %s %.2f GB/s (%.2f of the ceiling, %.0f I/Os per request, hit ratio %.3f, GPU stall %.1f ms), %s %.2f GB/s (%.2f, %.0f, %.3f, %.1f ms)",
		x.Backend, x.BytesPerS/1e9, x.CeilingFraction, x.IOsPerRequestMean, x.HitRatio, x.GPUStallMsMean,
		y.Backend, y.BytesPerS/1e9, y.CeilingFraction, y.IOsPerRequestMean, y.HitRatio, y.GPUStallMsMean)
}
