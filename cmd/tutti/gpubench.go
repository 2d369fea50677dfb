package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tutti-io/tutti/devbench"
	evalmodel "github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime"
	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

func init() {
	register("gpubench", "restore a real-shaped KV prefix into HBM through every I/O path and verify it (GPU machine)", runGPUBench)
}

// benchRow is one path's result; --json writes one per line.
type benchRow struct {
	Path      string  `json:"path"`
	Storage   string  `json:"storage"`
	Model     string  `json:"model"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	BytesPerS float64 `json:"bytes_per_s"`
	// CeilingBytesPS is the striped ceiling around this path's restore
	// (the mean of devbench.CeilingStriped just before and just after it):
	// the devices reading this prefix's bytes, as they lie, with raw
	// O_DIRECT reads, timed to the slowest device. CeilingFraction is
	// BytesPerS over it.
	CeilingBytesPS  float64 `json:"ceiling_bytes_per_s"`
	CeilingFraction float64 `json:"ceiling_fraction"`
	// CeilingSumBytesPS is the sum of the devices' own ceilings over 2 s,
	// all at once (devbench.CeilingEachInto, sampled once per round), and
	// CeilingSumFraction BytesPerS over it: faster devices' extra reads
	// count there, which a read of evenly striped data cannot use.
	CeilingSumBytesPS  float64 `json:"ceiling_sum_bytes_per_s,omitempty"`
	CeilingSumFraction float64 `json:"ceiling_sum_fraction,omitempty"`
	// CeilingCachedBytesPS is the sum ceiling into devbench's own 32 MiB
	// per device, which a large CPU cache may hold (ceilingDestBytes).
	CeilingCachedBytesPS float64 `json:"ceiling_cached_bytes_per_s,omitempty"`
	CPUSPerGiB           float64 `json:"cpu_s_per_gib"`
	SQPollCPUS           float64 `json:"sqpoll_cpu_s,omitempty"`
	IOs                  int64   `json:"ios"`
	Mismatches           uint64  `json:"verify_mismatches"`
	FirstLayerMs         float64 `json:"first_layer_ms"`
	LayerMsP50           float64 `json:"layer_ms_p50"`
	LayerMsMax           float64 `json:"layer_ms_max"`
	// IOWQWorkers is how many io_uring io-wq worker threads (iou-wrk-*) of
	// this process ran during the path, and IOWQCPUS their CPU seconds: a
	// read the device could not take nonblocking (no free request tag, a
	// split) went to one. Workers that exited before the path ended are
	// not counted. Their CPU is also in CPUSPerGiB.
	IOWQWorkers int     `json:"io_wq_workers"`
	IOWQCPUS    float64 `json:"io_wq_cpu_s,omitempty"`
	Error       string  `json:"error,omitempty"`
	Note        string  `json:"note,omitempty"`
	// Stripe and RunPages are the data files' layout (--stripe,
	// --run-pages): "runs" with pages per run, or "layers" with 0.
	Stripe   string `json:"stripe"`
	RunPages int    `json:"run_pages"`
	// Rounds is how many rounds the row is the median of (--rounds);
	// PerRound their values.
	Rounds   int        `json:"rounds"`
	PerRound roundStats `json:"per_round"`

	position int // where the path ran in its round (roundOrder); kept in PerRound
}

type gpuBench struct {
	g        objmap.Geometry
	model    string
	label    string
	pages    int
	numPages int
	dst      []int32           // engine page of request page i (a shuffled block table)
	pm       []kernels.PageMap // the staging paths' host map (lay.pageMap)
	objBytes int64             // one layer's object (pages*PageBytes)
	lay      benchLayout       // where each layer's object lies on the devices
	paths    []string
	direct   []*uring.File // O_DIRECT, per device
	buffered []*uring.File // page cache, per device
	maxIO    int
	// ringEntries: SQ size of the GPU rings, at least the window (uring.New
	// rounds it up to a power of two)
	ringEntries uint32
	kickDefer   bool // kick-mode ring with DEFER_TASKRUN (kernels.NewKickRing)
	qd          int
	seed        uint64
	r           *kernels.Restorer
	ring        *uring.Ring
	kcfg        kernels.Config // for the kick-mode context, bound on first use
	kopts       kernels.BenchOptions
	rk          *kernels.Restorer // GPU path on a ring without SQPOLL (kick mode)
	ringK       *uring.Ring
	stderr      io.Writer
}

func (b *gpuBench) totalBytes() int64       { return b.objBytes * int64(b.g.Layers) }
func (b *gpuBench) logf(f string, a ...any) { fmt.Fprintf(b.stderr, f, a...) }

func runGPUBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("gpubench", stderr)
	model := fs.String("model", "llama3-70b", "model shape: a profile of eval/model (llama3-8b, llama3-70b, qwen3-32b, deepseek-v3, tiny)")
	tokens := fs.Int("tokens", 32768, "prefix length in tokens")
	dir := fs.String("dir", "", "directory for the data file (real disk)")
	devices := fs.String("devices", "", "comma-separated files or block devices to stripe the prefix over (--stripe; their contents are overwritten, a regular file is sized to the data, with a .layout sidecar for --reuse)")
	stripe := fs.String("stripe", stripeRuns, "layout on the devices: runs (as the object store: runs of consecutive pages, run r on device r mod D, object l of a run = layer l of its pages) or layers (layer l's whole object on device l mod D, gpubench's layout before the runs)")
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
	nRounds := fs.Int("rounds", 4, "rounds, each a fresh sample of the sum ceiling, then every path (in an order rotated every two rounds and mirrored every other round: with an even number of rounds every path runs before every other in half of them) with a striped ceiling sample before and after each; rows are the median over the rounds, each path's fraction taken against the mean of the striped samples around it")
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
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *jsonPath != "" && *jsonPath != "-" {
		if err := checkOutFile("--json", *jsonPath); err != nil {
			return err // before any measurement: a bad path must not lose the rows
		}
	}
	if *nRounds < 1 || *nRounds > 20 {
		return fmt.Errorf("--rounds %d: want 1..20", *nRounds)
	}
	if *gpus != 1 {
		if *stripe != stripeRuns || *runPages != 0 {
			return errors.New("--stripe and --run-pages apply to one GPU: with --gpus N the ranks' stores lay their runs out themselves")
		}
		return runGroupBenchCLI(groupBenchFlags{model: *model, tokens: *tokens, dir: *dir, layout: *layout, seed: *seed, gpus: *gpus,
			window: *window, maxIO: *maxIO, lookahead: *lookahead, jsonPath: *jsonPath}, stdout, stderr)
	}
	kernelPaths, storePaths := splitStorePaths(*pathList)
	sf := storeFlags{model: *model, label: *label, dirs: *storeDirs, jsonPath: *jsonPath, tokens: *tokens, seed: *seed,
		noCeiling: *noCeiling, appendJSON: len(kernelPaths) > 0}
	if sf.dirs == "" {
		sf.dirs = *dir
	}
	if len(kernelPaths) == 0 {
		return runStoreRows(sf, storePaths, stdout, stderr)
	}
	prof, err := evalmodel.Lookup(*model)
	if err != nil {
		return err
	}
	g := prof.Shape
	b := &gpuBench{g: g, model: *model, label: *label, qd: *qd, seed: *seed, stderr: stderr}
	b.pages = (*tokens + g.PageTokens - 1) / g.PageTokens
	b.numPages = b.pages + b.pages/8 + 16
	b.objBytes = int64(b.pages) * g.PageBytesPerLayer()
	rng := rand.New(rand.NewPCG(*seed, 7))
	perm := rng.Perm(b.numPages)
	for i := 0; i < b.pages; i++ {
		b.dst = append(b.dst, int32(perm[i]))
	}
	switch {
	case *devices != "":
		b.paths = strings.Split(*devices, ",")
	case *dir != "":
		b.paths = []string{filepath.Join(*dir, "gpubench-"+*model+".dat")}
	default:
		return errors.New("need --dir or --devices")
	}
	if b.lay, err = newBenchLayout(prof.Shape, b.pages, len(b.paths), *stripe, *runPages); err != nil {
		return err
	}
	b.pm = b.lay.pageMap(b.dst)
	kl := kernels.LayoutPerLayer
	if *layout == "cross-layer" {
		kl = kernels.LayoutCrossLayer
	}
	name, sms, err := kernels.DeviceName(0)
	if err != nil {
		return fmt.Errorf("gpubench needs the GPU and the kernels library: %w", err)
	}
	fmt.Fprintf(stdout, "gpubench %s: %d layers x %d pages of %d KiB (%s), %.2f GiB, %s, storage %q on %v: %s, GPU %s (%d SMs), content internal/kvdata blocks %d..\n",
		*model, g.Layers, b.pages, g.PageBytesPerLayer()>>10, kl, float64(b.totalBytes())/(1<<30), time.Now().UTC().Format(time.RFC3339), b.label, b.paths, b.lay, name, sms, *seed)

	if err := b.writeData(*reuse); err != nil {
		return err
	}
	defer b.closeFiles()

	// KV tensors and the bound context (ring included), allocated once.
	var kv []uint64
	per := g.PageBytesPerLayer() * int64(b.numPages)
	n, bytes := g.Layers, per
	if kl == kernels.LayoutCrossLayer {
		n, bytes = 1, per*int64(g.Layers)
	}
	for i := 0; i < n; i++ {
		p, err := kernels.DevAlloc(bytes)
		if err != nil {
			return err
		}
		defer kernels.DevFree(p)
		kv = append(kv, p)
	}
	b.maxIO = *maxIO
	if b.maxIO == 0 || *window == 0 {
		// Sized to the devices (runtime.DeviceSizedGPUReads); what they
		// did not say is said on stderr.
		sized := runtime.DeviceSizedGPUReads(b.paths)
		for _, u := range sized.Unread {
			b.logf("%s\n", u)
		}
		sized = sized.Explicit(*window, b.maxIO, 0)
		*window, b.maxIO = sized.Window, sized.MaxIOBytes
	}
	if *lookahead == 0 {
		// Enough layers to fill the window with reads.
		*lookahead = runtime.GPULookaheadToFill(*window, b.maxIO, len(b.paths), b.objBytes)
	}
	b.logf("GPU window %d SQEs, lookahead %d layers, largest read %d KiB\n", *window, *lookahead, b.maxIO>>10)
	b.ringEntries = uint32(max(256, *window))
	rc := uring.DefaultConfig()
	rc.Entries = b.ringEntries
	rc.NoMmap = true // rings in process memory: CUDA maps multi-page rings reliably
	rc.SQPoll = true
	rc.SQThreadIdleMs = uint32(*idleMs)
	b.ring, err = uring.New(rc)
	if err != nil {
		return fmt.Errorf("GPU ring: %w", err)
	}
	defer b.ring.Close()
	b.kcfg = kernels.Config{Geometry: g, Layout: kl, NumPages: b.numPages, KV: kv, Ring: b.ring,
		MaxPages: b.pages, MaxExtents: b.lay.piecesPerLayer(), MaxIOBytes: b.maxIO, IOWindow: *window, Lookahead: *lookahead,
		WakeInterval: *kickUs, PollTimeout: *pollTimeout,
		EnqueueLayers: *enqueueLayers, EnqueueChunk: *enqueueChunk,
		WakeBatch: *kickBatch, WakeRamp: *kickRamp, BatchWait: *kickBatchWait}
	b.kopts = kernels.BenchOptions{NoFixedBuffers: *plainReads, ZeroCopyScatter: *zeroCopy, LooseWakeTarget: !*kickExact}
	b.kickDefer = *kickDefer
	b.r, err = kernels.BindBench(b.kcfg, b.kopts)
	if err != nil {
		return err
	}
	defer b.r.Close()
	defer func() {
		if b.rk != nil {
			b.rk.Close()
			b.ringK.Close()
		}
	}()

	var rounds [][]benchRow
	dest := b.ceilingDestBytes()
	paths := kernelPaths
	for k := 0; k < *nRounds; k++ {
		sum, cnote, cached, cachedNote := 0.0, "(skipped)", 0.0, "(skipped)"
		if !*noCeiling {
			cached, cachedNote = b.ceiling(0)
			sum, cnote = b.ceiling(dest)
		}
		fmt.Fprintf(stdout, "round %d of %d: sum of the devices' ceilings (devbench.CeilingEachInto: 1 MiB O_DIRECT random reads, QD 32, uring, 2 s, all devices at once, into %d MiB per device, the staging pool's share): %.2f GB/s %s; into devbench's 32 MiB per device (cache-resident): %.2f GB/s %s\n",
			k+1, *nRounds, dest>>20, sum/1e9, cnote, cached/1e9, cachedNote)
		// The paths run in roundOrder's order, so that no path always runs
		// first or right after another; each is bracketed
		// by striped ceiling samples, and its fraction is taken against
		// their mean, so that a drift of the host between samples (up to
		// 30 % within a minute on the GPU machine's loop devices) splits
		// evenly.
		rows := make([]benchRow, len(paths))
		before, bnote := b.stripedCeiling(dest, *noCeiling)
		b.logf("  striped ceiling %s\n", bnote)
		for j, i := range roundOrder(len(paths), k) {
			row := b.runPath(strings.TrimSpace(paths[i]))
			row.position = j
			after, anote := b.stripedCeiling(dest, *noCeiling)
			ceiling := meanPositive(before, after)
			row.Storage, row.Model = b.label, b.model
			row.CeilingBytesPS, row.CeilingSumBytesPS, row.CeilingCachedBytesPS = ceiling, sum, cached
			row.Stripe, row.RunPages = b.lay.stripe, b.lay.jsonRunPages()
			if row.BytesPerS > 0 {
				if ceiling > 0 {
					row.CeilingFraction = row.BytesPerS / ceiling
				}
				if sum > 0 {
					row.CeilingSumFraction = row.BytesPerS / sum
				}
			}
			rows[i] = row
			b.logf("  %-26s %s\n", row.Path, rowSummary(row))
			b.logf("  striped ceiling %s\n", anote)
			before = after
		}
		rounds = append(rounds, rows)
	}
	rows, err := mergeRounds(rounds)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "median of %d rounds (x ceil: the median of each restore's bytes/s over the striped ceiling sampled around it; x sum: over its round's sum of the devices' ceilings):\n", *nRounds)
	printTable(stdout, rows)
	if err := writeJSONLines(*jsonPath, stdout, rows); err != nil {
		return err
	}
	for _, r := range rows {
		if r.Mismatches != 0 {
			return fmt.Errorf("path %s: %d mismatched words", r.Path, r.Mismatches)
		}
	}
	if len(storePaths) > 0 {
		return runStoreRows(sf, storePaths, stdout, stderr)
	}
	return nil
}

func rowSummary(r benchRow) string {
	if r.Error != "" && r.Bytes == 0 {
		return "error: " + r.Error
	}
	return fmt.Sprintf("%.2f GB/s (%.2f of the striped ceiling, %.2f of the sum), %.3f CPU s/GiB, %d I/Os, %d mismatches, %d io-wq workers (%.1f ms) %s",
		r.BytesPerS/1e9, r.CeilingFraction, r.CeilingSumFraction, r.CPUSPerGiB, r.IOs, r.Mismatches, r.IOWQWorkers, r.IOWQCPUS*1e3, r.Note)
}

func printTable(w io.Writer, rows []benchRow) {
	fmt.Fprintf(w, "%-28s %9s %8s %8s %10s %9s %9s %9s %9s %s\n", "path", "GB/s", "x ceil", "x sum", "CPU s/GiB", "I/Os", "mismatch", "layer p50", "layer max", "note")
	for _, r := range rows {
		if r.Error != "" {
			e := r.Error
			if len(e) > 400 {
				e = e[:400] + "..."
			}
			fmt.Fprintf(w, "%-28s FAILED (%d mismatched words, pages not restored keep the poison): %s\n", r.Path, r.Mismatches, strings.ReplaceAll(e, "\n", " | "))
			continue
		}
		fmt.Fprintf(w, "%-28s %9.2f %8.3f %8.3f %10.4f %9d %9d %8.2fms %8.2fms %s\n", r.Path, r.BytesPerS/1e9, r.CeilingFraction, r.CeilingSumFraction, r.CPUSPerGiB, r.IOs, r.Mismatches, r.LayerMsP50, r.LayerMsMax, r.Note)
	}
}

// writeData writes every layer's object with internal/kvdata content where
// b.lay places its pieces, through the page cache (so the page-cache path
// later reads warm data), then fsyncs. A regular file is cut to the bytes
// its device holds; with reuse, files of exactly those bytes whose
// sidecar (path+".layout") names this model, content and layout are kept.
func (b *gpuBench) writeData(reuse bool) error {
	t0 := time.Now()
	need := b.lay.devBytes()
	fresh := !reuse
	var regular []bool
	for i, p := range b.paths {
		st, err := os.Stat(p)
		isDev := err == nil && st.Mode()&os.ModeDevice != 0
		isReg := err != nil || st.Mode().IsRegular()
		regular = append(regular, isReg)
		if !isReg || err != nil || st.Size() != need[i] {
			fresh = true
		} else if key, kerr := os.ReadFile(p + ".layout"); kerr != nil || string(key) != b.layoutKey(i) {
			fresh = true
		}
		flags := unix.O_RDWR
		if !isDev {
			flags |= unix.O_CREAT
		}
		bf, err := uring.OpenFile(p, flags, 0o644)
		if err != nil {
			return err
		}
		df, err := uring.OpenFile(p, unix.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			bf.Close()
			return err
		}
		b.buffered = append(b.buffered, bf)
		b.direct = append(b.direct, df)
	}
	if !fresh {
		b.logf("reusing %v\n", b.paths)
		return nil
	}
	for i, p := range b.paths {
		if !regular[i] {
			continue
		}
		// the sidecar goes first and comes back last: a file cut short by a
		// crash is never reused
		if err := os.Remove(p + ".layout"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := unix.Ftruncate(int(b.buffered[i].FD), need[i]); err != nil {
			return fmt.Errorf("sizing %s to %d bytes: %w", p, need[i], err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, b.g.Layers)
	work := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf, err := uring.AllocBuffer(int(b.lay.objStride(b.lay.runPages))) // the first piece is the largest
			if err != nil {
				errs <- err
				return
			}
			defer buf.Free()
			var ps []layoutPiece
			for l := range work {
				ps = b.lay.pieces(l, ps[:0])
				for _, pc := range ps {
					n, padded := int64(pc.pages)*b.g.PageBytesPerLayer(), b.lay.objStride(pc.pages)
					if err := testkit.FillObject(buf.Bytes()[:n], b.g, b.seed, l, pc.first, pc.pages); err != nil {
						errs <- err
						return
					}
					clear(buf.Bytes()[n:padded]) // a longer piece's bytes before
					f := b.buffered[pc.dev]
					if got, err := unix.Pwrite(int(f.FD), buf.Bytes()[:padded], pc.off); err != nil || int64(got) != padded {
						errs <- fmt.Errorf("writing layer %d pages [%d,+%d) at %d of %s: %d of %d bytes: %v", l, pc.first, pc.pages, pc.off, f.Path, got, padded, err)
						return
					}
				}
			}
		}()
	}
	for l := 0; l < b.g.Layers; l++ {
		work <- l
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	for _, f := range b.buffered {
		if err := unix.Fsync(int(f.FD)); err != nil {
			return fmt.Errorf("fsync %s: %w", f.Path, err)
		}
	}
	for i, p := range b.paths {
		if regular[i] {
			if err := os.WriteFile(p+".layout", []byte(b.layoutKey(i)), 0o644); err != nil {
				return err
			}
		}
	}
	d := time.Since(t0)
	b.logf("wrote %.2f GiB in %.1f s (%.2f GB/s, buffered + fsync)\n", float64(b.totalBytes())/(1<<30), d.Seconds(), float64(b.totalBytes())/d.Seconds()/1e9)
	return nil
}

// layoutKey names what device i of the data files holds: --reuse keeps a
// file only when its sidecar says exactly this.
func (b *gpuBench) layoutKey(i int) string {
	return fmt.Sprintf("tutti gpubench data v1: model %s, %+v, %d pages, content blocks %d.., device %d of %d, %s\n",
		b.model, b.g, b.pages, b.seed, i, len(b.paths), b.lay)
}

func (b *gpuBench) closeFiles() {
	for _, f := range append(b.direct, b.buffered...) {
		f.Close()
	}
}

// ceiling is devbench's ceiling of each device, measured at the same time
// on all of them (each its own ring: devbench.CeilingEachInto), summed: the
// aggregate the striped storage delivers to raw large O_DIRECT reads. Each
// device's reads stay within the whole MiBs of the data it holds, and land
// in destBytes of memory per device (devbench.CeilingInto; 0: devbench's
// one block per read in flight, 32 MiB).
func (b *gpuBench) ceiling(destBytes int64) (float64, string) {
	rows, errs := devbench.CeilingEachInto(context.Background(), b.paths, b.ceilingSizes(), destBytes)
	var sum float64
	var notes []string
	small := 0
	for i, p := range b.paths {
		if errs[i] != nil {
			notes = append(notes, errs[i].Error())
			continue
		}
		sum += rows[i].BytesPerS
		notes = append(notes, fmt.Sprintf("%s %.2f", filepath.Base(p), rows[i].BytesPerS/1e9))
		if !rows[i].BufferHuge {
			small++
		}
	}
	if small > 0 {
		// 1 MiB reads into 4 KiB pages are split by many devices: a low
		// ceiling, which must not pass unnoticed.
		notes = append(notes, fmt.Sprintf("%d of %d destinations NOT on huge pages", small, len(b.paths)))
	}
	return sum, "(" + strings.Join(notes, ", ") + ")"
}

// stripedCeiling is devbench.CeilingStriped over the devices: each reads
// the bytes of the prefix it holds, into destBytes of memory, and the
// aggregate is timed to the slowest device. It returns bytes/s (0 when
// skipped or failed) and a note for the log.
func (b *gpuBench) stripedCeiling(destBytes int64, skip bool) (float64, string) {
	if skip {
		return 0, "(skipped)"
	}
	sizes := b.ceilingSizes()
	st, err := devbench.CeilingStriped(context.Background(), b.paths, sizes, sizes, destBytes)
	if err != nil {
		return 0, "FAILED: " + err.Error()
	}
	var notes []string
	for i, p := range b.paths {
		notes = append(notes, fmt.Sprintf("%s %.2f in %.0f ms", filepath.Base(p), st.Devices[i].BytesPerS/1e9, st.Devices[i].Seconds*1e3))
	}
	return st.BytesPerS, fmt.Sprintf("%.2f GB/s (each device its share of the prefix, timed to the slowest; %s; the devices' own rates sum to %.2f)",
		st.BytesPerS/1e9, strings.Join(notes, ", "), st.SumBytesPerS/1e9)
}

// ceilingSizes are the bytes the ceilings read on each device: the whole
// MiBs of the data written there (lay.devBytes).
func (b *gpuBench) ceilingSizes() []int64 {
	sizes := b.lay.devBytes()
	for i := range sizes {
		sizes[i] = sizes[i] / (1 << 20) * (1 << 20)
	}
	return sizes
}

// meanPositive is the mean of the positive ones of a and b (0 if neither).
func meanPositive(a, b float64) float64 {
	switch {
	case a > 0 && b > 0:
		return (a + b) / 2
	case a > 0:
		return a
	}
	return max(b, 0)
}

// ceilingDestBytes is each device's destination for the ceiling: its share
// of the staging pool the restore paths read into, in whole MiBs, 32 MiB to
// 1 GiB, so that the ceiling reads into memory as a restore does (devbench's
// own 32 MiB per device fits in a large last-level cache: 300 MiB on the
// H200 machine). On its loop devices the 32 MiB ceiling was a median 11 %
// and 15 % higher on two machines and equal on a third (BENCHMARKS.md,
// kernels, Session 5); both are reported.
func (b *gpuBench) ceilingDestBytes() int64 {
	per := int64(b.r.Staging().Len()) / int64(len(b.paths)) / (1 << 20) * (1 << 20)
	return min(max(per, 32<<20), 1<<30)
}

type cpuMark struct {
	ru      time.Duration
	sqpoll  time.Duration
	t       time.Time
	threads threadCPU // start only: each thread's CPU, read before the clock starts
}

// start marks a path's start: the threads' CPU first (reading them is not
// timed), then mark.
func (b *gpuBench) start() cpuMark {
	th := readThreadCPU()
	m := b.mark()
	m.threads = th
	return m
}

func (b *gpuBench) mark() cpuMark {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	m := cpuMark{ru: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), t: time.Now()}
	if s, err := b.ring.SQPollCPUTime(); err == nil {
		m.sqpoll = s
	}
	return m
}

// finish fills the timing and CPU columns. Process rusage includes the
// SQPOLL thread on Linux 6.18 (uring's TestSQPollCPUTimeInRusage), so it is
// not added again; its share is reported on its own.
//
// It returns the threads' CPU read after the clock stopped (for a path that
// reports them).
func (b *gpuBench) finish(row *benchRow, m0 cpuMark, ios int64) threadCPU {
	m1 := b.mark()
	row.Bytes = b.totalBytes()
	row.Seconds = m1.t.Sub(m0.t).Seconds()
	row.BytesPerS = float64(row.Bytes) / row.Seconds
	gib := float64(row.Bytes) / (1 << 30)
	row.CPUSPerGiB = (m1.ru - m0.ru).Seconds() / gib
	row.SQPollCPUS = (m1.sqpoll - m0.sqpoll).Seconds()
	row.IOs = ios
	threads := readThreadCPU()
	n, cpu := ioWQDelta(m0.threads, threads)
	row.IOWQWorkers, row.IOWQCPUS = n, cpu.Seconds()
	return threads
}

func layerStats(row *benchRow, doneMs []float64) {
	if len(doneMs) == 0 {
		return
	}
	row.FirstLayerMs = doneMs[0]
	var iv []float64
	for i := 1; i < len(doneMs); i++ {
		iv = append(iv, doneMs[i]-doneMs[i-1])
	}
	if len(iv) == 0 {
		return
	}
	sort.Float64s(iv)
	row.LayerMsP50 = iv[len(iv)/2]
	row.LayerMsMax = iv[len(iv)-1]
}

func (b *gpuBench) runPath(p string) benchRow {
	row := benchRow{Path: p}
	if err := testkit.FillKV(b.r, 0xA5); err != nil { // poison: stale bytes can never pass
		row.Error = err.Error()
		return row
	}
	var err error
	verify := true // every path restores into the KV tensors but the diagnostic
	switch p {
	case "gpu":
		row.Path = "gpu-driven (SQPOLL)"
		err = b.runGPU(&row, b.r)
	case "gpu-kick":
		row.Path = "gpu-driven (kick, no SQPOLL)"
		if b.rk == nil {
			err = b.bindKick()
		}
		if err == nil {
			err = b.runGPU(&row, b.rk)
		}
	case "uring":
		row.Path = "(a) uring -> staging -> scatter"
		err = b.runHost(&row, false, true)
	case "per-block":
		row.Path = "(b) per-block (page x layer)"
		err = b.runHost(&row, true, true)
	case "uring-staging-only":
		// Diagnostic: path (a)'s reads, in its order and pacing, with no
		// copy to HBM. Next to (a) and the ceiling it says what the copies
		// over PCIe cost the reads where the devices are host memory.
		row.Path = "(a0) uring -> staging only"
		row.Note = "diagnostic: no copy to HBM, nothing to verify"
		verify = false
		err = b.runHost(&row, false, false)
	case "cufile":
		row.Path = "(c) cufile batch"
		err = b.runCuFile(&row)
	case "cufile-compat":
		row.Path = "(c') cufile-compat (posix bounce)"
		err = b.runPread(&row, b.direct, 8)
	case "page-cache":
		row.Path = "(d) page cache (buffered pread)"
		err = b.runPread(&row, b.buffered, 8)
	case "dram":
		row.Path = "(e) DRAM (pinned host copy)"
		err = b.runDRAM(&row)
	default:
		err = fmt.Errorf("unknown path %q", p)
	}
	if err != nil {
		row.Error = err.Error()
	}
	if row.Bytes > 0 && verify {
		bad, verr := testkit.VerifyKV(b.r, b.seed, b.pm, 0, b.g.Layers)
		if verr != nil {
			row.Error = strings.TrimSpace(row.Error + " verify: " + verr.Error())
		}
		row.Mismatches = bad
	}
	if row.Error != "" {
		row.BytesPerS = 0 // a failed restore has no throughput
	}
	return row
}

// gpuRequest is the whole prefix as one restore: one extent per piece of
// each layer (b.lay), read through the devices' O_DIRECT files.
func (b *gpuBench) gpuRequest() kernels.Request {
	req := kernels.Request{Pages: b.dst}
	var ps []layoutPiece
	for l := 0; l < b.g.Layers; l++ {
		ps = b.lay.pieces(l, ps[:0])
		xs := make([]kernels.Extent, 0, len(ps))
		for _, pc := range ps {
			f := b.direct[pc.dev]
			xs = append(xs, kernels.Extent{FD: f.FD, Align: f.DirectAlign, Offset: pc.off, Pages: pc.pages})
		}
		req.Layers = append(req.Layers, xs)
	}
	return req
}

// runGPU restores the whole prefix with the GPU driving the ring.
func (b *gpuBench) runGPU(row *benchRow, r *kernels.Restorer) error {
	req := b.gpuRequest()
	wakes0, timeouts0, batch0 := r.Wakeups(), r.WakeTimeouts(), r.BatchTimeouts()
	m0 := b.start()
	x, err := r.Restore(req)
	if err != nil {
		return err
	}
	res, err := x.Wait()
	threads1 := b.finish(row, m0, 0)
	x.Release()
	if res != nil {
		row.IOs = int64(len(res.Entries))
		ms := make([]float64, len(res.LayerMs))
		for i, v := range res.LayerMs {
			ms[i] = float64(v)
		}
		layerStats(row, ms)
	}
	if err != nil {
		b.dumpThreads()
	}
	if r == b.r {
		row.Note = fmt.Sprintf("sqpoll thread %.2f s, %d wake-ups", row.SQPollCPUS, r.Wakeups()-wakes0)
	} else {
		row.Note = fmt.Sprintf("%d kicks, %d on the timeout, %d of them the whole batch wait (%s)", r.Wakeups()-wakes0, r.WakeTimeouts()-timeouts0, r.BatchTimeouts()-batch0, r.HelperMode())
	}
	if d := threadCPUDelta(m0.threads, threads1, r.HelperTID()); d != "" {
		row.Note += ", threads: " + d
	}
	if herr := r.HelperErr(); herr != nil {
		row.Note += ", helper: " + herr.Error()
	}
	switch fixed, ferr := r.FixedBuffers(); {
	case fixed:
		row.Note += ", READ_FIXED into registered staging"
		switch st := r.Staging(); {
		case !st.Huge():
			row.Note += " (4 KiB pages: no transparent huge pages)"
		case !st.HugeNow():
			row.Note += " (huge pages at allocation, no longer all huge after registration)"
		}
	case ferr != nil:
		row.Note += ", plain reads: " + ferr.Error() // asked for, refused: reported, not hidden
	default:
		row.Note += ", plain reads (--no-fixed-buffers)"
	}
	return err
}

// dumpThreads prints where this process's io_uring threads (iou-sqp, iou-wrk)
// and blocked threads sleep in the kernel (/proc/self/task/*/stack, root
// only): the evidence when a GPU-driven restore times out.
func (b *gpuBench) dumpThreads() {
	tasks, _ := filepath.Glob("/proc/self/task/*")
	for _, t := range tasks {
		comm, _ := os.ReadFile(filepath.Join(t, "comm"))
		stat, _ := os.ReadFile(filepath.Join(t, "stat"))
		state := ""
		if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && len(stat) > i+2 {
			state = string(stat[i+2 : i+3])
		}
		name := strings.TrimSpace(string(comm))
		wchan, _ := os.ReadFile(filepath.Join(t, "wchan"))
		stack, _ := os.ReadFile(filepath.Join(t, "stack"))
		if !strings.HasPrefix(name, "iou-") && state != "D" && !strings.Contains(string(stack), "io_uring") {
			continue
		}
		b.logf("thread %s %s state %s wchan %s\n%s", filepath.Base(t), name, state, wchan, stack)
	}
}

// bindKick binds a second context on the same KV tensors with a ring that
// has no SQPOLL thread: the CPU helper submits in batches, woken by completions.
func (b *gpuBench) bindKick() error {
	base := uring.Config{Entries: b.ringEntries, SQThreadCPU: -1, NoMmap: true}
	var ring *uring.Ring
	var err error
	if b.kickDefer {
		var fallback string
		ring, fallback, err = kernels.NewKickRing(base)
		if fallback != "" {
			b.logf("GPU kick ring: %s\n", fallback)
		}
	} else {
		ring, err = uring.New(base)
	}
	if err != nil {
		return err
	}
	cfg := b.kcfg
	cfg.Ring = ring
	b.rk, err = kernels.BindBench(cfg, b.kopts)
	if err != nil {
		ring.Close()
		return err
	}
	b.ringK = ring
	return nil
}

// hostIO is one CPU-issued read of the host paths.
type hostIO struct {
	layer int
	dev   int
	off   int64
	len   int
	slot  int64 // where the read lands in the layer's slot (direct), or -1: bounce
	copyN int   // bounce: bytes to copy
	skip  int   // bounce: bytes to skip at the start of the read
	dstAt int64 // bounce: destination offset in the layer's slot
}

// hostReads are the reads of the host uring paths, layer-major: each
// piece of a layer's object in reads of up to max-io bytes (path a), or one
// read per (layer, page) at the page's place in its piece (path b; a page
// not on 4 KiB boundaries is read whole blocks into a bounce buffer and
// copied). Either way the layer's slot ends up as b.pm describes it.
func (b *gpuBench) hostReads(perBlock bool) []hostIO {
	pb := b.g.PageBytesPerLayer()
	offs, _ := b.lay.slotOffsets()
	var ios []hostIO
	var rs []objRead
	var ps []layoutPiece
	for l := 0; l < b.g.Layers; l++ {
		if !perBlock {
			rs = b.lay.reads(l, int64(b.maxIO), true, rs[:0])
			for _, r := range rs {
				ios = append(ios, hostIO{layer: l, dev: r.dev, off: r.off, len: r.len, slot: r.slot})
			}
			continue
		}
		ps = b.lay.pieces(l, ps[:0])
		for k, pc := range ps {
			for j := 0; j < pc.pages; j++ {
				off, slot := pc.off+int64(j)*pb, offs[k]+int64(j)*pb
				lo, hi := off/4096*4096, (off+pb+4095)/4096*4096
				if lo == off && hi == off+pb {
					ios = append(ios, hostIO{layer: l, dev: pc.dev, off: off, len: int(pb), slot: slot})
				} else {
					ios = append(ios, hostIO{layer: l, dev: pc.dev, off: lo, len: int(hi - lo), slot: -1, copyN: int(pb), skip: int(off - lo), dstAt: slot})
				}
			}
		}
	}
	return ios
}

// runHost restores through a Go uring.Ring (no SQPOLL): object reads of up to
// max-io bytes (path a) or one read per (layer, page) (path b, as a per-page
// offload connector does), into the pinned staging pool, each layer scattered
// as soon as its reads completed while later layers are read. Without toHBM
// (the diagnostic uring-staging-only) the layers are read and not copied.
func (b *gpuBench) runHost(row *benchRow, perBlock, toHBM bool) error {
	ios := b.hostReads(perBlock)
	eng, err := uring.New(uring.Config{Entries: uint32(b.qd), SQThreadCPU: -1})
	if err != nil {
		return err
	}
	defer eng.Close()
	bounce, err := b.allocBounce()
	if err != nil {
		return err
	}
	defer bounce.Free()
	m0 := b.start()
	done, err := b.hostPipeline(ios, bounce, toHBM, func(io *hostIO, dst uintptr, c *uring.Completion) error {
		c.PrepRead(b.direct[io.dev], dst, uint32(io.len), uint64(io.off))
		return eng.Submit(c)
	}, func(wait int) error { return eng.Flush(wait) })
	b.finish(row, m0, int64(len(ios)))
	layerStats(row, done)
	return err
}

// bounceSlotBytes is one O_DIRECT-aligned bounce slot: a page's read with
// the alignment slack either side.
func (b *gpuBench) bounceSlotBytes() int {
	return int((b.g.PageBytesPerLayer() + 8192 + 4095) / 4096 * 4096)
}

// allocBounce allocates hostPipeline's bounce slots (qd of them) before a
// path's clock starts: setup that the GPU path does at bind time is not
// timed for the host paths either. The caller frees it.
func (b *gpuBench) allocBounce() (*uring.Buffer, error) {
	return uring.AllocBuffer(b.qd * b.bounceSlotBytes())
}

// hostPipeline runs ios (layer-major) with at most qd in flight through
// submit/flush, into staging slot layer%slots, and scatters each layer when
// it is complete; a slot is reused only after its scatter finished. Without
// toHBM nothing is copied or scattered: a layer is done when its reads are.
// Reads not aligned for O_DIRECT land in bounce (qd slots of
// bounceSlotBytes, from allocBounce) and are copied into the slot. It
// returns each layer's completion time (ms from start).
func (b *gpuBench) hostPipeline(ios []hostIO, bounce *uring.Buffer, toHBM bool, submit func(io *hostIO, dst uintptr, c *uring.Completion) error, flush func(int) error) ([]float64, error) {
	st := b.r.Staging()
	lim := b.r.Limits()
	slots := st.Len() / int(lim.SlotBytes)
	slotAddr := func(l int) uintptr { return st.Addr() + uintptr(int64(l%slots)*lim.SlotBytes) }
	if err := b.r.SetHostMap(b.pm); err != nil {
		return nil, err
	}
	perLayer := make([]int, b.g.Layers)
	for _, io := range ios {
		perLayer[io.layer]++
	}
	doneIn := make([]int, b.g.Layers)
	comps := make([]uring.Completion, b.qd)
	bsz := b.bounceSlotBytes()
	free := make([]int, 0, b.qd)
	for i := range comps {
		free = append(free, i)
	}
	var firstErr error
	for i := range comps {
		comps[i].UserData = uint64(i)
		comps[i].Callback = func(c *uring.Completion) {
			k := int(c.UserData)
			io := c.Context.(*hostIO)
			if c.Err != nil && firstErr == nil {
				firstErr = c.Err
			} else if c.Result != int64(io.len) && firstErr == nil {
				firstErr = fmt.Errorf("short read at %d: %d of %d bytes", io.off, c.Result, io.len)
			}
			if io.slot < 0 {
				src := bounce.Bytes()[k*bsz:]
				at := int64(io.layer%slots)*lim.SlotBytes + io.dstAt
				copy(st.Bytes()[at:at+int64(io.copyN)], src[io.skip:io.skip+io.copyN])
			}
			doneIn[io.layer]++
			free = append(free, k)
		}
	}
	t0 := time.Now()
	var doneMs []float64
	next, scattered, inflight := 0, 0, 0
	waited := make([]bool, b.g.Layers)
	for scattered < b.g.Layers {
		for next < len(ios) && len(free) > 0 {
			io := &ios[next]
			if io.layer-scattered >= slots {
				break // its slot still holds a layer waiting to be scattered
			}
			if toHBM && io.layer >= slots && !waited[io.layer] {
				if err := b.r.WaitCopy(io.layer % slots); err != nil {
					return doneMs, err
				}
				waited[io.layer] = true
			}
			k := free[len(free)-1]
			free = free[:len(free)-1]
			c := &comps[k]
			c.Context = io
			dst := slotAddr(io.layer) + uintptr(io.slot)
			if io.slot < 0 {
				dst = bounce.Addr() + uintptr(k*bsz)
			}
			if err := submit(io, dst, c); err != nil {
				return doneMs, err
			}
			next++
			inflight++
		}
		if inflight > 0 {
			before := len(free)
			if err := flush(1); err != nil {
				return doneMs, err
			}
			inflight -= len(free) - before
		}
		if firstErr != nil {
			return doneMs, firstErr
		}
		for scattered < b.g.Layers && doneIn[scattered] == perLayer[scattered] {
			l := scattered
			if toHBM {
				if err := b.r.ScatterHost(l, slotAddr(l), lim.SlotBytes); err != nil {
					return doneMs, err
				}
				if err := b.r.RecordCopy(l % slots); err != nil {
					return doneMs, err
				}
			}
			doneMs = append(doneMs, float64(time.Since(t0).Microseconds())/1e3)
			scattered++
		}
	}
	return doneMs, b.r.SyncCopies()
}

// runPread: workers pread each layer's object (each piece up to max-io a
// call) into the staging slot, then the layer is scattered; layers go one
// after another, as cuFile's compat mode does a cuFileRead (O_DIRECT files)
// — and as a page cache read does (buffered files).
func (b *gpuBench) runPread(row *benchRow, files []*uring.File, workers int) error {
	st := b.r.Staging()
	lim := b.r.Limits()
	slots := st.Len() / int(lim.SlotBytes)
	if err := b.r.SetHostMap(b.pm); err != nil {
		return err
	}
	// The reads are planned before the clock starts, as the other paths'
	// are. O_DIRECT files read whole 4 KiB blocks, buffered ones the bytes.
	layerReads := make([][]objRead, b.g.Layers)
	for l := range layerReads {
		layerReads[l] = b.lay.reads(l, int64(b.maxIO), files[0].DirectAlign != 0, nil)
	}
	var ios int64
	var doneMs []float64
	m0 := b.start()
	for l, rs := range layerReads {
		if l >= slots {
			if err := b.r.WaitCopy(l % slots); err != nil {
				return err
			}
		}
		slot := st.Addr() + uintptr(int64(l%slots)*lim.SlotBytes)
		if err := preadLayer(files, slot, rs, workers); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
		ios += int64(len(rs))
		if err := b.r.ScatterHost(l, slot, lim.SlotBytes); err != nil {
			return err
		}
		if err := b.r.RecordCopy(l % slots); err != nil {
			return err
		}
		doneMs = append(doneMs, float64(time.Since(m0.t).Microseconds())/1e3)
	}
	if err := b.r.SyncCopies(); err != nil {
		return err
	}
	b.finish(row, m0, ios)
	layerStats(row, doneMs)
	return nil
}

// preadLayer runs reads with pread(2) from workers goroutines, read r from
// files[r.dev] into slot+r.slot (off-heap memory the caller owns, at least
// as long as the reads reach). A read that returns fewer than its need
// bytes is an error; the first error is returned once all workers stopped.
func preadLayer(files []*uring.File, slot uintptr, rs []objRead, workers int) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ferr error
	next := 0
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				c := next
				next++
				stop := ferr != nil
				mu.Unlock()
				if stop || c >= len(rs) {
					return
				}
				r := rs[c]
				f := files[r.dev]
				got, err := uring.Pread(f, slot+uintptr(r.slot), uint32(r.len), uint64(r.off))
				if err == nil && got < r.need {
					err = fmt.Errorf("short read at %d of %s: %d of %d bytes", r.off, f.Path, got, r.len)
				}
				if err != nil {
					mu.Lock()
					if ferr == nil {
						ferr = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return ferr
}

// cufileBatch is one CuFileBatchRead: reads of one device's file into the
// layer's device buffer.
type cufileBatch struct {
	dev     int
	fileOff []uint64
	dstOff  []uint64
	lens    []uint32
}

// cufileBatches are layer l's reads (each piece up to max-io a read, whole
// 4 KiB blocks) grouped by device, devices in the order of their first
// piece: cuFile's batch takes one file per call.
func (b *gpuBench) cufileBatches(l int) []cufileBatch {
	var out []cufileBatch
	at := map[int]int{}
	for _, r := range b.lay.reads(l, int64(b.maxIO), true, nil) {
		i, ok := at[r.dev]
		if !ok {
			i = len(out)
			at[r.dev] = i
			out = append(out, cufileBatch{dev: r.dev})
		}
		c := &out[i]
		c.fileOff = append(c.fileOff, uint64(r.off))
		c.dstOff = append(c.dstOff, uint64(r.slot))
		c.lens = append(c.lens, uint32(r.len))
	}
	return out
}

// runCuFile tries the real cuFile path: driver open, handle registration,
// batch reads into a device buffer (one batch per device holding pieces of
// the layer, one after another), scatter. Where cuFile refuses the
// storage (5027 on a virtio disk) the row says so and carries no numbers.
func (b *gpuBench) runCuFile(row *benchRow) error {
	for _, p := range b.paths {
		code, err := testkit.CuFileProbe(p)
		if err != nil {
			row.Note = fmt.Sprintf("cuFile error %d", code)
			return fmt.Errorf("cuFile refused %s (error %d): %w", p, code, err)
		}
	}
	_, bufBytes := b.lay.slotOffsets()
	buf, err := kernels.DevAlloc(bufBytes)
	if err != nil {
		return err
	}
	defer kernels.DevFree(buf)
	if err := b.r.SetHostMap(b.pm); err != nil {
		return err
	}
	batches := make([][]cufileBatch, b.g.Layers) // planned before the clock starts
	for l := range batches {
		batches[l] = b.cufileBatches(l)
	}
	var ios int64
	m0 := b.start()
	for l, bs := range batches {
		for _, c := range bs {
			if err := testkit.CuFileBatchRead(b.paths[c.dev], c.fileOff, c.dstOff, c.lens, buf, bufBytes); err != nil {
				return err
			}
			ios += int64(len(c.lens))
		}
		if err := b.r.ScatterDevice(l, buf, bufBytes); err != nil {
			return err
		}
		if err := b.r.SyncCopies(); err != nil {
			return err
		}
	}
	b.finish(row, m0, ios)
	return nil
}

// fillSlot writes layer l's object into dst as a staging slot holds it
// after the reads (b.pm's places, zeroed padding): dst is the slot bytes
// of b.lay.slotOffsets.
func (b *gpuBench) fillSlot(dst []byte, l int) error {
	offs, used := b.lay.slotOffsets()
	clear(dst[:used])
	for k, pc := range b.lay.pieces(l, nil) {
		if err := testkit.FillObject(dst[offs[k]:], b.g, b.seed, l, pc.first, pc.pages); err != nil {
			return err
		}
	}
	return nil
}

// runDRAM: the prefix already sits in pinned host memory (a DRAM tier),
// each layer as a staging slot would hold it after the reads (fillSlot);
// only the scatter into HBM is timed: the upper bound of any storage path.
func (b *gpuBench) runDRAM(row *benchRow) error {
	_, stride := b.lay.slotOffsets()
	total := stride * int64(b.g.Layers)
	buf, err := uring.AllocBuffer(int(total))
	if err != nil {
		return err
	}
	defer buf.Free()
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := w; l < b.g.Layers && errs[w] == nil; l += 16 {
				errs[w] = b.fillSlot(buf.Bytes()[int64(l)*stride:int64(l+1)*stride], l)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := kernels.HostRegister(buf.Addr(), total); err != nil {
		return err
	}
	defer kernels.HostUnregister(buf.Addr())
	if err := b.r.SetHostMap(b.pm); err != nil {
		return err
	}
	m0 := b.start()
	for l := 0; l < b.g.Layers; l++ {
		if err := b.r.ScatterHost(l, buf.Addr()+uintptr(int64(l)*stride), stride); err != nil {
			return err
		}
	}
	if err := b.r.SyncCopies(); err != nil {
		return err
	}
	b.finish(row, m0, 0)
	return nil
}

// writeJSONLines writes rows as JSON, one per line, to path ("-": stdout;
// "": nowhere): gpubench's --json.
func writeJSONLines[T any](path string, stdout io.Writer, rows []T) error {
	return writeJSONRows(path, stdout, rows, false)
}

// writeJSONRows is writeJSONLines, appending to the file when appendTo.
func writeJSONRows[T any](path string, stdout io.Writer, rows []T, appendTo bool) error {
	if path == "" {
		return nil
	}
	w := stdout
	if path != "-" {
		flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
		if appendTo {
			flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
		}
		f, err := os.OpenFile(path, flags, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	enc := json.NewEncoder(w)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
