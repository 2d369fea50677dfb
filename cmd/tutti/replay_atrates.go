package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tutti-io/tutti/eval/harness"
)

// maxAtRates bounds --at-rates: each rate adds every request's TTFT to
// every backend's JSON row.
const maxAtRates = 32

// parseAtRates is --at-rates: comma-separated request rates (req/s), each
// > 0; empty gives none.
func parseAtRates(s string) ([]float64, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > maxAtRates {
		return nil, fmt.Errorf("%d rates, at most %d", len(parts), maxAtRates)
	}
	out := make([]float64, 0, len(parts))
	for _, p := range parts {
		r, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || !(r > 0) || r > 1e6 {
			return nil, fmt.Errorf("rate %q: want a number of requests/s, > 0", p)
		}
		out = append(out, r)
	}
	return out, nil
}

// atRatesOf is --at-rates, checked against the workload: only a generated
// one's arrivals can be scaled to a rate.
func (f *replayFlags) atRatesOf() ([]float64, error) {
	rates, err := parseAtRates(*f.atRates)
	if err == nil && rates != nil && f.kind != workloadDocQA {
		err = errors.New("needs --workload docqa: it scales a generated workload's arrivals")
	}
	if err != nil {
		return nil, fmt.Errorf("--at-rates: %w", err)
	}
	return rates, nil
}

// addAtRates gives every backend row that ran its timeline at rates (each
// request's TTFT there) and the workload's description. The generated
// workload's arrivals were drawn at nominalPerS and then multiplied by
// timeScale, so they are taken as drawn at nominalPerS/timeScale: a rate R
// here then replays the same arrival times as eval/vllm/docqa.arrivals_s(plan,
// R) gives the real engine.
func addAtRates(res *harness.Result, rates []float64, nominalPerS, timeScale float64, workload string) {
	if len(rates) == 0 {
		return
	}
	for i := range res.Backends {
		b := &res.Backends[i]
		b.Workload = workload
		if b.Skipped == "" {
			b.AtRates = harness.RatesTTFT(b.Services, nominalPerS/timeScale, rates)
		}
	}
}
