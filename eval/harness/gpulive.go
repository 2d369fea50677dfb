package harness

import (
	"fmt"
	"slices"
	"time"

	"github.com/tutti-io/tutti/eval/metrics"
)

// The GPU prefill either runs for every request (the default: each
// request's layer time is its own measured GEMMs, run next to its restore)
// or, with SetLiveEvery(n > 1), comes from the model Calibrate fitted on
// this GPU for every request, and only every n-th request also runs its
// GEMMs live next to its restore, as the check of that model: its measured
// layer time against the model's is kept (LiveRatios) and reported, not
// used, so every request of every backend has its layer time from one
// source. The timeline is the same either way; what is saved is the GPU
// time of the prefills (recompute prefills every request in full).

// SetLiveEvery makes every request's layer time the calibrated model's and
// runs only every n-th request's prefill on the GPU (n ≤ 1: every request
// is measured, as without it). c is the replay's compute (SetupCompute's):
// its label is rewritten to say so. Nil-safe.
func (g *GPUCompute) SetLiveEvery(n int, c *Compute) {
	if g == nil {
		return
	}
	g.every = max(1, n)
	c.Label = g.label()
}

// LiveEvery is SetLiveEvery's n (1: every request measured; 0 for nil).
func (g *GPUCompute) LiveEvery() int {
	if g == nil {
		return 0
	}
	return max(1, g.every)
}

// Live reports whether request seq runs its prefill on the GPU (false
// without a GPU).
func (g *GPUCompute) Live(seq int) bool {
	return g != nil && (g.every <= 1 || seq%g.every == 0)
}

// Layer returns the per-layer compute time of a request that computes
// newTokens after cachedTokens. model is the replay's compute model (with a
// GPU, the one fitted on it). Without a GPU it is model's; with one and
// every request live, the measured one (Finish); calibrated, the model's,
// after collecting a live request's measurement as the model's check (and
// its diagnostics: check).
func (g *GPUCompute) Layer(live bool, r *PrefillRun, model Compute, newTokens, cachedTokens int) (time.Duration, error) {
	if g == nil {
		return model.Layer(newTokens, cachedTokens), nil
	}
	if g.every <= 1 {
		return g.Finish(r, model, newTokens, cachedTokens)
	}
	want := model.Layer(newTokens, cachedTokens)
	if !live {
		if newTokens > 0 {
			g.stats.Calibrated++
		}
		return want, nil
	}
	got, concurrent, err := g.finish(r, newTokens, cachedTokens)
	if err != nil {
		return 0, err
	}
	if newTokens > 0 && want > 0 {
		g.stats.LiveRatios = append(g.stats.LiveRatios, float64(got)/float64(want))
		if len(g.times) > 1 { // where a live prefill's excess sits: its first layer (a GPU idle before it) or all of them
			rest := slices.Clone(g.times[1:])
			slices.Sort(rest)
			g.stats.LiveFirstRatios = append(g.stats.LiveFirstRatios, float64(g.times[0])/float64(want))
			g.stats.LiveRestRatios = append(g.stats.LiveRestRatios, float64(rest[len(rest)/2])/float64(want))
		}
		if err := g.check(r, concurrent, got, want, newTokens, cachedTokens); err != nil {
			return 0, err
		}
	}
	return want, nil
}

// liveNote is the GPU prefill note's part on the calibrated model's check
// ("" when every request was measured): over all backends, then per
// backend (backendNote).
func (gs GPUComputeStats) liveNote(every int) string {
	if every <= 1 {
		return ""
	}
	s := fmt.Sprintf("; calibrated: %d prefills' layer times from the model fitted on this GPU, every %d-th request also run live next to its restore (%d checks)",
		gs.Calibrated, every, len(gs.LiveRatios))
	if len(gs.LiveRatios) > 0 {
		r := slices.Clone(gs.LiveRatios)
		slices.Sort(r)
		s += fmt.Sprintf(": measured/model median %.3f, p10 %.3f, p90 %.3f, min %.3f, max %.3f (the timeline uses the model's)",
			metrics.Percentile(r, 0.5), metrics.Percentile(r, 0.1), metrics.Percentile(r, 0.9), r[0], r[len(r)-1])
	}
	if len(gs.LiveFirstRatios) > 0 {
		f, m := slices.Clone(gs.LiveFirstRatios), slices.Clone(gs.LiveRestRatios)
		slices.Sort(f)
		slices.Sort(m)
		s += fmt.Sprintf("; of that, the first layer's time/model median %.3f (p90 %.3f), the other layers' median layer/model median %.3f (p90 %.3f)",
			metrics.Percentile(f, 0.5), metrics.Percentile(f, 0.9), metrics.Percentile(m, 0.5), metrics.Percentile(m, 0.9))
	}
	return s + gs.backendNote()
}

// warmupNote is the GPU prefill note's part on warmUp ("" when none ran).
func (gs GPUComputeStats) warmupNote() string {
	if gs.Warmups == 0 {
		return ""
	}
	return fmt.Sprintf("; %d prefills next to a restore had GEMM shapes not run before and ran one layer of them alone first (%.1f ms of GPU time, outside the timeline), as an engine's warm-up loads its kernels before it serves",
		gs.Warmups, ms(gs.WarmupGPUTime))
}
