package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/tutti-io/tutti/devbench"
	"github.com/tutti-io/tutti/eval"
	"github.com/tutti-io/tutti/eval/harness"
	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/eval/report"
	"github.com/tutti-io/tutti/internal/trace"
	"github.com/tutti-io/tutti/runtime"
)

func init() {
	register("replay", "replay a Mooncake-format trace through every KV-cache backend; TTFT, SLO, bandwidth report", runReplay)
}

// defaultCPUBackends are what the no-flag run uses: every backend that needs
// no GPU.
var defaultCPUBackends = []string{"tutti-cpu", "tutti-cpu-load-all", "lmcache-gds", "lmcache-disk", "vllm-fs", "dram", "recompute"}

// defaultWindowRequests is how much of the embedded window the no-flag run replays.
const defaultWindowRequests = 100

func runReplay(args []string, stdout, stderr io.Writer) (err error) {
	fs := newFlagSet("replay", stderr)
	tracePath := fs.String("trace", "", "Mooncake-format JSONL trace (default: the embedded 200-request window)")
	dir := fs.String("dir", "", "store directory, or several comma-separated (one file system each, e.g. one per device) that every backend stripes over; each backend uses D/<backend> in each (default: a temporary directory, removed afterwards)")
	storageLabel := fs.String("storage-label", "", "what the storage under --dir is, for the report and every JSON row (e.g. \"emulated storage (4 RAM-backed loop devices, ext4)\")")
	backends := fs.String("backends", "", "comma-separated backends: "+strings.Join(harness.BackendNames, ",")+" (or, named only: "+strings.Join(harness.ExtraBackendNames, ",")+")"+
		" (default: every backend this machine can run)")
	modelName := fs.String("model", "tiny", "model profile: "+strings.Join(model.Names(), ", "))
	requests := fs.Int("requests", -1, "replay only the first N requests (0 = all; default: all of --trace, or the first 100 of the embedded window)")
	fromMs := fs.Float64("from-ms", 0, "window start on the trace's timestamps (ms)")
	toMs := fs.Float64("to-ms", 0, "window end on the trace's timestamps (ms, 0 = no end)")
	jsonOut := fs.Bool("json", false, "print one JSON object per backend (an array) on stdout")
	skipBad := fs.Bool("skip-bad", false, "skip and count malformed trace lines instead of failing on the first")
	out := fs.String("out", "", "report directory (default: a new temporary directory, kept)")
	timeScale := fs.Float64("time-scale", 1, "multiply arrival times by this (0.5 = twice the request rate)")
	blockTokens := fs.Int("block-tokens", trace.DefaultBlockTokens, "tokens per hash id in the trace")
	capBlocks := fs.Int("capacity-blocks", 0, "storage capacity per backend in chain blocks (0 = every distinct block fits)")
	capBytes := fs.String("capacity", "", "storage capacity per backend in bytes (e.g. 2GiB); overrides --capacity-blocks")
	sloMs := fs.Float64("slo-ms", 0, "TTFT SLO on p90 in ms (0 = 2 × recompute's unloaded p90)")
	gpuTFLOPs := fs.Float64("gpu-tflops", harness.DefaultGPUFLOPs/1e12, "simulated GPU prefill rate (TFLOP/s)")
	computeMode := fs.String("compute", harness.ComputeAuto, "prefill compute: gpu (cuBLAS GEMMs sized from the model's FLOPs, run next to each restore and measured; "+
		"every backend prefills every request's missed tokens for real: minutes for big models), sim (the profile's FLOPs at --gpu-tflops), "+
		"auto (gpu where the kernels library and a GPU are, else sim; the report's compute label says which)")
	qd := fs.Int("qd", 64, "I/Os in flight per backend")
	noEBPF := fs.Bool("no-ebpf", false, "count device bytes with /proc/diskstats only")
	noCeiling := fs.Bool("no-ceiling", false, "skip the devbench ceiling measurement (over several --dir: the dirs as one striped array, timed to the slowest, and the sum of their own ceilings)")
	kvMem := fs.String("kv-mem", "", "bound on the engine KV memory (e.g. 8GiB); longer requests are left out for every backend (default: half of available memory, at most 16 GiB)")
	keep := fs.Bool("keep", false, "keep each backend's store directory after its run")
	gpus := fs.Int("gpus", 1, "tensor-parallel ranks: run tutti-cpu over N ranks (runtime/tp: each rank its own store and its shard of the KV heads; a block is a hit only when every rank committed it)")
	warmMs := fs.Float64("warm-ms", 0, "start the window warm: before it, every caching backend saves (untimed, no prefill) the blocks the window references that the trace's requests of the previous D ms (timestamps in [window start - D, window start)) referenced, in their order, within the capacity; 0 = every store starts empty")
	saveBoundMs := fs.Int("tutti-save-bound-ms", 60000, "tutti's save bound (runtime Config.SaveBoundMs; 0: the runtime's default, 2000). The scheduler cuts a save to what it can write within the bound; the replay compares restores of the same cached blocks, and with the runtime's 2 s a 70B request bringing several GB of new KV would keep only its leading blocks where the baselines keep all")
	gpuWindow := fs.Int("tutti-gpu-window", 0, "tutti-gpu: GPU reads in flight (0: sized to the store's devices, runtime.GPUReadWindow)")
	gpuMaxIO := fs.Int("tutti-gpu-max-io", 0, "tutti-gpu: largest read in bytes (0: the largest read every store device takes unsplit, from max_sectors_kb, at most 4 MiB)")
	gpuLookahead := fs.Int("tutti-gpu-lookahead", 0, "tutti-gpu: layers in flight beyond the one waited for (0: one per store device, at least 2, at most 8)")
	wl := registerWorkloadFlags(fs)
	planner := fs.Bool("tutti-planner", true, "give tutti's scheduler the compute model, so it recomputes cached blocks where that beats loading them (false: load every cached block, as the baselines do)")
	var kf kvFlags
	kf.add(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tutti replay [--trace FILE] [--dir D] [--backends a,b] [--model NAME] [--requests N] [--json] [--skip-bad] [--out DIR] [--time-scale X]")
		fmt.Fprintln(stderr, "\nWith no flags: the embedded trace window, the tiny model, the CPU backends, a temporary store; prints where the report is.")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr(fs.Usage, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	// The output directory is checked (or made) before any work: a bad
	// --out must not lose a run's report.
	outDir, madeOut := *out, false
	if outDir != "" {
		if err := checkOutDir("--out", outDir); err != nil {
			return usageErr(fs.Usage, err)
		}
	} else {
		d, err := os.MkdirTemp("", "tutti-replay-report-")
		if err != nil {
			return err
		}
		outDir, madeOut = d, true
	}
	defer func() {
		if madeOut {
			os.Remove(outDir) // only when empty: no report was written
		}
	}()
	// SIGINT and SIGTERM cancel ctx; the deferred cleanups below (the
	// temporary store, each backend's directory) run, then the exit status
	// says the run was interrupted.
	ctx, interrupted, stop := signalContext(stderr)
	defer func() { err = interrupted(err) }()
	defer stop()
	prof, err := model.Lookup(*modelName)
	if err != nil {
		return usageErr(fs.Usage, err)
	}
	if *blockTokens != prof.BlockTokens() {
		// A trace hashed at another granularity: one chain block is
		// blockTokens/PageTokens engine pages.
		pt := prof.Shape.PageTokens
		if *blockTokens <= 0 || *blockTokens%pt != 0 {
			return usageErr(fs.Usage, fmt.Errorf("--block-tokens %d: must be a positive multiple of the model's %d-token pages",
				*blockTokens, pt))
		}
		prof.Shape.ChunkPages = *blockTokens / pt
	}
	if *requests < 0 {
		*requests = 0
		if *tracePath == "" {
			// Keeps the no-flag run well under a minute on two shared cores:
			// the saves of ~1,800 distinct 512 KiB blocks per backend dominate.
			*requests = defaultWindowRequests
		}
	}
	if *qd < 1 || *qd > 4096 {
		return usageErr(fs.Usage, errors.New("--qd must be in 1..4096"))
	}
	storeDirs, err := parseDirs(*dir)
	if err != nil {
		return usageErr(fs.Usage, err)
	}

	if *warmMs < 0 || math.IsNaN(*warmMs) || math.IsInf(*warmMs, 0) {
		return usageErr(fs.Usage, fmt.Errorf("--warm-ms %v: want a duration ≥ 0", *warmMs))
	}

	if *wl.pick {
		var maxKV int64
		if *kvMem != "" {
			if maxKV, err = devbench.ParseBytes(*kvMem); err != nil {
				return usageErr(fs.Usage, fmt.Errorf("--kv-mem: %w", err))
			}
		}
		return wl.pickWindow(stdout, *tracePath, trace.Options{BlockTokens: *blockTokens, SkipBad: *skipBad}, prof, *warmMs, *gpuTFLOPs*1e12, *capBlocks, maxKV)
	}
	// The requests: a generated workload (--workload, replay_workload.go)
	// or a window of the trace.
	reqs, st, warm, traceDesc, err := replayRequests(fs, wl, *tracePath, trace.Options{BlockTokens: *blockTokens, SkipBad: *skipBad},
		trace.Window{First: *requests, FromMs: *fromMs, ToMs: *toMs}, *warmMs, prof.BlockTokens(), stderr)
	if err != nil {
		return err
	}
	if err := trace.Scale(reqs, *timeScale); err != nil {
		return usageErr(fs.Usage, fmt.Errorf("--time-scale: %w", err))
	}

	comp, err := harness.NewCompute(prof, *gpuTFLOPs*1e12, harness.DefaultLayerFixedNs)
	if err != nil {
		return usageErr(fs.Usage, err)
	}
	if !slices.Contains(harness.ComputeModes, *computeMode) {
		return usageErr(fs.Usage, fmt.Errorf("--compute %q: want one of %v", *computeMode, harness.ComputeModes))
	}
	var gpuCompute *harness.GPUCompute
	if comp, gpuCompute, err = harness.SetupCompute(*computeMode, prof, comp); err != nil {
		return err
	}
	defer gpuCompute.Close()
	var plannerModel *harness.Compute
	if *planner {
		plannerModel = &comp
	}

	// The backends: named ones must run; by default, those available here.
	names := splitList(*backends)
	explicit := len(names) > 0
	if !explicit {
		names = harness.BackendNames
		if *tracePath == "" && *modelName == "tiny" {
			names = defaultCPUBackends
		}
	}
	var bs []harness.Backend
	var notes []string
	for _, n := range names {
		b, err := harness.NewBackend(n, plannerModel)
		if err != nil {
			return usageErr(fs.Usage, err)
		}
		if err := b.Available(); err != nil && !explicit {
			notes = append(notes, fmt.Sprintf("%s not run: %v", n, err))
			continue
		}
		if t, ok := b.(*harness.Tutti); ok {
			if n == "tutti-gpu" {
				r := gpuReads(storeDirs, *gpuWindow, *gpuMaxIO, *gpuLookahead)
				t.SetGPUReads(r.Window, r.MaxIOBytes, r.Lookahead)
				notes = append(notes, fmt.Sprintf("tutti-gpu: window %d reads, largest read %d KiB, lookahead %d layers", r.Window, r.MaxIOBytes>>10, r.Lookahead))
				for _, u := range r.Unread {
					notes = append(notes, "tutti-gpu: device not read: "+u)
				}
			}
			if *saveBoundMs > 0 {
				t.SetSaveBoundMs(*saveBoundMs)
				notes = append(notes, fmt.Sprintf("%s: save bound %d ms (--tutti-save-bound-ms, the replay's default 60000: the runtime's own default, 2000, cuts saves larger than it writes in 2 s, which the baselines keep whole)", n, *saveBoundMs))
			}
		}
		bs = append(bs, b)
	}

	if bs, err = tpBackends(bs, *gpus, plannerModel, prof); err != nil {
		return usageErr(fs.Usage, err)
	}

	if *capBytes != "" {
		v, err := devbench.ParseBytes(*capBytes)
		if err != nil {
			return usageErr(fs.Usage, fmt.Errorf("--capacity: %w", err))
		}
		g, _ := prof.Geometry()
		*capBlocks = int(max(1, v/g.ChunkBytes()))
	}
	unregister, err := kvEventsBackend(&kf, bs, prof, *capBlocks, &notes)
	if err != nil {
		return usageErr(fs.Usage, err)
	}
	defer unregister()

	if len(storeDirs) == 0 {
		d, err := os.MkdirTemp("", "tutti-replay-store-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		storeDirs = []string{d}
	}
	progress := report.NewProgress(stderr).Update
	if !isTerminal(stderr) {
		// A pipe or a CI log: whole lines, a few per backend.
		lp := newLineProgress(stderr)
		fmt.Fprintf(stderr, "replaying %d requests through %d backends (%s)\n", len(reqs), len(bs), strings.Join(backendNames(bs), ", "))
		progress = lp.Update
	}
	cfg := harness.Config{
		Requests: reqs, Profile: prof, Dirs: storeDirs, StorageLabel: *storageLabel, Backends: bs, CapacityBlocks: *capBlocks,
		QueueDepth: *qd, Compute: comp, GPU: gpuCompute, SLOms: *sloMs, EBPF: !*noEBPF,
		Progress: progress, Warm: warm, Rounds: *wl.rounds,
	}
	if *noCeiling {
		cfg.CeilingBytes = -1
	}
	cfg.KeepStores = *keep
	if *kvMem != "" {
		v, err := devbench.ParseBytes(*kvMem)
		if err != nil {
			return usageErr(fs.Usage, fmt.Errorf("--kv-mem: %w", err))
		}
		cfg.MaxKVBytes = v
	}
	res, runErr := harness.Run(ctx, cfg)
	if runErr != nil && (res == nil || len(res.Backends) == 0 || ctx.Err() == nil) {
		return runErr
	}
	if runErr != nil {
		// Interrupted (Ctrl-C, timeout -s INT): the backends that finished
		// are reported, and the exit status still says it was cut short.
		notes = append(notes, fmt.Sprintf("interrupted after %d of %d backends (%v): only those that finished are reported",
			len(res.Backends), len(bs), runErr))
	}
	if res.Oversize > 0 {
		fmt.Fprintf(stderr, "left out %d requests whose KV exceeds the engine memory bound (--kv-mem)\n", res.Oversize)
	}
	for _, b := range bs {
		t, ok := b.(*harness.Tutti)
		if !ok {
			continue
		}
		if w, bt := t.GPUHelper(); w > 0 {
			notes = append(notes, fmt.Sprintf("%s: the GPU ring's helper entered the kernel %d times; %d waits ran the whole batch wait with reads in flight", t.Name(), w, bt))
		}
		if t.PlannedRecomputeBlocks() > 0 {
			notes = append(notes, fmt.Sprintf("%s: the planner recomputed %d cached blocks instead of loading them",
				t.Name(), t.PlannedRecomputeBlocks()))
		}
	}
	notes = append(notes, kvEventsNotes(bs)...)
	if gs := gpuCompute.Stats(); gs.Requests > 0 {
		notes = append(notes, fmt.Sprintf("GPU prefill: %d prefills measured (%d re-measured alone: the restore brought back fewer blocks than looked up), %.1f s of GPU time; %d GEMM launches next to restores took %.2f CPU-s (in the restores' CPU time where they overlapped)",
			gs.Requests, gs.Reruns, gs.GPUTime.Seconds(), gs.Launches, gs.EnqueueCPU.Seconds()))
	}
	notes = append(notes, fmt.Sprintf("every backend replays the same %d requests in the same order, with the same block capacity", len(reqs)))
	meta := report.Meta{Command: "tutti replay " + shellJoin(args), TracePath: traceDesc,
		Skipped: st.Skipped, TimeScale: *timeScale, Notes: notes}
	path, werr := report.Write(outDir, res, meta)
	madeOut = false // the report's directory is kept
	if *jsonOut {
		if err := report.WriteJSON(stdout, res); err != nil {
			return err
		}
	} else {
		printSummary(stdout, res)
	}
	if werr != nil {
		fmt.Fprintf(stderr, "report: %v\n", werr)
	}
	if path != "" {
		fmt.Fprintf(stderr, "report: %s\n", path)
	}
	// Fail closed: a wrong byte is an error exit, not a line in a report;
	// so is a backend that was asked for by name and could not run.
	for _, b := range res.Backends {
		if b.VerifyMismatches > 0 {
			fmt.Fprintf(stderr, "%s: %d restored pages differ from what was saved\n", b.Backend, b.VerifyMismatches)
			return exitError{code: 3}
		}
	}
	for _, b := range res.Backends {
		if b.Skipped != "" && explicit {
			fmt.Fprintf(stderr, "%s could not run: %s\n", b.Backend, b.Skipped)
			return exitError{code: 4}
		}
	}
	if runErr != nil {
		return runErr
	}
	return werr
}

// ceilingText is the summary's device ceiling: over several store dirs the
// striped figure (what the table's "ceiling" column is over) and the sum of
// the dirs' own ceilings (the "sum" column); over one dir they are the one
// measurement.
func ceilingText(res *harness.Result) string {
	switch {
	case res.CeilingBytesPS <= 0:
		return "not measured"
	case len(res.Dirs) > 1:
		return fmt.Sprintf("%.2f GB/s striped over %d dirs (timed to the slowest), their own ceilings sum to %.2f GB/s",
			res.CeilingBytesPS/1e9, len(res.Dirs), res.CeilingSumBytesPS/1e9)
	default:
		return fmt.Sprintf("%.2f GB/s", res.CeilingBytesPS/1e9)
	}
}

func printSummary(w io.Writer, res *harness.Result) {
	fmt.Fprintf(w, "model %s, %d requests, capacity %d blocks (%d MiB), SLO p90 ≤ %.2f ms, ceiling %s\n",
		res.Model, res.Trace.Requests, res.CapacityBlocks, res.CapacityBytes>>20, res.SLOms, ceilingText(res))
	if res.Warm != nil {
		fmt.Fprintf(w, "start: %s\n", res.Warm.Note)
	}
	printWindowNotes(w, res)
	if res.Storage != "" || len(res.Dirs) > 1 {
		fmt.Fprintf(w, "storage: %s; striped over %s\n", res.Storage, strings.Join(res.Dirs, ", "))
	}
	fmt.Fprintf(w, "%-18s %9s %9s %18s %10s %8s %8s %8s %9s %8s %6s\n", "backend", "p50 ms", "p99 ms", "rate@SLO", "GB/s", "ceiling", "sum", "hit", "I/O/req", "CPU/GiB", "bad")
	for _, b := range res.Backends {
		if b.Skipped != "" {
			fmt.Fprintf(w, "%-18s skipped: %s\n", b.Backend, b.Skipped)
			continue
		}
		rate := rateText(b)
		fmt.Fprintf(w, "%-18s %9.2f %9.2f %18s %10.2f %8.2f %8.2f %8.3f %9.1f %8.3f %6d\n", b.Backend, b.TTFTmsP50, b.TTFTmsP99,
			rate, b.BytesPerS/1e9, b.CeilingFraction, b.CeilingSumFraction, b.HitRatio, b.IOsPerRequestMean, b.CPUSPerGiB, b.VerifyMismatches)
	}
	printBelowNotes(w, res)
}

// parseTrace reads and parses the whole trace at path (the embedded window
// when path is empty) once. A malformed line (without --skip-bad) is not an
// error here but in Parsed.Err, returned by the selections that reach it:
// the window fails only when it reaches the line, the arrival spread (the
// whole trace) whenever there is one.
func parseTrace(path string, opts trace.Options) (*trace.Parsed, error) {
	if path == "" {
		return trace.Parse(bytes.NewReader(eval.DefaultWindow), opts), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return trace.Parse(f, opts), nil
}

// spreadAsInTrace gives the window's requests the arrival times they have
// when every timestamp bucket of the whole trace is spread evenly over its
// width (trace.Spread): a window that starts or ends inside a bucket, or
// lies inside one (the conversation trace's buckets are 3 s wide and hold up
// to 28 requests), keeps the spacing the whole bucket has, instead of
// arriving all at once or spread over the bucket as if only its own
// requests were in it. Requests are matched by trace line.
func spreadAsInTrace(reqs []trace.Request, parsed *trace.Parsed) error {
	all, _, err := parsed.Select(trace.Window{})
	if err != nil {
		return err
	}
	trace.Spread(all, 0)
	at := make(map[int]float64, len(all))
	for _, r := range all {
		at[r.Line] = r.ArrivalMs
	}
	for i := range reqs {
		t, ok := at[reqs[i].Line]
		if !ok {
			return fmt.Errorf("window request of trace line %d is not in the trace", reqs[i].Line)
		}
		reqs[i].ArrivalMs = t
	}
	return nil
}

// warmHistory cuts the warm-up history of a window whose first request has
// trace timestamp startMs: the requests of the previous warmMs ms, i.e.
// timestamps in [startMs - warmMs, startMs). A window at the trace's
// timestamp 0 has none (and a Window's ToMs of 0 would mean no end).
func warmHistory(parsed *trace.Parsed, startMs, warmMs float64) (*harness.Warm, error) {
	w := &harness.Warm{DurationMs: warmMs, FromMs: startMs - warmMs, ToMs: startMs}
	if startMs <= 0 {
		return w, nil
	}
	hist, _, err := parsed.Select(trace.Window{FromMs: w.FromMs, ToMs: w.ToMs})
	if err != nil {
		return nil, err
	}
	w.History = hist
	return w, nil
}

// gpuReads sizes tutti-gpu's reads to the store's devices where a flag
// left them 0 (runtime.DeviceSizedGPUReads; an unknown device adds 128
// reads to the window and counts as taking 1 MiB reads); the runtime checks the values at Open.
func gpuReads(dirs []string, window, maxIO, lookahead int) runtime.GPUReads {
	if len(dirs) == 0 {
		dirs = []string{os.TempDir()}
	}
	return runtime.DeviceSizedGPUReads(dirs).Explicit(window, maxIO, lookahead)
}

func backendNames(bs []harness.Backend) []string {
	names := make([]string, len(bs))
	for i, b := range bs {
		names[i] = b.Name()
	}
	return names
}
