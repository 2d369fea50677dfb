package harness

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tutti-io/tutti/eval/metrics"
)

// The calibrated model's live checks (SetLiveEvery > 1) are kept per
// backend, with what tells the causes of a measured/model far from 1 apart:
//
//   - the check's GEMMs re-run alone right after it (nothing of the harness
//     in flight): alone/model far from 1 means the model misfits these
//     shapes; live/alone far above 1 means the live run lost time to what
//     ran next to it (the restore's GPU work) or to a late host enqueue;
//   - the host side of the live run's enqueue: its wall from Start to the
//     enqueue's return over the run's GPU time (≥ 1: launch-bound, the GPU
//     idled inside the layers' event intervals waiting for launches), the
//     enqueue thread's CPU over its cgo call's wall (≪ 1: it waited on a
//     lock or for a CPU) and Start to the goroutine running;
//   - how long the GPU had idled before the run (a GPU that idled long may
//     run a short burst at lower clocks than back-to-back calibration).

// LiveChecks are one backend's live checks (all its rounds together).
type LiveChecks struct {
	Backend string
	// Ratios: measured/model layer time of the checks that ran next to a
	// restore. AloneMeasured: of the checks measured alone instead (no hit,
	// or the restore brought back another block count than looked up), with
	// AloneMeasuredIdleMs the GPU's idle time before each.
	Ratios, AloneMeasured, AloneMeasuredIdleMs []float64
	// Of the checks next to a restore, with the alone re-run on: the re-run's
	// layer time over the model's (AloneRatios), the live one over the
	// re-run's (LiveAlone).
	AloneRatios, LiveAlone []float64
	// EnqueueGPU: host wall from Start to the enqueue's return over the live
	// run's GPU time (sum of its layer times). EnqueueCPU: the enqueue
	// thread's CPU time over its cgo call's wall.
	EnqueueGPU, EnqueueCPU []float64
	// StartLagMs: Start to the enqueue goroutine running. IdleMs: how long
	// the GPU had idled at Start, from the previous run's collection (a
	// lower bound: the GPU finished that run before it was collected).
	StartLagMs, IdleMs []float64
}

// SetBackend names the backend whose requests run from now on: the live
// checks are kept per name (runBackend calls it). Nil-safe.
func (g *GPUCompute) SetBackend(name string) {
	if g != nil {
		g.backend = name
	}
}

// SetAloneCheck turns the alone re-run of each live check next to a
// restore on (the default) or off; it costs one more prefill's GPU time
// per such check, outside the timeline. Nil-safe.
func (g *GPUCompute) SetAloneCheck(on bool) {
	if g != nil {
		g.noAlone = !on
	}
}

// liveChecks is the current backend's entry, made on first use.
func (g *GPUCompute) liveChecks() *LiveChecks {
	if g.checks == nil {
		g.checks = map[string]*LiveChecks{}
	}
	lc := g.checks[g.backend]
	if lc == nil {
		lc = &LiveChecks{Backend: g.backend}
		g.checks[g.backend] = lc
		g.order = append(g.order, g.backend)
	}
	return lc
}

// backendStats is the per-backend checks in first-run order, copied so the
// caller's Stats do not alias what later checks append to.
func (g *GPUCompute) backendStats() []LiveChecks {
	var out []LiveChecks
	for _, name := range g.order {
		lc := *g.checks[name]
		for _, p := range []*[]float64{&lc.Ratios, &lc.AloneMeasured, &lc.AloneMeasuredIdleMs, &lc.AloneRatios,
			&lc.LiveAlone, &lc.EnqueueGPU, &lc.EnqueueCPU, &lc.StartLagMs, &lc.IdleMs} {
			*p = slices.Clone(*p)
		}
		out = append(out, lc)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// check records a live check whose layer times are in g.times (r's when
// concurrent: it ran next to the restore), got its mean, want the model's,
// under the current backend; with the alone re-run on, it runs the same
// GEMMs again alone and leaves g.times as the live run left them.
func (g *GPUCompute) check(r *PrefillRun, concurrent bool, got, want time.Duration, newTokens, cachedTokens int) error {
	lc := g.liveChecks()
	ratio := float64(got) / float64(want)
	if !concurrent {
		lc.AloneMeasured = append(lc.AloneMeasured, ratio)
		lc.AloneMeasuredIdleMs = append(lc.AloneMeasuredIdleMs, ms(g.lastIdle))
		return nil
	}
	lc.Ratios = append(lc.Ratios, ratio)
	if gpu := sumTimes(g.times); gpu > 0 {
		lc.EnqueueGPU = append(lc.EnqueueGPU, float64(r.wall)/float64(gpu))
	}
	if r.call > 0 {
		lc.EnqueueCPU = append(lc.EnqueueCPU, float64(r.enqueueCPU)/float64(r.call))
	}
	lc.StartLagMs = append(lc.StartLagMs, ms(r.lag))
	lc.IdleMs = append(lc.IdleMs, ms(r.idle))
	if g.noAlone || len(g.times) == 0 {
		return nil
	}
	live := slices.Clone(g.times)
	defer func() { g.times = append(g.times[:0], live...) }() // measure overwrote them
	if err := g.measure(len(live), newTokens, cachedTokens); err != nil {
		return fmt.Errorf("re-running a live check alone: %w", err)
	}
	alone := sumTimes(g.times)
	g.stats.AloneRuns++
	g.stats.AloneGPUTime += alone
	if a := alone / time.Duration(len(g.times)); a > 0 {
		lc.AloneRatios = append(lc.AloneRatios, float64(a)/float64(want))
		lc.LiveAlone = append(lc.LiveAlone, float64(got)/float64(a))
	}
	return nil
}

// median is xs' median (NaN when empty; xs is not changed).
func median(xs []float64) float64 { return metrics.Percentile(xs, 0.5) }

// spread is "M (p10 A, p90 B)": xs' median and deciles.
func spread(xs []float64) string {
	return fmt.Sprintf("%.2f (p10 %.2f, p90 %.2f)", median(xs), metrics.Percentile(xs, 0.1), metrics.Percentile(xs, 0.9))
}

// backendNote is the GPU prefill note's per-backend part ("" without
// checks kept per backend).
func (gs GPUComputeStats) backendNote() string {
	var parts []string
	for _, lc := range gs.Backends {
		if p := lc.note(); p != "" {
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	alone := "the alone re-run was off"
	if !gs.NoAloneRerun {
		alone = fmt.Sprintf("alone: each check's GEMMs re-run right after it with nothing of the harness on the GPU, a diagnostic outside the timeline "+
			"(%d re-runs, %.2f s of GPU time, in no other figure; their wall is in the prefill phase)", gs.AloneRuns, gs.AloneGPUTime.Seconds())
	}
	return fmt.Sprintf("; live checks per backend (medians; %s; enqueue wall/GPU: Start to the host enqueue's return over the run's GPU time, ≥ 1 is launch-bound; "+
		"enqueue CPU/wall: the enqueue thread's CPU over its call's wall, ≪ 1 is waiting; GPU idle before: since the previous run's collection, at least): %s. "+
		"Reading: live/alone ≫ 1 is contention with the restore or a late enqueue (where the restore does no GPU work and enqueue wall/GPU < 1: "+
		"neither, the GPU's state after its idle gap, e.g. its clocks), alone/model ≫ 1 the model misfitting these shapes",
		alone, strings.Join(parts, " | "))
}

// note is one backend's part of backendNote ("" without checks).
func (lc LiveChecks) note() string {
	if len(lc.Ratios) == 0 && len(lc.AloneMeasured) == 0 {
		return ""
	}
	name := lc.Backend
	if name == "" {
		name = "(no backend named)"
	}
	var s []string
	if n := len(lc.Ratios); n > 0 {
		t := fmt.Sprintf("%d next to a restore: measured/model %s", n, spread(lc.Ratios))
		if len(lc.AloneRatios) > 0 {
			t += fmt.Sprintf(", alone/model %.2f, live/alone %.2f", median(lc.AloneRatios), median(lc.LiveAlone))
		}
		if len(lc.EnqueueGPU) > 0 {
			t += fmt.Sprintf(", enqueue wall/GPU %.2f", median(lc.EnqueueGPU))
		}
		if len(lc.EnqueueCPU) > 0 {
			t += fmt.Sprintf(", enqueue CPU/wall %.2f", median(lc.EnqueueCPU))
		}
		t += fmt.Sprintf(", start lag %.3f ms, GPU idle before %.0f ms", median(lc.StartLagMs), median(lc.IdleMs))
		s = append(s, t)
	}
	if n := len(lc.AloneMeasured); n > 0 {
		s = append(s, fmt.Sprintf("%d measured alone (no hit, or re-measured): measured/model %s, GPU idle before %.0f ms",
			n, spread(lc.AloneMeasured), median(lc.AloneMeasuredIdleMs)))
	}
	return name + ": " + strings.Join(s, "; ")
}
