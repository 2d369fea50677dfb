package harness

import "sort"

// RoundFigures are one backend's figures in each round of a replay
// (Config.Rounds), in round order; the row's own figures are its median
// round's (by rate at SLO).
type RoundFigures struct {
	MaxRateAtSLO []float64 `json:"max_rate_at_slo"`
	TTFTmsP50    []float64 `json:"ttft_ms_p50"`
	TTFTmsP99    []float64 `json:"ttft_ms_p99"`
	BytesPerS    []float64 `json:"bytes_per_s"`
}

// MinMax is min and max of xs (0, 0 when empty).
func MinMax(xs []float64) (lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	lo, hi = xs[0], xs[0]
	for _, x := range xs {
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}

// settleRounds settles the SLO over every finished round, sweeps every
// round's rows and makes res.Backends one row per backend: the median round
// by rate at SLO (the lower median with an even count), carrying every
// round's figures (Rounds) when there was more than one. A backend keeps its
// first-seen position; a round cut short contributes what finished.
func settleRounds(cfg Config, res *Result, rounds [][]BackendResult) {
	var all []BackendResult
	for _, r := range rounds {
		all = append(all, r...)
	}
	res.Backends = all
	settleSLO(cfg, res)
	all = res.Backends
	if len(rounds) <= 1 {
		return
	}
	var order []string
	by := map[string][]BackendResult{}
	for _, b := range all {
		if _, ok := by[b.Backend]; !ok {
			order = append(order, b.Backend)
		}
		by[b.Backend] = append(by[b.Backend], b)
	}
	res.Backends = res.Backends[:0:0]
	for _, name := range order {
		rs := by[name]
		f := &RoundFigures{}
		for _, b := range rs {
			f.MaxRateAtSLO = append(f.MaxRateAtSLO, b.MaxRateAtSLO)
			f.TTFTmsP50 = append(f.TTFTmsP50, b.TTFTmsP50)
			f.TTFTmsP99 = append(f.TTFTmsP99, b.TTFTmsP99)
			f.BytesPerS = append(f.BytesPerS, b.BytesPerS)
		}
		idx := make([]int, len(rs))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(i, j int) bool { return rs[idx[i]].MaxRateAtSLO < rs[idx[j]].MaxRateAtSLO })
		row := rs[idx[(len(idx)-1)/2]]
		row.Rounds = f
		res.Backends = append(res.Backends, row)
	}
}
