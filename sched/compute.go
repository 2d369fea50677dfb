package sched

import (
	"errors"
	"fmt"
	"math"
)

// ComputeModel predicts the prefill time of one transformer layer. Computing n
// tokens at positions [s, s+n) with causal attention over everything before
// them costs
//
//	t(n, s) = scale · (FixedNs + PerTokenNs·n + PerPairNs·pairs(n, s)),  pairs = n·s + n(n+1)/2
//
// (pairs = Σ_{p=s}^{s+n-1} (p+1), the query×key products of the attention, so the
// "context" of the linear-plus-attention form is the mean attended length
// s + (n+1)/2). FixedNs is launch and synchronisation cost, PerTokenNs the
// GEMMs (projections, MLP), PerPairNs the attention. t(0, s) = 0.
//
// The three coefficients come from a profile (FitCompute over measured points,
// or ComputeFromFLOPs); scale corrects them online (Observe). The value is
// plain data: copy it freely; it is not safe for concurrent mutation.
type ComputeModel struct {
	FixedNs    float64 // per layer and chunk, ns
	PerTokenNs float64 // per computed token, ns
	PerPairNs  float64 // per (query token, attended key token) pair, ns

	logScale     float64 // online correction, log of the multiplier
	observations int64
}

// Online correction bounds (see Observe).
const (
	computeAlpha     = 0.125        // EWMA weight of one observation in the log domain
	computeMaxStep   = math.Ln2     // one observation moves the scale by at most ×2 or ÷2 …
	computeMaxLogAbs = 4 * math.Ln2 // … and the scale stays within [1/16, 16] of the profile
)

// ErrBadProfile is returned for a profile that cannot predict anything
// (negative or non-finite coefficients, all zero, too few points).
var ErrBadProfile = errors.New("sched: bad profile")

// NewComputeModel checks the coefficients and returns a model with no correction.
func NewComputeModel(fixedNs, perTokenNs, perPairNs float64) (ComputeModel, error) {
	for _, v := range []float64{fixedNs, perTokenNs, perPairNs} {
		if !(v >= 0) || math.IsInf(v, 0) {
			return ComputeModel{}, fmt.Errorf("compute model (%v, %v, %v): %w", fixedNs, perTokenNs, perPairNs, ErrBadProfile)
		}
	}
	if perTokenNs == 0 && perPairNs == 0 {
		return ComputeModel{}, fmt.Errorf("compute model: per-token and per-pair costs both zero: %w", ErrBadProfile)
	}
	return ComputeModel{FixedNs: fixedNs, PerTokenNs: perTokenNs, PerPairNs: perPairNs}, nil
}

// FLOPsProfile derives a compute model from a model's shape and measured rates.
type FLOPsProfile struct {
	LinearFLOPsPerToken float64 // per layer: 2 × the layer's weight count (projections + MLP)
	AttnFLOPsPerPair    float64 // per layer: 4 × query heads × head dim (QKᵀ and PV)
	GEMMFLOPsPerSec     float64 // measured dense GEMM rate of the GPU
	AttnFLOPsPerSec     float64 // measured attention kernel rate; 0 = GEMMFLOPsPerSec
	FixedNs             float64 // per-layer launch overhead
}

// ComputeFromFLOPs returns the model t = Fixed + n·lin/gemm + pairs·attn/attnRate.
func ComputeFromFLOPs(p FLOPsProfile) (ComputeModel, error) {
	attnRate := p.AttnFLOPsPerSec
	if attnRate == 0 {
		attnRate = p.GEMMFLOPsPerSec
	}
	if !(p.GEMMFLOPsPerSec > 0) || !(attnRate > 0) {
		return ComputeModel{}, fmt.Errorf("compute model from FLOPs: rates %v, %v: %w", p.GEMMFLOPsPerSec, attnRate, ErrBadProfile)
	}
	return NewComputeModel(p.FixedNs, p.LinearFLOPsPerToken/p.GEMMFLOPsPerSec*1e9, p.AttnFLOPsPerPair/attnRate*1e9)
}

// LayerPoint is one measured layer time: Tokens computed starting at position StartPos.
type LayerPoint struct {
	Tokens, StartPos int
	Ns               float64
}

// FitCompute fits (FixedNs, PerTokenNs, PerPairNs) to measured points by least
// squares with non-negative coefficients (every subset of the three terms is
// solved and the best non-negative fit wins: 7 tiny systems). Points should
// vary both tokens and start position, otherwise the terms are confounded and
// the fit keeps the simpler subset that explains them.
func FitCompute(points []LayerPoint) (ComputeModel, error) {
	if len(points) < 2 {
		return ComputeModel{}, fmt.Errorf("fitting compute model: %d points, need ≥ 2: %w", len(points), ErrBadProfile)
	}
	feat := func(p LayerPoint) [3]float64 {
		n, s := float64(p.Tokens), float64(p.StartPos)
		return [3]float64{1, n, n*s + n*(n+1)/2}
	}
	// Normalise the columns so the normal equations are well conditioned.
	var norm [3]float64
	for _, p := range points {
		if p.Tokens <= 0 || p.StartPos < 0 || !(p.Ns >= 0) || math.IsInf(p.Ns, 0) {
			return ComputeModel{}, fmt.Errorf("fitting compute model: point %+v: %w", p, ErrBadProfile)
		}
		f := feat(p)
		for j := range f {
			norm[j] = math.Max(norm[j], f[j])
		}
	}
	bestErr := math.Inf(1)
	var best [3]float64
	for mask := 1; mask < 8; mask++ {
		var cols []int
		for j := 0; j < 3; j++ {
			if mask&(1<<j) != 0 {
				cols = append(cols, j)
			}
		}
		m := len(cols)
		var a [3][4]float64 // augmented normal equations
		for _, p := range points {
			f := feat(p)
			for i := 0; i < m; i++ {
				fi := f[cols[i]] / norm[cols[i]]
				for k := 0; k < m; k++ {
					a[i][k] += fi * f[cols[k]] / norm[cols[k]]
				}
				a[i][m] += fi * p.Ns
			}
		}
		x, ok := solve(a, m)
		if !ok {
			continue
		}
		var coef [3]float64
		neg := false
		for i, j := range cols {
			coef[j] = x[i] / norm[j]
			if coef[j] < 0 {
				neg = true
			}
		}
		if neg {
			continue
		}
		var sse float64
		for _, p := range points {
			f := feat(p)
			r := coef[0]*f[0] + coef[1]*f[1] + coef[2]*f[2] - p.Ns
			sse += r * r
		}
		if sse < bestErr*(1-1e-9) { // prefer the earlier (simpler) subset on ties
			bestErr, best = sse, coef
		}
	}
	if math.IsInf(bestErr, 1) {
		return ComputeModel{}, fmt.Errorf("fitting compute model: no non-negative fit: %w", ErrBadProfile)
	}
	return NewComputeModel(best[0], best[1], best[2])
}

// solve runs Gaussian elimination with partial pivoting on an m×(m+1) system.
func solve(a [3][4]float64, m int) ([3]float64, bool) {
	var x [3]float64
	for c := 0; c < m; c++ {
		p := c
		for r := c + 1; r < m; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		if math.Abs(a[p][c]) < 1e-12 {
			return x, false
		}
		a[c], a[p] = a[p], a[c]
		for r := c + 1; r < m; r++ {
			f := a[r][c] / a[c][c]
			for k := c; k <= m; k++ {
				a[r][k] -= f * a[c][k]
			}
		}
	}
	for r := m - 1; r >= 0; r-- {
		s := a[r][m]
		for k := r + 1; k < m; k++ {
			s -= a[r][k] * x[k]
		}
		x[r] = s / a[r][r]
	}
	return x, true
}

// pairs is the number of attention (query, key) products for n tokens from s.
func pairs(n, s int) float64 {
	fn := float64(n)
	return fn*float64(s) + fn*(fn+1)/2
}

// baseNs is the profile's prediction without the online correction.
func (m ComputeModel) baseNs(tokens, startPos int) float64 {
	if tokens <= 0 {
		return 0
	}
	return m.FixedNs + m.PerTokenNs*float64(tokens) + m.PerPairNs*pairs(tokens, startPos)
}

// Scale is the online correction factor applied to the profile (1 = none).
func (m ComputeModel) Scale() float64 { return math.Exp(m.logScale) }

// Observations counts the layer times Observe has taken.
func (m ComputeModel) Observations() int64 { return m.observations }

// LayerNs predicts one layer's time for tokens computed from startPos.
func (m ComputeModel) LayerNs(tokens, startPos int) float64 {
	return math.Exp(m.logScale) * m.baseNs(tokens, startPos)
}

// Observe corrects the model with one measured layer time. The update is a
// bounded exponential average in the log domain: the log of measured/profile
// moves the log scale by computeAlpha of the error, the error clipped to ±ln 2
// per observation (one outlier moves the scale by at most 2^(1/8) ≈ 9%), and the
// scale clipped to [1/16, 16] of the profile. It corrects a GPU that is
// uniformly faster or slower than profiled (clocks, other tenants, a different
// kernel); the shape (fixed vs linear vs attention) stays the profile's.
// Non-positive measurements and empty layers are ignored.
func (m *ComputeModel) Observe(tokens, startPos int, measuredNs int64) {
	base := m.baseNs(tokens, startPos)
	if measuredNs <= 0 || !(base > 0) {
		return
	}
	e := math.Log(float64(measuredNs)/base) - m.logScale
	e = math.Max(-computeMaxStep, math.Min(computeMaxStep, e))
	m.logScale += computeAlpha * e
	m.logScale = math.Max(-computeMaxLogAbs, math.Min(computeMaxLogAbs, m.logScale))
	m.observations++
}
