package harness

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kernels/testkit"
)

// fakeGPU is a calibrated GPUCompute for llama3-8b whose measure runs no
// GPU: every layer of a run takes layer, and each run's shape is recorded.
func fakeGPU(t *testing.T, layer time.Duration) (*GPUCompute, *[][]testkit.GEMM) {
	t.Helper()
	p, err := model.Lookup("llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	d, err := dimsOf(p)
	if err != nil {
		t.Fatal(err)
	}
	var runs [][]testkit.GEMM
	g := &GPUCompute{prof: p, dims: d, tiles: DefaultGEMMTiles, every: 8}
	g.runHook = func(layers int, gemms []testkit.GEMM, dst []time.Duration) ([]time.Duration, error) {
		runs = append(runs, slices.Clone(gemms))
		for range layers {
			dst = append(dst, layer)
		}
		return dst, nil
	}
	return g, &runs
}

// liveRun is a collected PrefillRun as Start and collect leave one.
func liveRun(newTokens, cached int, wall, call, cpu time.Duration) *PrefillRun {
	r := &PrefillRun{newTokens: newTokens, cachedTokens: cached, done: make(chan struct{}), counted: true,
		wall: wall, call: call, enqueueCPU: cpu, lag: 20 * time.Microsecond, idle: 800 * time.Millisecond}
	close(r.done)
	return r
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9*math.Max(1, math.Abs(b)) }

// The checks are kept per backend in first-run order (a backend's later
// rounds join its entry); a check next to a restore is re-run alone with
// the same GEMMs, its ratios recorded and g.times left as the live run
// left them; one measured alone is not re-run; Stats does not alias.
func TestLiveChecksPerBackend(t *testing.T) {
	const want = 100 * time.Microsecond
	g, runs := fakeGPU(t, 110*time.Microsecond) // alone: 1.1 × the model
	liveTimes := []time.Duration{800 * time.Microsecond, 700 * time.Microsecond, 700 * time.Microsecond, 600 * time.Microsecond}
	got := 700 * time.Microsecond // their mean

	g.SetBackend("tutti-gpu")
	g.times = slices.Clone(liveTimes)
	if err := g.check(liveRun(200, 6000, 3*time.Millisecond, 2*time.Millisecond, time.Millisecond), true, got, want, 200, 6000); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(g.times, liveTimes) {
		t.Errorf("g.times after the alone re-run %v, want the live run's %v", g.times, liveTimes)
	}
	wantGEMMs, _ := PrefillGEMMs(g.prof, 200, 6000, g.tiles)
	if len(*runs) != 1 || !slices.Equal((*runs)[0], wantGEMMs) {
		t.Errorf("alone re-runs %v, want one of %v", *runs, wantGEMMs)
	}

	g.SetBackend("recompute")
	g.lastIdle = 5 * time.Millisecond
	g.times = []time.Duration{want, want}
	if err := g.check(nil, false, 120*time.Microsecond, want, 4000, 0); err != nil {
		t.Fatal(err)
	}
	g.SetBackend("tutti-gpu") // a second round
	g.times = slices.Clone(liveTimes)
	if err := g.check(liveRun(200, 6000, time.Millisecond, time.Millisecond, time.Millisecond), true, got, want, 200, 6000); err != nil {
		t.Fatal(err)
	}

	st := g.Stats()
	if len(st.Backends) != 2 || st.Backends[0].Backend != "tutti-gpu" || st.Backends[1].Backend != "recompute" {
		t.Fatalf("backends %+v", st.Backends)
	}
	if st.AloneRuns != 2 || st.AloneGPUTime != 2*4*110*time.Microsecond {
		t.Errorf("alone re-runs %d, %v of GPU time", st.AloneRuns, st.AloneGPUTime)
	}
	tg, rc := st.Backends[0], st.Backends[1]
	for _, c := range []struct {
		what      string
		got, want []float64
	}{
		{"tutti-gpu measured/model", tg.Ratios, []float64{7, 7}},
		{"tutti-gpu alone/model", tg.AloneRatios, []float64{1.1, 1.1}},
		{"tutti-gpu live/alone", tg.LiveAlone, []float64{700.0 / 110, 700.0 / 110}},
		{"tutti-gpu enqueue wall/GPU", tg.EnqueueGPU, []float64{3.0 / 2.8, 1.0 / 2.8}},
		{"tutti-gpu enqueue CPU/wall", tg.EnqueueCPU, []float64{0.5, 1}},
		{"tutti-gpu start lag ms", tg.StartLagMs, []float64{0.02, 0.02}},
		{"tutti-gpu idle ms", tg.IdleMs, []float64{800, 800}},
		{"tutti-gpu measured alone", tg.AloneMeasured, nil},
		{"recompute measured alone", rc.AloneMeasured, []float64{1.2}},
		{"recompute idle ms", rc.AloneMeasuredIdleMs, []float64{5}},
		{"recompute next to a restore", rc.Ratios, nil},
		{"recompute alone/model", rc.AloneRatios, nil},
	} {
		if len(c.got) != len(c.want) || !slices.EqualFunc(c.got, c.want, near) {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	st.Backends[0].Ratios[0] = -1
	if g.Stats().Backends[0].Ratios[0] != 7 {
		t.Error("Stats aliases the checks it returned")
	}
}

// With the alone re-run off nothing more runs and the note says so.
func TestLiveChecksAloneOff(t *testing.T) {
	g, runs := fakeGPU(t, time.Microsecond)
	g.SetAloneCheck(false)
	g.SetBackend("dram")
	g.times = []time.Duration{time.Millisecond}
	if err := g.check(liveRun(100, 4000, time.Millisecond, time.Millisecond, time.Millisecond), true, time.Millisecond, 100*time.Microsecond, 100, 4000); err != nil {
		t.Fatal(err)
	}
	st := g.Stats()
	if len(*runs) != 0 || st.AloneRuns != 0 || len(st.Backends[0].AloneRatios) != 0 || !st.NoAloneRerun {
		t.Errorf("runs %d, stats %+v", len(*runs), st)
	}
	if n := st.liveNote(8); !strings.Contains(n, "the alone re-run was off") || strings.Contains(st.Backends[0].note(), "alone/model") {
		t.Errorf("note %q", n)
	}
}

// Layer on a live request without a restore measures it alone (no re-run)
// and returns the model's time; a request not live only counts.
func TestLayerLiveWithoutRestore(t *testing.T) {
	g, runs := fakeGPU(t, 300*time.Microsecond)
	sim, err := NewCompute(g.prof, DefaultGPUFLOPs, DefaultLayerFixedNs)
	if err != nil {
		t.Fatal(err)
	}
	g.SetBackend("recompute")
	d, err := g.Layer(true, nil, sim, 4000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := sim.Layer(4000, 0); d != want {
		t.Errorf("layer %v, want the model's %v", d, want)
	}
	if _, err := g.Layer(false, nil, sim, 4000, 0); err != nil {
		t.Fatal(err)
	}
	st := g.Stats()
	if len(*runs) != 1 || st.Requests != 1 || st.Calibrated != 1 || st.AloneRuns != 0 || len(st.LiveRatios) != 1 {
		t.Fatalf("runs %d, stats %+v", len(*runs), st)
	}
	if b := st.Backends; len(b) != 1 || len(b[0].AloneMeasured) != 1 || len(b[0].Ratios) != 0 ||
		!near(b[0].AloneMeasured[0], float64(300*time.Microsecond)/float64(sim.Layer(4000, 0))) {
		t.Errorf("backends %+v", b)
	}
}

// The note gives, per backend and in order, the checks next to a restore
// with their diagnostics and those measured alone; nothing without checks.
func TestLiveNote(t *testing.T) {
	deciles := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10} // p10 1, median 5, p90 9
	gpu := LiveChecks{Backend: "tutti-gpu", Ratios: deciles, AloneRatios: []float64{1.05}, LiveAlone: []float64{6.5},
		EnqueueGPU: []float64{0.1}, EnqueueCPU: []float64{0.95}, StartLagMs: []float64{0.02}, IdleMs: []float64{850}}
	rec := LiveChecks{Backend: "recompute", AloneMeasured: []float64{1.19, 1.19}, AloneMeasuredIdleMs: []float64{3, 3}}
	for _, tc := range []struct {
		name     string
		st       GPUComputeStats
		every    int
		has, not []string
		notIn    string // the backend whose own part the not strings are checked in ("": the whole note)
	}{
		{name: "every request measured", st: GPUComputeStats{Backends: []LiveChecks{gpu}}, every: 1, not: []string{"live checks"}},
		{name: "no checks", st: GPUComputeStats{Calibrated: 5, Backends: []LiveChecks{{Backend: "dram"}}}, every: 8,
			has: []string{"5 prefills' layer times"}, not: []string{"live checks per backend", "dram"}},
		{
			name: "two backends", every: 8,
			st: GPUComputeStats{LiveRatios: append(slices.Clone(deciles), 1.19, 1.19), Backends: []LiveChecks{gpu, rec},
				AloneRuns: 10, AloneGPUTime: 1500 * time.Millisecond},
			has: []string{
				"(12 checks)",
				"live checks per backend",
				"a diagnostic outside the timeline (10 re-runs, 1.50 s of GPU time",
				"tutti-gpu: 10 next to a restore: measured/model 5.00 (p10 1.00, p90 9.00), alone/model 1.05, live/alone 6.50, " +
					"enqueue wall/GPU 0.10, enqueue CPU/wall 0.95, start lag 0.020 ms, GPU idle before 850 ms | " +
					"recompute: 2 measured alone (no hit, or re-measured): measured/model 1.19 (p10 1.19, p90 1.19), GPU idle before 3 ms",
				"live/alone ≫ 1 is contention with the restore or a late enqueue",
				"≥ 1 is launch-bound",
			},
			not: []string{"was off", "recompute: 0", "tutti-gpu: 10 next to a restore: measured/model 5.00 (p10 1.00, p90 9.00); "},
		},
		{
			name: "both kinds in one backend", every: 4,
			st: GPUComputeStats{Backends: []LiveChecks{{Backend: "vllm-fs", Ratios: []float64{2}, StartLagMs: []float64{1}, IdleMs: []float64{9},
				AloneMeasured: []float64{1}, AloneMeasuredIdleMs: []float64{4}}}},
			has: []string{"vllm-fs: 1 next to a restore: measured/model 2.00 (p10 2.00, p90 2.00), start lag 1.000 ms, GPU idle before 9 ms; " +
				"1 measured alone (no hit, or re-measured): measured/model 1.00"},
			not: []string{"alone/model", "enqueue wall", "enqueue CPU"}, notIn: "vllm-fs",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.st.liveNote(tc.every)
			for _, s := range tc.has {
				if !strings.Contains(n, s) {
					t.Errorf("note lacks %q:\n%s", s, n)
				}
			}
			in := n
			for _, b := range tc.st.Backends {
				if b.Backend == tc.notIn {
					in = b.note()
				}
			}
			for _, s := range tc.not {
				if strings.Contains(in, s) {
					t.Errorf("note has %q:\n%s", s, n)
				}
			}
		})
	}
}

// On the GPU machine: a calibrated live check next to a (pretend) restore
// is kept under its backend with the alone re-run and the enqueue timings.
func TestGPULiveCheck(t *testing.T) {
	if !gpuComputeAvailable(t) {
		t.Skip("GPU test skipped: no GPU or kernels library")
	}
	c, g := calibratedGPU(t, "llama3-8b")
	defer g.Close()
	g.SetLiveEvery(8, &c)
	g.SetBackend("test")
	r := g.Start(6200, 6000)
	time.Sleep(20 * time.Millisecond) // the restore's place
	if _, err := g.Layer(true, r, c, 200, 6000); err != nil {
		t.Fatal(err)
	}
	st := g.Stats()
	if len(st.Backends) != 1 {
		t.Fatalf("stats %+v", st)
	}
	b := st.Backends[0]
	if len(b.Ratios) != 1 || len(b.AloneRatios) != 1 || len(b.EnqueueGPU) != 1 || b.EnqueueGPU[0] <= 0 || st.AloneRuns != 1 {
		t.Errorf("checks %+v", b)
	}
	t.Logf("%s", st.liveNote(8))
}

// A prefill next to a restore whose GEMM shapes have not run yet runs one
// layer of the new shapes alone first (an engine's warm-up: a kernel's
// first launch can wait for the whole context under lazy loading); shapes
// already run, by a warm-up or by a measure, are not warmed again.
func TestWarmUpNewShapesBeforeLive(t *testing.T) {
	g, runs := fakeGPU(t, 100*time.Microsecond)
	layers := g.prof.Shape.Layers
	startCollect := func(in, cached int) {
		t.Helper()
		r := g.Start(in, cached)
		if err := g.collect(r); err != nil {
			t.Fatal(err)
		}
	}
	startCollect(300, 16)
	if len(*runs) != 2 {
		t.Fatalf("%d runs for the first prefill, want a warm-up then the live run", len(*runs))
	}
	live, _ := PrefillGEMMs(g.prof, 284, 16, g.tiles)
	for _, gm := range (*runs)[0] {
		if gm.Count != 1 {
			t.Errorf("warm-up GEMM %+v: want one launch of each shape", gm)
		}
	}
	if !slices.Equal((*runs)[1], live) {
		t.Errorf("live run %v, want %v", (*runs)[1], live)
	}
	if s := g.Stats(); s.Warmups != 1 || s.WarmupGPUTime != 100*time.Microsecond {
		t.Errorf("warm-ups %d, %v of GPU: want 1 of one layer (100µs)", s.Warmups, s.WarmupGPUTime)
	}
	startCollect(300, 16) // the same shapes: no warm-up
	if len(*runs) != 3 {
		t.Fatalf("%d runs after a second prefill of the same shapes, want 3", len(*runs))
	}
	if err := g.measure(layers, 1000, 0); err != nil { // a measure warms its shapes too
		t.Fatal(err)
	}
	startCollect(1000, 0)
	if len(*runs) != 5 {
		t.Fatalf("%d runs after a measured shape ran live, want 5 (no warm-up)", len(*runs))
	}
	if n := g.Stats().warmupNote(); !strings.Contains(n, "1 prefills next to a restore had GEMM shapes not run before") {
		t.Errorf("note %q does not report the warm-up", n)
	}
}
