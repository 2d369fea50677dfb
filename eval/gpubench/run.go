package gpubench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Config is what one `tutti gpubench` call measures: its flags, parsed.
// The CLI's help text says what each one means; the zero value of a
// sizing field (Window, MaxIO, Lookahead, RunPages, EnqueueLayers,
// EnqueueChunk, KickRamp) picks the default sized to the devices.
type Config struct {
	Model     string
	Tokens    int
	Dir       string // data file directory (comma-separated for GPUs > 1)
	Devices   string // comma-separated files or block devices (overrides Dir)
	Stripe    string // StripeRuns, StripeRunsOneDevice or StripeLayers
	RunPages  int
	Label     string
	JSONPath  string // "-": stdout; "": none
	Paths     string // comma-separated, in order
	StoreDirs string // store-gpu/store-cpu directories (default: Dir)
	MaxIO     int
	QD        int
	Window    int
	Lookahead int

	SQPollIdleMs uint
	Layout       string // per-layer or cross-layer
	WakeInterval time.Duration
	Seed         uint64
	NoCeiling    bool
	WritePool    bool // store rows: runtime.Config.WritePool
	Prewrite     bool // store rows: StoreConfig.Prewrite
	// StoreCeilingMem: store rows, StoreConfig.CeilingMemBytes.
	StoreCeilingMem int64
	// StoreStaging and StoreSaveWrites: store rows, StoreConfig.StagingBytes
	// and SaveWritesPerDevice.
	StoreStaging    int64
	StoreSaveWrites int
	Rounds          int // 1..MaxRounds
	Reuse           bool
	GPUs            int
	PollTimeout     time.Duration
	KickBatch       int
	KickRamp        int
	KickBatchWait   time.Duration
	KickExact       bool
	KickDefer       bool
	EnqueueLayers   int
	EnqueueChunk    int
	ZeroCopy        bool
	NoFixedBuffers  bool

	// Progress, if set, is told how far the data writing and the rounds'
	// paths are (the CLI passes line progress when stderr is no terminal).
	Progress func(phase string, done, total int)
}

// MaxRounds bounds Config.Rounds.
const MaxRounds = 20

// Run is `tutti gpubench`: the kernels-only paths of cfg.Paths over the
// devices (rounds, a table on stdout, --json rows), then the product paths
// (store-gpu, store-cpu) on the store directories; with GPUs > 1 the
// tensor-parallel restore instead. It fails on any verify mismatch. A
// cancelled ctx stops it between paths (and between the data file's
// layers), through the same cleanup as an error.
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) error {
	if cfg.Rounds < 1 || cfg.Rounds > MaxRounds {
		return fmt.Errorf("--rounds %d: want 1..%d", cfg.Rounds, MaxRounds)
	}
	if cfg.GPUs != 1 {
		if cfg.Stripe != StripeRuns || cfg.RunPages != 0 {
			return errors.New("--stripe and --run-pages apply to one GPU: with --gpus N the ranks' stores lay their runs out themselves")
		}
		return runGroupBenchCLI(ctx, cfg, stdout, stderr)
	}
	kernelPaths, storePaths := splitStorePaths(cfg.Paths)
	sf := storeFlags{model: cfg.Model, label: cfg.Label, dirs: cfg.StoreDirs, jsonPath: cfg.JSONPath, tokens: cfg.Tokens, rounds: cfg.Rounds, seed: cfg.Seed,
		noCeiling: cfg.NoCeiling, writePool: cfg.WritePool, prewrite: cfg.Prewrite, appendJSON: len(kernelPaths) > 0, progress: cfg.Progress,
		ceilingMem: cfg.StoreCeilingMem, staging: cfg.StoreStaging, saveWrites: cfg.StoreSaveWrites}
	if sf.dirs == "" {
		sf.dirs = cfg.Dir
	}
	if len(kernelPaths) > 0 {
		if err := runKernelPaths(ctx, cfg, kernelPaths, stdout, stderr); err != nil {
			return err
		}
	}
	if len(storePaths) > 0 || len(kernelPaths) == 0 {
		return runStoreRows(ctx, sf, storePaths, stdout, stderr)
	}
	return nil
}

// storeFlags are what the product-path rows (RunStore) take from
// gpubench's flags.
type storeFlags struct {
	model, label, dirs, jsonPath string
	tokens, rounds               int
	seed                         uint64
	noCeiling, appendJSON        bool
	writePool, prewrite          bool
	ceilingMem                   int64
	staging                      int64
	saveWrites                   int
	progress                     func(phase string, done, total int)
}

// splitStorePaths separates the product paths (store-gpu, store-cpu) from
// the kernels-only ones, keeping each list's order.
func splitStorePaths(list string) (kernelPaths, storePaths []string) {
	for _, p := range strings.Split(list, ",") {
		switch p = strings.TrimSpace(p); {
		case p == "":
		case IsStorePath(p):
			storePaths = append(storePaths, p)
		default:
			kernelPaths = append(kernelPaths, p)
		}
	}
	return kernelPaths, storePaths
}

// runStoreRows measures the product paths in f.rounds rounds and prints
// their table (the rounds' rows go to stderr as they come); with --json
// its rows go to the same file (appended after the kernels-only rows when
// those ran). Any mismatched word, summed over the rounds, fails it.
func runStoreRows(ctx context.Context, f storeFlags, paths []string, stdout, stderr io.Writer) error {
	if f.dirs == "" {
		return fmt.Errorf("--paths %s: need --store-dirs or --dir (directories on the devices' filesystems)", strings.Join(paths, ","))
	}
	cfg := StoreConfig{Model: f.model, Tokens: f.tokens, Dirs: strings.Split(f.dirs, ","), Label: f.label,
		Seed: f.seed, Paths: paths, Rounds: f.rounds, NoCeiling: f.noCeiling, WritePool: f.writePool, Prewrite: f.prewrite, Progress: f.progress,
		CeilingMemBytes: f.ceilingMem, StagingBytes: f.staging, SaveWritesPerDevice: f.saveWrites}
	if f.writePool && f.prewrite {
		return errors.New("--write-pool and --prewrite: one or the other (a written pool has nothing to prewrite)")
	}
	fmt.Fprintf(stdout, "gpubench product paths %v: %s, %d tokens, storage %q on %v, %d rounds, %s (runtime.Store Save timed to the commit, Load timed to Wait, every byte verified)\n",
		paths, f.model, f.tokens, f.label, cfg.Dirs, max(f.rounds, 1), poolNote(f.writePool, f.prewrite))
	rows, _, err := RunStore(ctx, cfg, stderr)
	printStoreTable(stdout, rows)
	if werr := writeJSONRows(f.jsonPath, stdout, rows, f.appendJSON); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return err
	}
	for _, r := range rows {
		if r.Mismatches != 0 {
			return fmt.Errorf("path %s %s: %d mismatched words over %d rounds", r.Path, r.Op, r.Mismatches, r.Rounds)
		}
	}
	return nil
}

// poolNote says how the rows' stores were created.
func poolNote(written, prewrite bool) string {
	switch {
	case written:
		return "each store's pool written with zeros at creation (--write-pool: the first save overwrites, as save-again does)"
	case prewrite:
		return "each store's pool fallocated and prewritten in the background before the first save (--prewrite: a store some time after its creation)"
	}
	return "each store's pool fallocated, not prewritten (its first save writes unwritten extents: a save right after the store's creation)"
}
