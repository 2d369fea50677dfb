package main

import (
	"bytes"
	"errors"
	"flag"
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
	"github.com/tutti-io/tutti/eval/workload"
	"github.com/tutti-io/tutti/internal/trace"
)

func init() {
	register("replay", "replay a workload (docqa, or a Mooncake-format trace) through every KV-cache backend; what tutti gained, TTFT, SLO, bandwidth report", runReplay)
}

// defaultWindowRequests is how much of the embedded conversation window
// --workload conversation replays unless --requests says.
const defaultWindowRequests = 100

// replayFlags are replay's flags, parsed into by its FlagSet.
type replayFlags struct {
	fs                                                                                                   *flag.FlagSet
	tracePath, storageLabel, backends, modelName, out, capBytes, computeMode, kvMem, atRates             *string
	requests, blockTokens, capBlocks, qd, gpus, saveBoundMs, gpuWindow, gpuMaxIO, gpuLookahead, runWidth *int
	prefillEvery                                                                                         *int
	fromMs, toMs, timeScale, sloMs, gpuTFLOPs, warmMs                                                    *float64
	jsonOut, skipBad, noEBPF, noCeiling, keep, planner, aloneCheck                                       *bool
	wl                                                                                                   *workloadFlags
	dir                                                                                                  *dirsFlag
	kf                                                                                                   kvFlags
	kind                                                                                                 string    // the workload (workloadFlags.kind)
	rates                                                                                                []float64 // --at-rates, parsed by check
}

// newReplayFlags defines replay's flags.
func newReplayFlags(stderr io.Writer) *replayFlags {
	f := &replayFlags{fs: newFlagSet("replay", stderr)}
	fs := f.fs
	f.tracePath = fs.String("trace", "", "Mooncake-format JSONL trace to replay instead of a --workload")
	f.dir = &dirsFlag{}
	fs.Var(f.dir, "dir", "store directory, or several comma-separated (one file system each, e.g. one per device) that every backend stripes over; each backend uses D/<backend> in each (default: a temporary directory, removed afterwards)")
	f.storageLabel = fs.String("storage-label", "", "what the storage under --dir is, for the report and every JSON row (e.g. \"emulated storage (4 RAM-backed loop devices, ext4)\")")
	f.backends = fs.String("backends", "", "comma-separated backends, listed above (default: the default ones this machine can run)")
	f.modelName = fs.String("model", "tiny", "model profile: "+strings.Join(model.Names(), ", "))
	f.requests = fs.Int("requests", -1, "replay only the first N requests (0 = all; default: all, but the first 100 of --workload conversation)")
	f.fromMs = fs.Float64("from-ms", 0, "window start on the trace's timestamps (ms)")
	f.toMs = fs.Float64("to-ms", 0, "window end on the trace's timestamps (ms, 0 = no end)")
	f.jsonOut = fs.Bool("json", false, "print one JSON object per backend (an array) on stdout")
	f.skipBad = fs.Bool("skip-bad", false, "skip and count malformed trace lines instead of failing on the first")
	f.out = fs.String("out", "", "report directory (default: a new temporary directory, kept)")
	f.timeScale = fs.Float64("time-scale", 1, "multiply arrival times by this (0.5 = twice the request rate)")
	f.blockTokens = fs.Int("block-tokens", trace.DefaultBlockTokens, "tokens per hash id in the trace")
	f.capBlocks = fs.Int("capacity-blocks", 0, "storage capacity per backend in chain blocks (0 = every distinct block fits)")
	f.capBytes = fs.String("capacity", "", "storage capacity per backend in bytes (e.g. 2GiB); overrides --capacity-blocks")
	f.atRates = fs.String("at-rates", "", "docqa: also give each backend's JSON row the timeline at these request rates (comma-separated req/s; arrivals scaled as eval/vllm/docqa.py scales the same plan), every request's TTFT at each: the figures eval/vllm/harness_check.py holds against real vLLM's")
	f.sloMs = fs.Float64("slo-ms", 0, "TTFT SLO on p90 in ms (0 = 2 × recompute's unloaded p90)")
	f.gpuTFLOPs = fs.Float64("gpu-tflops", harness.DefaultGPUFLOPs/1e12, "simulated GPU prefill rate (TFLOP/s)")
	f.computeMode = fs.String("compute", harness.ComputeAuto, "prefill compute: gpu (cuBLAS GEMMs sized from the model's FLOPs, run next to each restore and measured; "+
		"every backend prefills every request's missed tokens for real: minutes for big models), sim (the profile's FLOPs at --gpu-tflops), "+
		"auto (gpu where the kernels library and a GPU are, else sim; the report's compute label says which)")
	f.prefillEvery = fs.Int("gpu-prefill-every", 1, "with the prefill on the GPU (--compute gpu/auto): 1 = every request runs its GEMMs next to its restore and its measured layer time is used; "+
		"N > 1 = every request's layer time comes from the model calibrated on the GPU at start, and only every N-th request runs its GEMMs live, as the model's check (measured/model in the GPU prefill note)")
	f.aloneCheck = fs.Bool("gpu-alone-check", true, "with --gpu-prefill-every N > 1: re-run each live check's GEMMs alone right after it (a diagnostic outside the timeline: alone/model and live/alone per backend in the GPU prefill note); false skips the re-runs")
	f.qd = fs.Int("qd", 64, "I/Os in flight per backend")
	f.noEBPF = fs.Bool("no-ebpf", false, "count device bytes with /proc/diskstats only")
	f.noCeiling = fs.Bool("no-ceiling", false, "skip the devbench ceiling measurement (over several --dir: the dirs as one striped array, timed to the slowest, and the sum of their own ceilings)")
	f.kvMem = fs.String("kv-mem", "", "bound on the engine KV memory (e.g. 8GiB); longer requests are left out for every backend (default: half of available memory, at most 16 GiB)")
	f.keep = fs.Bool("keep", false, "keep each backend's store directory after its run")
	f.gpus = fs.Int("gpus", 1, "tensor-parallel ranks: run tutti-cpu over N ranks (runtime/tp: each rank its own store and its shard of the KV heads; a block is a hit only when every rank committed it)")
	f.warmMs = fs.Float64("warm-ms", 0, "start the window warm: before it, every caching backend saves (untimed, no prefill) the blocks the window references that the trace's requests of the previous D ms (timestamps in [window start - D, window start)) referenced, in their order, within the capacity; 0 = every store starts empty")
	f.saveBoundMs = fs.Int("tutti-save-bound-ms", 60000, "tutti's save bound (runtime Config.SaveBoundMs; 0: the runtime's default, 2000). The scheduler cuts a save to what it can write within the bound; the replay compares restores of the same cached blocks, and with the runtime's 2 s a 70B request bringing several GB of new KV would keep only its leading blocks where the baselines keep all")
	f.runWidth = fs.Int("tutti-run-width", 0, "tutti: devices each run of the store spreads its layers over (runtime Config.RunWidth; 0: the runtime's default, every --dir device; 1: each run whole on one device, the layout before objmap's manifest version 3, to compare against)")
	f.gpuWindow = fs.Int("tutti-gpu-window", 0, "tutti-gpu: GPU reads in flight (0: sized to the store's devices, runtime.GPUReadWindow)")
	f.gpuMaxIO = fs.Int("tutti-gpu-max-io", 0, "tutti-gpu: largest read in bytes (0: the largest read every store device takes unsplit, from max_sectors_kb, at most 4 MiB)")
	f.gpuLookahead = fs.Int("tutti-gpu-lookahead", 0, "tutti-gpu: layers in flight beyond the one waited for, 0..16 (0: runtime.GPULookaheadToFill, layers enough to fill the read window, at least one per store device and 2, at most 16)")
	f.wl = registerWorkloadFlags(fs)
	f.planner = fs.Bool("tutti-planner", true, "give tutti's scheduler the compute model, so it recomputes cached blocks where that beats loading them (false: load every cached block, as the baselines do)")
	f.kf.add(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tutti replay [--workload docqa|conversation | --trace FILE] [--dir D] [--backends a,b] [--model NAME] [--requests N] [--json] [--out DIR] [--time-scale X]")
		fmt.Fprintf(stderr, "\nWith no flags: the docqa workload (%s), the tiny model,\nthe default backends this machine can run, a temporary store; prints what tutti gained against\nrecompute and the storage designs, the table, and where the report is.\n", workload.DefaultDocQA.Brief())
		fmt.Fprint(stderr, backendsHelp())
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	return f
}

// runReplay is `tutti replay`: its flags, the requests and backends they
// name, then harness.Run and the report.
func runReplay(args []string, stdout, stderr io.Writer) (err error) {
	f := newReplayFlags(stderr)
	fs := f.fs
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr(fs.Usage, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	// The output directory is checked (or made) before any work: a bad
	// --out must not lose a run's report.
	outDir, madeOut := *f.out, false
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
	prof, storeDirs, err := f.check()
	if err != nil {
		return err
	}
	if *f.wl.pick {
		if f.kind == workloadDocQA {
			return usageErr(fs.Usage, needsTrace("--pick-window picks windows of a trace"))
		}
		var maxKV int64
		if *f.kvMem != "" {
			if maxKV, err = devbench.ParseBytes(*f.kvMem); err != nil {
				return usageErr(fs.Usage, fmt.Errorf("--kv-mem: %w", err))
			}
		}
		return f.wl.pickWindow(stdout, *f.tracePath, trace.Options{BlockTokens: *f.blockTokens, SkipBad: *f.skipBad}, prof, *f.warmMs, *f.gpuTFLOPs*1e12, *f.capBlocks, maxKV)
	}
	// The requests: a generated workload (replay_workload.go) or a window of
	// a trace.
	reqs, st, warm, traceDesc, err := replayRequests(fs, f.wl, f.kind, *f.tracePath, trace.Options{BlockTokens: *f.blockTokens, SkipBad: *f.skipBad},
		trace.Window{First: *f.requests, FromMs: *f.fromMs, ToMs: *f.toMs}, *f.warmMs, prof.BlockTokens(), stderr)
	if err != nil {
		return err
	}
	if err := trace.Scale(reqs, *f.timeScale); err != nil {
		return usageErr(fs.Usage, fmt.Errorf("--time-scale: %w", err))
	}
	comp, gpuCompute, err := f.compute(prof)
	if err != nil {
		return err
	}
	defer gpuCompute.Close()
	bs, notes, explicit, err := f.selectBackends(prof, comp, storeDirs)
	if err != nil {
		return err
	}
	unregister, err := kvEventsBackend(&f.kf, bs, prof, *f.capBlocks, &notes)
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
	cfg := harness.Config{
		Requests: reqs, Profile: prof, Dirs: storeDirs, StorageLabel: *f.storageLabel, Backends: bs, CapacityBlocks: *f.capBlocks,
		QueueDepth: *f.qd, Compute: comp, GPU: gpuCompute, SLOms: *f.sloMs, EBPF: !*f.noEBPF, KeepStores: *f.keep,
		Warm: warm, Rounds: *f.wl.rounds, Workload: workloadName(f.kind, *f.tracePath),
	}
	cfg.Progress, cfg.PhaseProgress, cfg.Stage = replayProgress(stderr, len(reqs), bs)
	if *f.noCeiling {
		cfg.CeilingBytes = -1
	}
	if *f.kvMem != "" {
		if cfg.MaxKVBytes, err = devbench.ParseBytes(*f.kvMem); err != nil {
			return usageErr(fs.Usage, fmt.Errorf("--kv-mem: %w", err))
		}
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
	addAtRates(res, f.rates, f.wl.docqa.RatePerS, *f.timeScale, traceDesc)
	notes = append(notes, harness.TuttiNotes(bs)...)
	notes = append(notes, kvEventsNotes(bs)...)
	notes = append(notes, harness.GPUComputeNotes(gpuCompute)...)
	notes = append(notes, fmt.Sprintf("every backend replays the same %d requests in the same order, with the same block capacity", len(reqs)))
	meta := report.Meta{Command: "tutti replay " + shellJoin(args), TracePath: traceDesc,
		Skipped: st.Skipped, TimeScale: *f.timeScale, Notes: notes}
	madeOut = false // the report's directory is kept
	return replayReport(outDir, res, meta, *f.jsonOut, explicit, runErr, stdout, stderr)
}

// check checks the flags that need no work done (the workload, the model,
// its block size, --qd, --dir, --warm-ms, --at-rates) and fills in
// --requests' default and f.rates.
func (f *replayFlags) check() (prof model.Profile, storeDirs []string, err error) {
	fs := f.fs
	if f.kind, err = f.wl.kind(fs, *f.tracePath); err != nil {
		return prof, nil, err
	}
	prof, err = model.Lookup(*f.modelName)
	if err != nil {
		return prof, nil, usageErr(fs.Usage, err)
	}
	if *f.blockTokens != prof.BlockTokens() {
		// A trace hashed at another granularity: one chain block is
		// blockTokens/PageTokens engine pages.
		pt := prof.Shape.PageTokens
		if *f.blockTokens <= 0 || *f.blockTokens%pt != 0 {
			return prof, nil, usageErr(fs.Usage, fmt.Errorf("--block-tokens %d: must be a positive multiple of the model's %d-token pages",
				*f.blockTokens, pt))
		}
		prof.Shape.ChunkPages = *f.blockTokens / pt
	}
	if *f.requests < 0 {
		*f.requests = 0
		if f.kind == workloadConversation {
			*f.requests = defaultWindowRequests
		}
	}
	if *f.qd < 1 || *f.qd > 4096 {
		return prof, nil, usageErr(fs.Usage, errors.New("--qd must be in 1..4096"))
	}
	storeDirs = f.dir.dirs
	if *f.warmMs < 0 || math.IsNaN(*f.warmMs) || math.IsInf(*f.warmMs, 0) {
		return prof, nil, usageErr(fs.Usage, fmt.Errorf("--warm-ms %v: want a duration ≥ 0", *f.warmMs))
	}
	if f.rates, err = f.atRatesOf(); err != nil {
		return prof, nil, usageErr(fs.Usage, err)
	}
	return prof, storeDirs, nil
}

// compute is the prefill compute of --compute and --gpu-tflops; the caller
// closes the GPU compute (nil-safe).
func (f *replayFlags) compute(prof model.Profile) (harness.Compute, *harness.GPUCompute, error) {
	comp, err := harness.NewCompute(prof, *f.gpuTFLOPs*1e12, harness.DefaultLayerFixedNs)
	if err != nil {
		return comp, nil, usageErr(f.fs.Usage, err)
	}
	if !slices.Contains(harness.ComputeModes, *f.computeMode) {
		return comp, nil, usageErr(f.fs.Usage, fmt.Errorf("--compute %q: want one of %v", *f.computeMode, harness.ComputeModes))
	}
	if *f.prefillEvery < 1 {
		return comp, nil, usageErr(f.fs.Usage, fmt.Errorf("--gpu-prefill-every %d: want ≥ 1", *f.prefillEvery))
	}
	comp, g, err := harness.SetupCompute(*f.computeMode, prof, comp)
	if err == nil {
		g.SetLiveEvery(*f.prefillEvery, &comp)
		g.SetAloneCheck(*f.aloneCheck)
	}
	return comp, g, err
}

// selectBackends is --backends (named ones must run; by default, those
// available here), --gpus' tensor-parallel backends, and --capacity in
// blocks; explicit says the backends were named.
func (f *replayFlags) selectBackends(prof model.Profile, comp harness.Compute, storeDirs []string) (bs []harness.Backend, notes []string, explicit bool, err error) {
	var plannerModel *harness.Compute
	if *f.planner {
		plannerModel = &comp
	}
	names := splitList(*f.backends)
	explicit = len(names) > 0
	if !explicit {
		names = harness.BackendNames
	}
	bs, notes, err = harness.SelectBackends(harness.BackendChoice{Names: names, Explicit: explicit, Planner: plannerModel, Dirs: storeDirs,
		GPUWindow: *f.gpuWindow, GPUMaxIO: *f.gpuMaxIO, GPULookahead: *f.gpuLookahead, SaveBoundMs: *f.saveBoundMs, RunWidth: *f.runWidth})
	if err != nil {
		return nil, nil, false, usageErr(f.fs.Usage, err)
	}
	if bs, err = tpBackends(bs, *f.gpus, plannerModel, prof); err != nil {
		return nil, nil, false, usageErr(f.fs.Usage, err)
	}
	if *f.capBytes != "" {
		v, err := devbench.ParseBytes(*f.capBytes)
		if err != nil {
			return nil, nil, false, usageErr(f.fs.Usage, fmt.Errorf("--capacity: %w", err))
		}
		g, _ := prof.Geometry()
		*f.capBlocks = int(max(1, v/g.ChunkBytes()))
	}
	return bs, notes, explicit, nil
}

// replayProgress is the run's progress (requests, and the stages between
// them: harness.Config.Stage): a bar on a terminal, whole lines (a few per
// backend, each with where the backend's wall time went so far:
// harness.Phases) on a pipe or a CI log.
func replayProgress(stderr io.Writer, requests int, bs []harness.Backend) (func(string, int, int), func(string, int, int, harness.Phases), func(string, int, int)) {
	if isTerminal(stderr) {
		bar := report.NewProgress(stderr)
		return bar.Update, nil, bar.Update
	}
	lp := newLineProgress(stderr)
	fmt.Fprintf(stderr, "replaying %d requests through %d backends (%s)\n", requests, len(bs), strings.Join(backendNames(bs), ", "))
	return nil, func(b string, done, total int, p harness.Phases) { lp.Note(b, done, total, p.String()) }, lp.Update
}

// replayReport writes the report under outDir, prints the summary (or the
// JSON), and fails closed: a wrong byte is an error exit, not a line in a
// report; so is a backend that was asked for by name and could not run.
func replayReport(outDir string, res *harness.Result, meta report.Meta, jsonOut, explicit bool, runErr error, stdout, stderr io.Writer) error {
	path, werr := report.Write(outDir, res, meta)
	if jsonOut {
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
	for _, b := range res.Backends {
		if b.VerifyMismatches > 0 {
			fmt.Fprintf(stderr, "%s: %d restored pages (8-byte words where verified on the device) differ from what was saved\n", b.Backend, b.VerifyMismatches)
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

// printSummary prints what tutti gained first (harness.Gains), then the
// run's setup, the table, and why and the paper's figures.
func printSummary(w io.Writer, res *harness.Result) {
	if heading, gains := harness.Gains(res); heading != "" {
		fmt.Fprintf(w, "%s:\n", heading)
		for _, g := range gains {
			fmt.Fprintf(w, "  %-13s %s\n", g.Against, g.Text)
		}
	}
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
	for _, b := range res.Backends {
		if b.Phases != nil {
			fmt.Fprintf(w, "time %-13s %s\n", b.Backend, b.Phases)
		}
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

func backendNames(bs []harness.Backend) []string {
	names := make([]string, len(bs))
	for i, b := range bs {
		names[i] = b.Name()
	}
	return names
}

// workloadName is harness.Config.Workload for workload kind.
func workloadName(kind, tracePath string) string {
	switch kind {
	case workloadDocQA:
		return harness.WorkloadDocQA
	case workloadConversation:
		return "the Mooncake conversation trace's embedded window"
	}
	return "trace " + tracePath
}

// backendsHelp lists the backends for -h: the default ones, then those that
// run only when named, each with what it is (harness.BackendSummary).
func backendsHelp() string {
	var b strings.Builder
	b.WriteString("\nBackends (--backends); the default runs these where this machine can:\n")
	for _, n := range harness.BackendNames {
		fmt.Fprintf(&b, "  %-18s %s\n", n, harness.BackendSummary(n))
	}
	b.WriteString("and these only when named:\n")
	for _, n := range harness.ExtraBackendNames {
		fmt.Fprintf(&b, "  %-18s %s\n", n, harness.BackendSummary(n))
	}
	return b.String()
}
