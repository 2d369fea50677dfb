package gpubench

// The kernels-only paths of gpubench: one GPU, its KV tensors and bound
// restorer allocated once, every path of --paths run in each round over
// the same data files, each verified.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strings"

	evalmodel "github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
	"github.com/tutti-io/tutti/uring"
)

type gpuBench struct {
	g        kvshape.Geometry
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
	kcfg        kernels.Config       // for the kick-mode context, bound on first use
	kopts       kernels.BenchOptions // the A/B switches of the comparison, bound with kcfg
	rk          *kernels.Restorer    // GPU path on a ring without SQPOLL (kick mode)
	ringK       *uring.Ring
	stderr      io.Writer
	ctx         context.Context // cancelled: stop between paths
	progress    func(phase string, done, total int)
}

func (b *gpuBench) totalBytes() int64       { return b.objBytes * int64(b.g.Layers) }
func (b *gpuBench) logf(f string, a ...any) { fmt.Fprintf(b.stderr, f, a...) }

// tell passes progress on to Config.Progress, if set.
func (b *gpuBench) tell(phase string, done, total int) {
	if b.progress != nil {
		b.progress(phase, done, total)
	}
}

// newGPUBench sizes the prefix of cfg, shuffles its block table and lays
// it out on the devices (--devices, or one data file under --dir).
func newGPUBench(ctx context.Context, cfg Config, stderr io.Writer) (*gpuBench, error) {
	prof, err := evalmodel.Lookup(cfg.Model)
	if err != nil {
		return nil, err
	}
	g := prof.Shape
	b := &gpuBench{g: g, model: cfg.Model, label: cfg.Label, qd: cfg.QD, seed: cfg.Seed, stderr: stderr, ctx: ctx, progress: cfg.Progress}
	b.pages = (cfg.Tokens + g.PageTokens - 1) / g.PageTokens
	b.numPages = b.pages + b.pages/8 + 16
	b.objBytes = int64(b.pages) * g.PageBytesPerLayer()
	rng := rand.New(rand.NewPCG(cfg.Seed, 7))
	perm := rng.Perm(b.numPages)
	for i := 0; i < b.pages; i++ {
		b.dst = append(b.dst, int32(perm[i]))
	}
	switch {
	case cfg.Devices != "":
		b.paths = strings.Split(cfg.Devices, ",")
	case cfg.Dir != "":
		b.paths = []string{filepath.Join(cfg.Dir, "gpubench-"+cfg.Model+".dat")}
	default:
		return nil, errors.New("need --dir or --devices")
	}
	if b.lay, err = newBenchLayout(prof.Shape, b.pages, len(b.paths), cfg.Stripe, cfg.RunPages); err != nil {
		return nil, err
	}
	b.pm = b.lay.pageMap(b.dst)
	return b, nil
}

// allocKV allocates the KV tensors (numPages pages of every layer, or one
// cross-layer tensor); free releases them, also after an error.
func (b *gpuBench) allocKV(kl kernels.Layout) (kv []uint64, free func(), err error) {
	free = func() {
		for _, p := range kv {
			kernels.DevFree(p)
		}
	}
	per := b.g.PageBytesPerLayer() * int64(b.numPages)
	n, bytes := b.g.Layers, per
	if kl == kernels.LayoutCrossLayer {
		n, bytes = 1, per*int64(b.g.Layers)
	}
	for i := 0; i < n; i++ {
		p, err := kernels.DevAlloc(bytes)
		if err != nil {
			return kv, free, err
		}
		kv = append(kv, p)
	}
	return kv, free, nil
}

// sizeReads fills in the window, largest read and lookahead left 0 in cfg
// from the devices (runtime.DeviceSizedGPUReads), saying on stderr what
// they did not tell.
func (b *gpuBench) sizeReads(cfg *Config) {
	b.maxIO = cfg.MaxIO
	if b.maxIO == 0 || cfg.Window == 0 {
		sized := runtime.DeviceSizedGPUReads(b.paths)
		for _, u := range sized.Unread {
			b.logf("%s\n", u)
		}
		sized = sized.Explicit(cfg.Window, b.maxIO, 0)
		cfg.Window, b.maxIO = sized.Window, sized.MaxIOBytes
	}
	if cfg.Lookahead == 0 {
		// Enough layers to fill the window with reads.
		cfg.Lookahead = runtime.GPULookaheadToFill(cfg.Window, b.maxIO, len(b.paths), b.objBytes)
	}
	b.logf("GPU window %d SQEs, lookahead %d layers, largest read %d KiB\n", cfg.Window, cfg.Lookahead, b.maxIO>>10)
}

// bind opens the SQPOLL ring and binds the restorer on kv; closeAll closes
// what bind and bindKick opened.
func (b *gpuBench) bind(cfg Config, kl kernels.Layout, kv []uint64) (closeAll func(), err error) {
	closeAll = func() {
		if b.rk != nil {
			b.rk.Close()
			b.ringK.Close()
		}
		if b.r != nil {
			b.r.Close()
		}
		if b.ring != nil {
			b.ring.Close()
		}
	}
	b.ringEntries = uint32(max(256, cfg.Window))
	rc := uring.DefaultConfig()
	rc.Entries = b.ringEntries
	rc.NoMmap = true // rings in process memory: CUDA maps multi-page rings reliably
	rc.SQPoll = true
	rc.SQThreadIdleMs = uint32(cfg.SQPollIdleMs)
	if b.ring, err = uring.New(rc); err != nil {
		return closeAll, fmt.Errorf("GPU ring: %w", err)
	}
	b.kcfg = kernels.Config{Geometry: b.g, Layout: kl, NumPages: b.numPages, KV: kv, Ring: b.ring,
		MaxPages: b.pages, MaxExtents: b.lay.piecesPerLayer(), MaxIOBytes: b.maxIO, IOWindow: cfg.Window, Lookahead: cfg.Lookahead,
		WakeInterval: cfg.WakeInterval, PollTimeout: cfg.PollTimeout,
		EnqueueLayers: cfg.EnqueueLayers, EnqueueChunk: cfg.EnqueueChunk,
		WakeBatch: cfg.KickBatch, WakeRamp: cfg.KickRamp, BatchWait: cfg.KickBatchWait}
	b.kopts = kernels.BenchOptions{NoFixedBuffers: cfg.NoFixedBuffers, ZeroCopyScatter: cfg.ZeroCopy, LooseWakeTarget: !cfg.KickExact}
	b.kickDefer = cfg.KickDefer
	r, err := kernels.BindBench(b.kcfg, b.kopts)
	if err != nil {
		return closeAll, err
	}
	b.r = r
	return closeAll, nil
}
