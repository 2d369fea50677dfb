package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/tutti-io/tutti/devbench"
	"github.com/tutti-io/tutti/eval/gpubench"
	"github.com/tutti-io/tutti/eval/gpubench/pool"
)

func init() {
	register("gpubench", "restore a real-shaped KV prefix into HBM through every I/O path and verify it (GPU machine)", runGPUBench)
	register("gpubench-pool", "pool the per-round results of several gpubench --json files: medians, ranges and per-round ratios between paths", runGPUBenchPool)
}

// runGPUBench is `tutti gpubench`: its flags, then eval/gpubench.Run.
func runGPUBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("gpubench", stderr)
	model := fs.String("model", "llama3-70b", "model shape: a profile of eval/model (llama3-8b, llama3-70b, qwen3-32b, deepseek-v3, tiny)")
	tokens := fs.Int("tokens", 32768, "prefix length in tokens")
	dir := fs.String("dir", "", "directory for the data file (real disk)")
	devices := fs.String("devices", "", "comma-separated files or block devices to stripe the prefix over (--stripe; their contents are overwritten, a regular file is sized to the data, with a .layout sidecar for --reuse)")
	stripe := fs.String("stripe", gpubench.StripeRuns, "layout on the devices: runs (as the object store places them, objmap.Layout: runs of consecutive pages, object l of a run = layer l of its pages, layer l of run r on device (r+l) mod D), runs-one-device (run r whole on device r mod D: a store made before objmap's manifest version 3) or layers (layer l's whole object on device l mod D, gpubench's layout before the runs)")
	runPages := fs.Int("run-pages", 0, "--stripe runs: pages per run, whole chain blocks of the model (32 pages for the eval/model profiles), at most objmap.MaxRunChunks blocks (0: the fewest runs per device that fit, of equal length rounded up to whole blocks)")
	label := fs.String("label", "", "storage label printed with the results")
	jsonPath := fs.String("json", "", "write JSON rows (one per line) to this file ('-' = stdout)")
	pathList := fs.String("paths", "gpu,gpu-kick,uring,per-block,cufile,cufile-compat,page-cache,dram,gpu", "paths to run, in order; store-gpu and store-cpu (runtime.Store's Save and Load, eval/gpubench) run after the others, on --store-dirs, and need no GPU for store-cpu")
	storeDirs := fs.String("store-dirs", "", "store-gpu/store-cpu: comma-separated store directories, one per device, on the devices' filesystems (default: --dir)")
	maxIO := fs.Int("max-io", 0, "largest read of the object paths, bytes (0: the largest read every device takes without a split, from its max_sectors_kb, 1 MiB if unknown, at most 4 MiB)")
	qd := fs.Int("qd", 64, "queue depth of the CPU-issued paths")
	window := fs.Int("window", 0, "GPU path: SQEs in flight (0: sized to the devices, runtime.GPUReadWindow of their nr_requests)")
	lookahead := fs.Int("lookahead", 0, "GPU path: layers in flight beyond the one waited for (0: enough layers to fill the window with reads, at least the number of devices and 2, at most 16)")
	idleMs := fs.Uint("sqpoll-idle-ms", 50, "GPU path: SQPOLL thread idle time before it sleeps")
	layout := fs.String("layout", "per-layer", "KV layout: per-layer or cross-layer")
	kickUs := fs.Duration("wake-interval", 200*time.Microsecond, "GPU paths: how often the CPU helper looks at the ring (SQPOLL: wake it if asleep; kick mode: the longest it waits in the kernel for a completion before submitting what the GPU published)")
	seed := fs.Uint64("seed", 1000, "content: chain block ids start here")
	noCeiling := fs.Bool("no-ceiling", false, "skip the ceiling measurement (quick configuration checks)")
	prewrite := fs.Bool("prewrite", false, "store rows: let each store prewrite its fallocated pool in the background (runtime.Config's default) and start the first save once that is done (a store some time after its creation); without it and --write-pool the first save writes unwritten extents")
	writePool := fs.Bool("write-pool", false, "store rows: create each store with its pool written with zeros (runtime.Config.WritePool), so the first save overwrites written extents as save-again does")
	nRounds := fs.Int("rounds", 4, "rounds, each a fresh sample of the sum ceiling, then every path (in an order rotated every two rounds and mirrored every other round: with an even number of rounds every path runs before every other in half of them) with a striped ceiling sample before and after each; rows are the median over the rounds, each path's fraction taken against the mean of the striped samples around it; store-gpu/store-cpu run in rounds too (after the others), each save and restore between two samples of the write or read ceiling")
	reuse := fs.Bool("reuse", false, "keep data files from an earlier run with the same model, tokens, seed, devices and layout (the size of each and its .layout sidecar say so)")
	gpus := fs.Int("gpus", 1, "tensor-parallel ranks: restore the model split over N ranks at once (runtime/tp, rank r on GPU r mod visible, stores under --dir: comma-separated, with at least N directories rank r stripes over every N-th of them), next to one rank of the same shape over the same directories")
	pollTimeout := fs.Duration("poll-timeout", 5*time.Second, "GPU paths: no completion for this long and the ring breaks")
	kickBatch := fs.Int("kick-batch", 32, "GPU kick mode: most completions one wake-up of the CPU helper waits for (a quarter of the I/O in flight, at most this; 1: every completion)")
	kickRamp := fs.Int("kick-ramp", 0, "GPU kick mode: at a restore's start the helper's batch grows by one every this many completions (kernels.Config.WakeRamp; 0: 8, -1: no ramp)")
	kickBatchWait := fs.Duration("kick-batch-wait", 4*time.Millisecond, "GPU kick mode: longest wait for a batch of completions while I/O is in flight")
	kickExact := fs.Bool("kick-exact-target", true, "GPU kick mode: the helper's wait counts only completions that arrive after it starts (false: kernels.BenchOptions.LooseWakeTarget, the first target, slower on the H200)")
	kickDefer := fs.Bool("kick-defer", true, "GPU kick mode: a DEFER_TASKRUN ring (the kernel wakes the helper once per batch); false: an ordinary ring, woken by every completion")
	enqueueLayers := fs.Int("enqueue-layers", 0, "GPU paths: layers of a restore on the GPU's streams ahead of the last one scattered (kernels.Config.EnqueueLayers; 0: 2×(lookahead+3), 16..48)")
	enqueueChunk := fs.Int("enqueue-chunk", 0, "GPU paths: layers the feeder enqueues per wake-up (kernels.Config.EnqueueChunk; 0: half of --enqueue-layers, 1..8)")
	zeroCopy := fs.Bool("zero-copy-scatter", false, "GPU paths: the scatter kernel reads host staging itself instead of a copy-engine copy into device staging (kernels.BenchOptions.ZeroCopyScatter)")
	plainReads := fs.Bool("no-fixed-buffers", false, "GPU paths: plain READ SQEs instead of READ_FIXED into the staging slots registered with the ring (the kernel then pins the pages of every I/O)")
	ceilingMem := fs.String("store-ceiling-mem", "0", "store rows: each directory's memory for the ceilings, the read ceiling's destination and the write ceiling's source (e.g. 256MiB, at most 1GiB; 0: one 1 MiB block per I/O in flight, 32 MiB, which a large last-level cache may hold)")
	storeStaging := fs.String("store-staging", "0", "store rows: each store's staging memory (runtime.Config.StagingBytes, e.g. 512MiB; 0: the runtime's default)")
	saveWrites := fs.Int("store-save-writes", 0, "store rows: save writes in flight per device (runtime.Config.SaveWritesPerDevice; 0: the runtime's default)")
	cpuProfile := fs.String("cpuprofile", "", "write a Go CPU profile of the run (runtime/pprof) to this file: where this process's CPU goes, the store's stage and I/O workers included")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ceilingMemBytes, err := bytesOrZero("--store-ceiling-mem", *ceilingMem)
	if err != nil {
		return err
	}
	stagingBytes, err := bytesOrZero("--store-staging", *storeStaging)
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		stopProfile, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stopProfile()
	}
	if *jsonPath != "" && *jsonPath != "-" {
		if err := checkOutFile("--json", *jsonPath); err != nil {
			return err // before any measurement: a bad path must not lose the rows
		}
	}
	cfg := gpubench.Config{Model: *model, Tokens: *tokens, Dir: *dir, Devices: *devices, Stripe: *stripe, RunPages: *runPages,
		Label: *label, JSONPath: *jsonPath, Paths: *pathList, StoreDirs: *storeDirs, MaxIO: *maxIO, QD: *qd, Window: *window,
		Lookahead: *lookahead, SQPollIdleMs: *idleMs, Layout: *layout, WakeInterval: *kickUs, Seed: *seed, NoCeiling: *noCeiling, WritePool: *writePool, Prewrite: *prewrite,
		Rounds: *nRounds, Reuse: *reuse, GPUs: *gpus, PollTimeout: *pollTimeout, KickBatch: *kickBatch, KickRamp: *kickRamp,
		KickBatchWait: *kickBatchWait, KickExact: *kickExact, KickDefer: *kickDefer, EnqueueLayers: *enqueueLayers,
		EnqueueChunk: *enqueueChunk, ZeroCopy: *zeroCopy, NoFixedBuffers: *plainReads, StoreCeilingMem: ceilingMemBytes,
		StoreStaging: stagingBytes, StoreSaveWrites: *saveWrites}
	if !isTerminal(stderr) {
		// A pipe or a CI log: whole lines, at most one every few seconds.
		cfg.Progress = newLineProgress(stderr).Update
	}
	ctx, interrupted, stop := signalContext(stderr)
	defer stop()
	return interrupted(gpubench.Run(ctx, cfg, stdout, stderr))
}

// startCPUProfile starts a CPU profile into a new file at path; the
// returned function stops it and closes the file.
func startCPUProfile(path string) (func(), error) {
	if err := checkOutFile("--cpuprofile", path); err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// runGPUBenchPool is `tutti gpubench-pool`: its flags, then
// eval/gpubench/pool.
func runGPUBenchPool(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("gpubench-pool", stderr)
	vs := fs.String("vs", "(a)", "compare each path's bytes/s, round by round, with the path of the same file, model and storage whose name starts with this ('' = none)")
	cpuVs := fs.String("cpu-vs", "(b)", "report each path's pooled median CPU s/GiB over that of the path whose name starts with this ('' = none)")
	asJSON := fs.Bool("json", false, "write the pooled rows as JSON")
	byFile := fs.Bool("by-file", false, "one row per file and path instead of pooling the files (a file is one call, often one host)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tutti gpubench-pool [flags] FILE... (gpubench --json outputs)")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("gpubench-pool: no files")
	}
	rows, err := pool.ReadFiles(fs.Args())
	if err != nil {
		return err
	}
	out, err := pool.Rows(rows, *vs, *cpuVs, *byFile)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeIndentedJSON(stdout, out)
	}
	pool.Print(stdout, out)
	return nil
}

// bytesOrZero parses a size flag that also takes "0" (the default it
// stands for), which devbench.ParseBytes refuses.
func bytesOrZero(flag, v string) (int64, error) {
	if v == "0" {
		return 0, nil
	}
	n, err := devbench.ParseBytes(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", flag, err)
	}
	return n, nil
}
