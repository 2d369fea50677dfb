// Package metrics holds the small statistics of the evaluation: percentiles
// (nearest-rank), SLO attainment, and empirical CDFs. Pure functions over
// slices; inputs are never modified.
package metrics

import (
	"math"
	"sort"
)

// Percentile returns the nearest-rank q-quantile (q in [0,1]) of values:
// the smallest value v such that at least q of the values are ≤ v. NaN for
// an empty slice.
func Percentile(values []float64, q float64) float64 {
	if len(values) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), values...)
	sort.Float64s(s)
	return percentileSorted(s, q)
}

func percentileSorted(s []float64, q float64) float64 {
	if q <= 0 {
		return s[0]
	}
	rank := int(math.Ceil(q * float64(len(s))))
	if rank > len(s) {
		rank = len(s)
	}
	return s[rank-1]
}

// Summary is the usual description of a latency sample.
type Summary struct {
	N                        int
	Mean, P50, P90, P99, Max float64
}

// Summarize computes a Summary (zero N and NaNs for an empty sample).
func Summarize(values []float64) Summary {
	if len(values) == 0 {
		nan := math.NaN()
		return Summary{Mean: nan, P50: nan, P90: nan, P99: nan, Max: nan}
	}
	s := append([]float64(nil), values...)
	sort.Float64s(s)
	var sum float64
	for _, v := range s {
		sum += v
	}
	return Summary{N: len(s), Mean: sum / float64(len(s)), P50: percentileSorted(s, 0.5),
		P90: percentileSorted(s, 0.9), P99: percentileSorted(s, 0.99), Max: s[len(s)-1]}
}

// Attainment is the fraction of values ≤ slo (1 for an empty sample).
func Attainment(values []float64, slo float64) float64 {
	if len(values) == 0 {
		return 1
	}
	n := 0
	for _, v := range values {
		if v <= slo {
			n++
		}
	}
	return float64(n) / float64(len(values))
}

// CDF returns the empirical CDF as sorted values xs and fractions ys
// (ys[i] = (i+1)/n).
func CDF(values []float64) (xs, ys []float64) {
	xs = append([]float64(nil), values...)
	sort.Float64s(xs)
	ys = make([]float64, len(xs))
	for i := range xs {
		ys[i] = float64(i+1) / float64(len(xs))
	}
	return xs, ys
}

// Mean of values (NaN when empty).
func Mean(values []float64) float64 {
	if len(values) == 0 {
		return math.NaN()
	}
	var s float64
	for _, v := range values {
		s += v
	}
	return s / float64(len(values))
}

// binomHalfCDF returns P(X ≤ k) for X ~ Binomial(n, 1/2) (0 for k < 0, 1
// for k ≥ n). Summed in logs, so n in the thousands stays finite.
func binomHalfCDF(n, k int) float64 {
	if k < 0 {
		return 0
	}
	if k >= n {
		return 1
	}
	lg := func(x int) float64 { v, _ := math.Lgamma(float64(x) + 1); return v }
	var p float64
	for j := 0; j <= k; j++ {
		p += math.Exp(lg(n) - lg(j) - lg(n-j) - float64(n)*math.Ln2)
	}
	return math.Min(p, 1)
}

// MedianCI returns a distribution-free confidence interval for the median
// of the population values were drawn from: the order statistics
// [x(k), x(n-k+1)] for the largest k with P(Binomial(n, 1/2) < k) ≤
// (1-conf)/2, so its coverage is at least conf. ok is false when values are
// too few for that confidence (fewer than 6 at 0.95) or conf is not in
// (0, 1).
func MedianCI(values []float64, conf float64) (lo, hi float64, ok bool) {
	n := len(values)
	if n == 0 || !(conf > 0 && conf < 1) {
		return 0, 0, false
	}
	tail := (1 - conf) / 2
	k := 0
	for k < n/2 && binomHalfCDF(n, k) <= tail { // k+1 is still within the tail
		k++
	}
	if k == 0 {
		return 0, 0, false
	}
	s := append([]float64(nil), values...)
	sort.Float64s(s)
	return s[k-1], s[n-k], true
}

// SignTest counts the values above and below ref (those equal to it are
// left out) and returns the two-sided sign test's p-value for "the median
// is ref": the probability, with no difference, of a split at least as
// uneven as this one. 1 with no value apart from ref.
func SignTest(values []float64, ref float64) (above, below int, p float64) {
	for _, v := range values {
		switch {
		case v > ref:
			above++
		case v < ref:
			below++
		}
	}
	n := above + below
	if n == 0 {
		return 0, 0, 1
	}
	return above, below, math.Min(1, 2*binomHalfCDF(n, min(above, below)))
}
