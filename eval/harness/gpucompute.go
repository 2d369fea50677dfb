package harness

import (
	"errors"
	"fmt"
	"math"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/sched"
	"golang.org/x/sys/unix"
)

// Where the prefill compute of a replay comes from (--compute).
const (
	ComputeAuto = "auto" // the GPU when the kernels library and a GPU are here, else simulated (said in the label)
	ComputeGPU  = "gpu"  // the GPU, or an error
	ComputeSim  = "sim"  // the simulated model (Compute from the profile's FLOPs)
)

// ComputeModes lists the --compute values.
var ComputeModes = []string{ComputeAuto, ComputeGPU, ComputeSim}

// GEMMTiles bounds one GEMM of the GPU prefill, so the buffers are allocated
// once whatever the request: a longer request runs more GEMMs, not bigger ones.
type GEMMTiles struct {
	Rows int // tokens per GEMM (a chunked prefill's chunk)
	Ctx  int // attended tokens per attention GEMM
}

// DefaultGEMMTiles: 8192-token chunks (vLLM's max_num_batched_tokens scale),
// 16384 attended tokens per attention GEMM. Few GEMMs per layer keep the
// host's launches (a few µs of CPU each, counted in Stats) far below the
// GPU time and the stream's launch queue.
var DefaultGEMMTiles = GEMMTiles{Rows: 8192, Ctx: 16384}

// prefillDims are the GEMM dimensions of one layer of profile p:
//
//   - linear: [m × K]·[K × N] with K the hidden size and N = (linear FLOPs per
//     token per layer)/(2K), rounded to the nearest multiple of 8 (an
//     engine's weight dimensions are; cuBLAS's m off one runs several times
//     slower): the layer's weights as one matrix (2·K·N = 2 × the layer's
//     active parameters, within 4/N);
//   - attention: [m × D]·[D × ctx] with D = AttnFLOPsPerContextToken/(2·layers)
//     = query heads × (QK dim + V dim): one product per (new token, attended
//     token) pair, as QKᵀ and A·V together cost.
type prefillDims struct{ K, LinearN, AttnD int }

func dimsOf(p model.Profile) (prefillDims, error) {
	layers := float64(p.Shape.Layers)
	d := prefillDims{K: p.HiddenSize}
	if p.HiddenSize < 1 || layers < 1 {
		return d, fmt.Errorf("prefill GEMMs of %s: hidden size %d, %v layers", p.Name, p.HiddenSize, layers)
	}
	d.LinearN = 8 * int(math.Round(p.LinearFLOPsPerToken()/layers/(2*float64(p.HiddenSize))/8))
	attn := p.AttnFLOPsPerContextToken() / layers / 2
	d.AttnD = int(math.Round(attn))
	if d.LinearN < 1 || d.AttnD < 1 || float64(d.AttnD) != attn {
		return d, fmt.Errorf("prefill GEMMs of %s: linear N %d, attention dim %v", p.Name, d.LinearN, attn)
	}
	return d, nil
}

// PrefillGEMMs returns the GEMMs of one layer that prefills newTokens tokens
// after cachedTokens tokens of context, for profile p, at most t.Rows tokens
// and t.Ctx attended tokens per GEMM. Their FLOPs are the profile's
// PrefillFLOPsPerLayer(cachedTokens, newTokens): the attention part within
// 5 keys per row of each chunk (chunk j of m rows at positions s..s+m−1 attends
// pairs = m·s + m(m+1)/2 keys: an m × pairs/m GEMM in Ctx tiles, the last
// tile's key count rounded to a multiple of 8), the linear part within the
// rounding of N (< 1e-4 for every profile). Each is a tokenGEMM (the
// tokens in cuBLAS's n). Identical consecutive shapes are merged (Count).
func PrefillGEMMs(p model.Profile, newTokens, cachedTokens int, t GEMMTiles) ([]testkit.GEMM, error) {
	d, err := dimsOf(p)
	if err != nil {
		return nil, err
	}
	if newTokens < 1 || cachedTokens < 0 || t.Rows < 1 || t.Ctx < 1 {
		return nil, fmt.Errorf("prefill GEMMs: %d new tokens after %d, tiles %+v", newTokens, cachedTokens, t)
	}
	var out []testkit.GEMM
	add := func(g testkit.GEMM) {
		if g.M < 1 || g.N < 1 || g.Count < 1 {
			return
		}
		if n := len(out); n > 0 && out[n-1].M == g.M && out[n-1].N == g.N && out[n-1].K == g.K {
			out[n-1].Count += g.Count
			return
		}
		out = append(out, g)
	}
	for r0 := 0; r0 < newTokens; r0 += t.Rows {
		m := min(t.Rows, newTokens-r0)
		add(tokenGEMM(m, d.LinearN, d.K, 1))
		s := int64(cachedTokens + r0)
		pairs := int64(m)*s + int64(m)*int64(m+1)/2
		// Each token attends ⌈pairs/m⌉ or ⌊pairs/m⌋ keys on average: the
		// tail tile's key count goes to the nearest multiple of 8, as cuBLAS
		// runs an m off a multiple of 8 several times slower and an
		// engine's attention kernel has no such cliff.
		q := (pairs + int64(m)/2) / int64(m)
		add(tokenGEMM(m, t.Ctx, d.AttnD, int(q/int64(t.Ctx))))
		add(tokenGEMM(m, int(min((q%int64(t.Ctx)+4)&^7, int64(t.Ctx))), d.AttnD, 1))
	}
	return out, nil
}

// tokenGEMM is the product of a [tokens × k] activation and a [k × n]
// operand as a row-major engine (PyTorch) has cuBLAS run it: column-major
// C[n × tokens] = B[n × k]·A[k × tokens], the token count in cuBLAS's n.
// With the tokens in cuBLAS's m instead, a count that is not a multiple of
// 8 runs 5-8× slower (BenchmarkPrefillShapes), which no engine pays.
func tokenGEMM(tokens, n, k, count int) testkit.GEMM {
	return testkit.GEMM{M: n, N: tokens, K: k, Count: count}
}

// prefillBuffers returns the buffer elements that hold every GEMM
// PrefillGEMMs can emit for p under t (the largest linear and attention
// shapes: a full chunk of rows).
func prefillBuffers(d prefillDims, t GEMMTiles) (a, b, c int64) {
	return testkit.PrefillBuffers([]testkit.GEMM{tokenGEMM(t.Rows, d.LinearN, d.K, 1), tokenGEMM(t.Rows, t.Ctx, d.AttnD, 1)})
}

// GPUCompute runs each request's prefill GEMMs on the GPU (testkit.Prefill)
// while the backend restores, so GPU compute and the restore contend for
// real, and measures the layer times the timeline uses. One per replay; used
// by the replay's goroutine (Start hands the enqueue to a goroutine of its
// own and Finish collects it).
type GPUCompute struct {
	prof   model.Profile
	dims   prefillDims
	tiles  GEMMTiles
	pf     *testkit.Prefill
	device string
	times  []time.Duration

	pending *PrefillRun
	stats   GPUComputeStats

	// fit is the model Calibrate fitted (from fitPoints points); every > 1
	// makes it the source of every request's layer time, with every
	// every-th request run live as its check (gpulive.go).
	fit       sched.ComputeModel
	fitPoints int
	every     int

	// The live checks' diagnostics (gpucheck.go): the backend whose
	// requests run now (SetBackend), whether a check's GEMMs are re-run
	// alone after it (SetAloneCheck; on by default), the per-backend
	// figures, and when the GPU last finished a run (host wall, at the
	// Wait's return) and how long it had idled before the latest measure.
	backend  string
	noAlone  bool
	checks   map[string]*LiveChecks
	order    []string
	lastDone time.Time
	lastIdle time.Duration

	// warmed holds the GEMM shapes run at least once in this process
	// (warmUp).
	warmed map[testkit.GEMM]bool

	// runHook, when set (tests without a GPU), runs the GEMMs of measure
	// and of a Start/collect pair in place of pf.Run (pf.Start then pf.Wait
	// for the pair: the hook runs at collect), under its contract.
	runHook func(layers int, gemms []testkit.GEMM, dst []time.Duration) ([]time.Duration, error)
}

// GPUComputeStats counts what the GPU ran.
type GPUComputeStats struct {
	Requests int           // prefills measured
	Reruns   int           // measured again after the restore: it restored another number of blocks than looked up
	GPUTime  time.Duration // sum of measured layer times
	// EnqueueCPU is the CPU time of the goroutine that launched the GEMMs
	// next to the restores (the process CPU a restore is charged with
	// includes the part that overlapped it).
	EnqueueCPU time.Duration
	Launches   int64 // GEMM launches next to restores
	// Calibrated (SetLiveEvery > 1): prefills whose layer time is the
	// fitted model's; LiveRatios: measured/model of the live ones.
	Calibrated int
	LiveRatios []float64
	// LiveFirstRatios, LiveRestRatios: of each live check with more than one
	// layer, its first layer's time and its other layers' median, over the
	// model's layer time.
	LiveFirstRatios, LiveRestRatios []float64
	// Backends: the live checks per backend (SetBackend), in the order the
	// backends first ran. AloneRuns and AloneGPUTime: the diagnostic
	// re-runs of the checks' GEMMs alone (outside the timeline, and not in
	// Requests or GPUTime).
	Backends     []LiveChecks
	AloneRuns    int
	AloneGPUTime time.Duration
	NoAloneRerun bool // SetAloneCheck(false)
	// Warmups: prefills whose GEMM shapes were new, run once alone (one
	// layer) before their run next to a restore (warmUp); WarmupGPUTime is
	// their GPU time, outside the timeline like AloneGPUTime.
	Warmups       int
	WarmupGPUTime time.Duration
}

// PrefillRun is one request's prefill in flight.
type PrefillRun struct {
	newTokens, cachedTokens int
	done                    chan struct{} // closed when the enqueue returned
	err                     error
	enqueueCPU              time.Duration
	launches                int64
	counted                 bool           // enqueueCPU and launches are in the stats
	hooked                  []testkit.GEMM // what runHook runs at collect

	// Host timings of the enqueue (live checks' diagnostics), each set
	// before done closes: lag is Start to the goroutine running, wall
	// Start to the enqueue's return, call the cgo call alone; idle is how
	// long the GPU had idled (since the previous Wait's return) at Start.
	lag, wall, call, idle time.Duration
}

// NewGPUCompute allocates the GPU prefill for profile p on device 0 (buffers
// for the largest GEMM under tiles). Errors wrap kernels.ErrNotLoaded or
// kernels.ErrNoGPU where this machine cannot run it.
func NewGPUCompute(p model.Profile, tiles GEMMTiles) (*GPUCompute, error) {
	d, err := dimsOf(p)
	if err != nil {
		return nil, err
	}
	if tiles.Rows < 1 || tiles.Ctx < 1 {
		return nil, fmt.Errorf("GPU prefill: tiles %+v", tiles)
	}
	a, b, c := prefillBuffers(d, tiles)
	pf, err := testkit.NewPrefill(testkit.PrefillConfig{Device: 0, MaxLayers: p.Shape.Layers, AElems: a, BElems: b, CElems: c})
	if err != nil {
		return nil, fmt.Errorf("GPU prefill for %s (%d MiB of bf16 buffers): %w", p.Name, (a+b+c)*2>>20, err)
	}
	name, sms, err := kernels.DeviceName(0)
	if err != nil {
		pf.Close()
		return nil, err
	}
	return &GPUCompute{prof: p, dims: d, tiles: tiles, pf: pf, device: fmt.Sprintf("%s, %d SMs", name, sms)}, nil
}

// Close frees the GPU buffers (after collecting a run still in flight).
func (g *GPUCompute) Close() error {
	if g == nil {
		return nil
	}
	if g.pending != nil {
		g.collect(g.pending)
	}
	return g.pf.Close()
}

// Stats returns what the GPU ran so far.
func (g *GPUCompute) Stats() GPUComputeStats {
	if g == nil {
		return GPUComputeStats{}
	}
	s := g.stats
	s.Backends, s.NoAloneRerun = g.backendStats(), g.noAlone
	return s
}

// Start launches the prefill of inputTokens−cachedTokens tokens after
// cachedTokens (the blocks the backend is about to restore) on the GPU and
// returns at once: the GEMMs are enqueued by a goroutine while the caller
// restores. A nil GPUCompute (simulated compute) returns nil. Every Start is
// followed by Finish.
func (g *GPUCompute) Start(inputTokens, cachedTokens int) *PrefillRun {
	if g == nil {
		return nil
	}
	if g.pending != nil { // an earlier request failed between Start and Finish
		g.collect(g.pending)
	}
	r := &PrefillRun{newTokens: inputTokens - cachedTokens, cachedTokens: cachedTokens, done: make(chan struct{})}
	if r.newTokens <= 0 {
		close(r.done)
		return r
	}
	gemms, err := PrefillGEMMs(g.prof, r.newTokens, cachedTokens, g.tiles)
	if err != nil {
		r.err = err
		close(r.done)
		return r
	}
	for _, gm := range gemms {
		r.launches += int64(gm.Count) * int64(g.prof.Shape.Layers)
	}
	if err := g.warmUp(gemms); err != nil {
		r.err = err
		close(r.done)
		return r
	}
	g.pending = r
	t0 := time.Now()
	if !g.lastDone.IsZero() {
		r.idle = t0.Sub(g.lastDone)
	}
	go func() {
		r.lag = time.Since(t0)
		// One OS thread for the whole enqueue, so its CPU time is measurable.
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		c0, w0 := threadCPU(), time.Now()
		if g.runHook != nil {
			r.hooked = gemms
		} else {
			r.err = g.pf.Start(g.prof.Shape.Layers, gemms)
		}
		r.enqueueCPU = threadCPU() - c0
		r.call, r.wall = time.Since(w0), time.Since(t0)
		close(r.done)
	}()
	return r
}

// warmUp runs one layer of gemms alone, and waits, when one of their shapes
// has not run in this process yet. A kernel's first launch loads it, and
// under CUDA's lazy loading that load can wait for the whole context: a
// prefill whose GEMMs are new would then wait for the restore running
// beside it (a GPU restore's I/O kernel runs until its reads are in) and
// measure that instead of the contention. An engine loads its kernels in
// its warm-up before it serves; this is that warm-up, shape by shape.
func (g *GPUCompute) warmUp(gemms []testkit.GEMM) error {
	var fresh []testkit.GEMM
	for _, gm := range gemms {
		if k := shapeOf(gm); !g.warmed[k] {
			fresh = append(fresh, k)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	ts, err := g.runAlone(1, fresh, nil)
	if err != nil {
		return fmt.Errorf("warming up %d new GEMM shapes: %w", len(fresh), err)
	}
	g.stats.Warmups++
	g.stats.WarmupGPUTime += sumTimes(ts)
	return nil
}

// shapeOf is gm's shape: one launch of it (what loads its kernel).
func shapeOf(gm testkit.GEMM) testkit.GEMM {
	gm.Count = 1
	return gm
}

// markWarm records the shapes of gemms as run (warmUp).
func (g *GPUCompute) markWarm(gemms []testkit.GEMM) {
	if g.warmed == nil {
		g.warmed = make(map[testkit.GEMM]bool)
	}
	for _, gm := range gemms {
		g.warmed[shapeOf(gm)] = true
	}
}

// threadCPU is the calling thread's CPU time (user + system).
func threadCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_THREAD, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// collect waits for r's enqueue and then for the GPU; the layer times land
// in g.times.
func (g *GPUCompute) collect(r *PrefillRun) error {
	<-r.done
	if g.pending == r {
		g.pending = nil
	}
	if !r.counted {
		g.stats.EnqueueCPU += r.enqueueCPU
		g.stats.Launches += r.launches
		r.counted = true
	}
	g.times = g.times[:0]
	if r.err != nil || r.newTokens <= 0 {
		return r.err
	}
	var err error
	if g.runHook != nil {
		g.times, err = g.runHook(g.prof.Shape.Layers, r.hooked, g.times)
	} else {
		g.times, err = g.pf.Wait(g.times)
	}
	g.lastDone = time.Now()
	return err
}

// Finish returns the per-layer compute time of a request that computes
// newTokens tokens after cachedTokens. Without a GPU (nil g) it is the
// simulated model sim's. With one, it is the mean of the layer times
// measured on the GPU (every layer does the same work): those of r, which
// ran next to the restore; or, when there was no restore (r nil), of a run
// made now; or, when the restore brought back another number of blocks than
// Start assumed, of a run made now with the right count, without the
// restore next to it (counted in Stats().Reruns).
func (g *GPUCompute) Finish(r *PrefillRun, sim Compute, newTokens, cachedTokens int) (time.Duration, error) {
	if g == nil {
		return sim.Layer(newTokens, cachedTokens), nil
	}
	d, _, err := g.finish(r, newTokens, cachedTokens)
	return d, err
}

// finish is Finish with a GPU; concurrent says the layer times in g.times
// are r's, run next to the restore (false: measured now, alone).
func (g *GPUCompute) finish(r *PrefillRun, newTokens, cachedTokens int) (layer time.Duration, concurrent bool, err error) {
	if r != nil {
		if err := g.collect(r); err != nil {
			return 0, false, fmt.Errorf("GPU prefill of %d tokens after %d: %w", r.newTokens, r.cachedTokens, err)
		}
	}
	if newTokens <= 0 {
		return 0, false, nil
	}
	concurrent = r != nil && r.newTokens == newTokens && r.cachedTokens == cachedTokens
	if !concurrent {
		if r != nil {
			g.stats.Reruns++
		}
		if err := g.measure(g.prof.Shape.Layers, newTokens, cachedTokens); err != nil {
			return 0, false, err
		}
	}
	sum := sumTimes(g.times)
	g.stats.Requests++
	g.stats.GPUTime += sum
	return sum / time.Duration(len(g.times)), concurrent, nil
}

// sumTimes is the sum of ts.
func sumTimes(ts []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ts {
		sum += d
	}
	return sum
}

// measure runs layers layers of the prefill of newTokens after cachedTokens
// and waits; the layer times land in g.times.
func (g *GPUCompute) measure(layers, newTokens, cachedTokens int) error {
	if g.pending != nil {
		g.collect(g.pending)
	}
	gemms, err := PrefillGEMMs(g.prof, newTokens, cachedTokens, g.tiles)
	if err != nil {
		return err
	}
	g.lastIdle = 0
	if !g.lastDone.IsZero() {
		g.lastIdle = time.Since(g.lastDone)
	}
	g.times, err = g.runAlone(layers, gemms, g.times[:0])
	if err != nil {
		return fmt.Errorf("GPU prefill of %d tokens after %d: %w", newTokens, cachedTokens, err)
	}
	return nil
}

// runAlone runs layers layers of gemms and waits (runHook's in tests),
// appending the layer times to dst; the shapes count as warm after it.
func (g *GPUCompute) runAlone(layers int, gemms []testkit.GEMM, dst []time.Duration) ([]time.Duration, error) {
	var err error
	if g.runHook != nil {
		dst, err = g.runHook(layers, gemms, dst)
	} else {
		dst, err = g.pf.Run(layers, gemms, dst)
	}
	g.lastDone = time.Now()
	if err == nil {
		g.markWarm(gemms)
	}
	return dst, err
}

// calibrationTokens and calibrationStarts span the requests of a replay: the
// fit separates fixed, per-token and per-pair costs.
var (
	calibrationTokens = []int{64, 512, 2048, 8192}
	calibrationStarts = []int{0, 8192, 32768}
)

// Calibrate measures layer times on the GPU, alone, for a grid of (tokens,
// start position) and fits the scheduler's compute model to them
// (sched.FitCompute): the model tutti's planner weighs loading against
// recomputing with, and the SLO's reference. Each point is the median of 4
// layers after a 1-layer warm-up of the same shape (cuBLAS loads and picks
// its kernels on first use).
func (g *GPUCompute) Calibrate() (sched.ComputeModel, []sched.LayerPoint, error) {
	layers := min(4, g.prof.Shape.Layers)
	var pts []sched.LayerPoint
	for _, s := range calibrationStarts {
		for _, n := range calibrationTokens {
			if err := g.measure(1, n, s); err != nil {
				return sched.ComputeModel{}, nil, err
			}
			if err := g.measure(layers, n, s); err != nil {
				return sched.ComputeModel{}, nil, err
			}
			ts := slices.Clone(g.times)
			slices.Sort(ts)
			pts = append(pts, sched.LayerPoint{Tokens: n, StartPos: s, Ns: float64(ts[len(ts)/2])})
		}
	}
	m, err := sched.FitCompute(pts)
	if err != nil {
		return m, pts, fmt.Errorf("fitting the measured layer times: %w", err)
	}
	return m, pts, nil
}

// fallbackReason says briefly why the GPU prefill cannot run here.
func fallbackReason(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "lacks tk_prefill"):
		return "the kernels library lacks the prefill entry points (built before them: rebuild it with make -C kernels)"
	case errors.Is(err, kernels.ErrNoGPU):
		return "no GPU"
	case errors.Is(err, kernels.ErrNotLoaded) && strings.Contains(msg, "tried ["):
		return "no kernels library (libtutti_kernels.so; set TUTTI_KERNELS_LIB)"
	}
	if len(msg) > 240 {
		msg = msg[:240] + "…"
	}
	return msg
}

// SetupCompute resolves --compute for profile p. sim is the simulated model
// (NewCompute). It returns the Compute of the replay (its label goes into the
// report and every JSON row) and, when the GPU runs the prefill, the
// GPUCompute for Config.GPU (the caller closes it). ComputeAuto falls back to
// sim where there is no library or no GPU and says so in the label; other
// failures, and any failure under ComputeGPU, are errors.
func SetupCompute(mode string, p model.Profile, sim Compute) (Compute, *GPUCompute, error) {
	switch mode {
	case ComputeSim:
		return sim, nil, nil
	case ComputeAuto, ComputeGPU:
	default:
		return sim, nil, fmt.Errorf("--compute %q: want one of %v", mode, ComputeModes)
	}
	g, err := NewGPUCompute(p, DefaultGEMMTiles)
	if err != nil {
		if mode == ComputeAuto && (errors.Is(err, kernels.ErrNotLoaded) || errors.Is(err, kernels.ErrNoGPU)) {
			sim.Label += "; --compute auto fell back to this model: " + fallbackReason(err)
			return sim, nil, nil
		}
		return sim, nil, fmt.Errorf("--compute %s: %w", mode, err)
	}
	m, pts, err := g.Calibrate()
	if err != nil {
		g.Close()
		return sim, nil, fmt.Errorf("--compute %s: calibrating on the GPU: %w", mode, err)
	}
	g.fit, g.fitPoints = m, len(pts)
	return Compute{model: m, Label: g.label()}, g, nil
}

// label is the replay's compute label: what runs on the GPU, and where a
// request's layer time comes from (every request's measured prefill, or
// the fitted model with a live check on a subset: SetLiveEvery).
func (g *GPUCompute) label() string {
	p, m := g.prof, g.fit
	source := "run for each request's tokens not restored, concurrently with its restore; a request's layer time is the mean of its measured layers"
	if g.every > 1 {
		source = fmt.Sprintf("calibrated: every request's layer time is the fitted model's (below); every %d-th request (and none else) also runs its GEMMs on the GPU "+
			"next to its restore, as a check of the model (the GPU prefill note gives measured/model)", g.every)
	}
	return fmt.Sprintf("measured on GPU (%s): cuBLAS bf16 GEMMs sized from %s's FLOPs, per layer "+
		"[m×%d]·[%d×%d] (weights) and [m×%d]·[%d×ctx] (attention), the m tokens in cuBLAS's n as a row-major engine runs them, ≤ %d tokens and ≤ %d attended tokens per GEMM, "+
		"%s. Planner and SLO model fitted to %d calibration points (sched.FitCompute): "+
		"%.1f µs + %.4g µs/token + %.4g ns/pair per layer",
		g.device, p.Name, g.dims.K, g.dims.K, g.dims.LinearN, g.dims.AttnD, g.dims.AttnD, g.tiles.Rows, g.tiles.Ctx,
		source, g.fitPoints, m.FixedNs/1e3, m.PerTokenNs/1e3, m.PerPairNs)
}
