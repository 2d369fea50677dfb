package testkit

/*
#cgo CFLAGS: -I${SRCDIR}/..
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tk_prefill.h"

// The prefill entry points of the test kit's library, resolved apart from its
// fill/verify table; a missing one is named.
static struct {
	tk_status (*create)(const tk_prefill_params *, uint64_t *);
	tk_status (*run)(uint64_t, uint32_t, const tk_gemm *, uint32_t);
	tk_status (*wait)(uint64_t, float *, uint32_t);
	tk_status (*destroy)(uint64_t);
} P;

static int tkp_load(const char *path, char *err, int n) {
	// The test kit is loaded already (Load): NOLOAD returns its handle.
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
	if (!h) { snprintf(err, n, "%s is not loaded: %s", path, dlerror()); return -1; }
#define S(f) if (!(*(void **)&P.f = dlsym(h, "tk_prefill_" #f))) { snprintf(err, n, "%s lacks tk_prefill_" #f " (rebuild it with make -C kernels)", path); memset(&P, 0, sizeof P); return -1; }
	S(create) S(run) S(wait) S(destroy)
#undef S
	return 0;
}

static tk_status tkp_create(const tk_prefill_params *p, uint64_t *h) { return P.create(p, h); }
static tk_status tkp_run(uint64_t h, uint32_t l, const tk_gemm *g, uint32_t n) { return P.run(h, l, g, n); }
static tk_status tkp_wait(uint64_t h, float *ms, uint32_t n) { return P.wait(h, ms, n); }
static tk_status tkp_destroy(uint64_t h) { return P.destroy(h); }
*/
import "C"

import (
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/tutti-io/tutti/kernels"
)

var (
	_ [unsafe.Sizeof(C.tk_gemm{}) - 16]struct{}
	_ [16 - unsafe.Sizeof(C.tk_gemm{})]struct{}
)

// Limits of one prefill run (tk_prefill.h).
const (
	MaxPrefillGEMMs    = C.TK_PREFILL_MAX_GEMMS    // GEMM shapes per layer
	MaxPrefillLaunches = C.TK_PREFILL_MAX_LAUNCHES // GEMM launches per run: layers × Σ Count
	MaxPrefillLayers   = 65536
	maxGEMMDim         = 0x7ffffff8 // cuBLAS takes int dimensions; round8 must not overflow
)

// GEMM is one GEMM shape of a layer's prefill, run Count times per layer:
// C[M×N] = A[M×K]·B[K×N] in bf16 with fp32 accumulation (cuBLAS, column-major,
// leading dimensions rounded up to 8 elements as an engine pads them).
type GEMM struct {
	M, N, K int
	Count   int
}

// FLOPs is 2·M·N·K·Count: one multiply and one add per product.
func (g GEMM) FLOPs() float64 {
	return 2 * float64(g.M) * float64(g.N) * float64(g.K) * float64(g.Count)
}

// Elems returns the bf16 elements of A, B and C that g needs.
func (g GEMM) Elems() (a, b, c int64) {
	lda, ldb := round8(int64(g.M)), round8(int64(g.K))
	return lda * int64(g.K), ldb * int64(g.N), lda * int64(g.N)
}

func round8(x int64) int64 { return (x + 7) &^ 7 }

// PrefillConfig sizes what NewPrefill allocates on the GPU, once.
type PrefillConfig struct {
	Device    int
	MaxLayers int // layers per run, 1..MaxPrefillLayers
	// AElems, BElems and CElems are the bf16 elements of the activation,
	// weight and output buffers; every GEMM a run launches must fit them
	// (GEMM.Elems). PrefillBuffers computes them for a set of shapes.
	AElems, BElems, CElems int64
}

// PrefillBuffers returns the buffer sizes that hold every GEMM of gemms.
func PrefillBuffers(gemms []GEMM) (a, b, c int64) {
	for _, g := range gemms {
		ga, gb, gc := g.Elems()
		a, b, c = max(a, ga), max(b, gb), max(c, gc)
	}
	return a, b, c
}

// CheckPrefill returns an error wrapping kernels.ErrInvalid when a run of layers
// layers of gemms does not fit cfg (the library checks again before it
// enqueues anything).
func CheckPrefill(cfg PrefillConfig, layers int, gemms []GEMM) error {
	if layers < 1 || layers > cfg.MaxLayers {
		return fmt.Errorf("prefill: %d layers, configured for 1..%d: %w", layers, cfg.MaxLayers, kernels.ErrInvalid)
	}
	if len(gemms) < 1 || len(gemms) > MaxPrefillGEMMs {
		return fmt.Errorf("prefill: %d GEMM shapes per layer (1..%d): %w", len(gemms), MaxPrefillGEMMs, kernels.ErrInvalid)
	}
	var launches int64
	for i, g := range gemms {
		if g.M < 1 || g.N < 1 || g.K < 1 || g.Count < 1 || g.M > maxGEMMDim || g.N > maxGEMMDim || g.K > maxGEMMDim {
			return fmt.Errorf("prefill: GEMM %d is %+v: %w", i, g, kernels.ErrInvalid)
		}
		if a, b, c := g.Elems(); a > cfg.AElems || b > cfg.BElems || c > cfg.CElems {
			return fmt.Errorf("prefill: GEMM %d %+v needs %d/%d/%d elements, buffers hold %d/%d/%d: %w",
				i, g, a, b, c, cfg.AElems, cfg.BElems, cfg.CElems, kernels.ErrInvalid)
		}
		launches += int64(g.Count)
		if launches*int64(layers) > MaxPrefillLaunches {
			return fmt.Errorf("prefill: more than %d GEMM launches in %d layers: %w", MaxPrefillLaunches, layers, kernels.ErrInvalid)
		}
	}
	return nil
}

var (
	prefillOnce sync.Once
	prefillErr  error
)

// loadPrefill resolves the prefill entry points of the loaded library.
func loadPrefill() error {
	if err := Load(); err != nil {
		return err
	}
	prefillOnce.Do(func() {
		cp := C.CString(loadPath)
		defer C.free(unsafe.Pointer(cp))
		var buf [512]C.char
		if C.tkp_load(cp, &buf[0], C.int(len(buf))) != 0 {
			prefillErr = fmt.Errorf("%w: %s", kernels.ErrNotLoaded, C.GoString(&buf[0]))
		}
	})
	return prefillErr
}

// Prefill runs a transformer prefill's GEMMs on the GPU, layer by layer, on
// a stream of its own (next to whatever else the GPU does: a restore's I/O
// and scatter kernels contend with it for real), and measures each layer's
// GPU time with CUDA events.
//
// NewPrefill allocates everything (bf16 buffers filled with pseudo-random
// values, a cuBLAS handle with its own workspace, the stream, MaxLayers+1
// events); Start allocates nothing on the GPU. One run is in flight at a
// time: Start, then Wait, then the next Start. A Prefill is used by one
// goroutine at a time (Start may run on another goroutine than Wait, handed
// over with a happens-before edge such as a channel). Close frees it.
type Prefill struct {
	h       C.uint64_t
	cfg     PrefillConfig
	descs   []C.tk_gemm
	ms      []C.float
	pending int // layers enqueued and not waited for
}

// NewPrefill loads the library, selects cfg.Device and allocates the
// buffers. Errors wrap kernels.ErrNotLoaded (no library, or one built before the
// prefill entry points: the message names the missing symbol), kernels.ErrNoGPU,
// kernels.ErrInvalid (cfg) or kernels.ErrCUDA (e.g. out of device memory).
func NewPrefill(cfg PrefillConfig) (*Prefill, error) {
	if err := kernels.Init(cfg.Device); err != nil {
		return nil, err
	}
	if err := loadPrefill(); err != nil {
		return nil, err
	}
	if cfg.MaxLayers < 1 || cfg.MaxLayers > MaxPrefillLayers || cfg.AElems < 1 || cfg.BElems < 1 || cfg.CElems < 1 {
		return nil, fmt.Errorf("prefill: config %+v: %w", cfg, kernels.ErrInvalid)
	}
	p := C.tk_prefill_params{device: C.int32_t(cfg.Device), max_layers: C.uint32_t(cfg.MaxLayers),
		a_elems: C.uint64_t(cfg.AElems), b_elems: C.uint64_t(cfg.BElems), c_elems: C.uint64_t(cfg.CElems)}
	var h C.uint64_t
	if err := status("tk_prefill_create", C.tkp_create(&p, &h)); err != nil {
		return nil, err
	}
	return &Prefill{h: h, cfg: cfg, ms: make([]C.float, cfg.MaxLayers)}, nil
}

// Config returns what the Prefill was created with.
func (p *Prefill) Config() PrefillConfig { return p.cfg }

// Start enqueues layers layers, each running gemms, and returns without
// waiting for the GPU (the host enqueues every GEMM launch: a few µs each).
// It fails with kernels.ErrBusy while an earlier run was not waited for, and with
// kernels.ErrInvalid, having enqueued nothing, for shapes that do not fit.
func (p *Prefill) Start(layers int, gemms []GEMM) error {
	if p.h == 0 {
		return fmt.Errorf("prefill: %w: closed", kernels.ErrInvalid)
	}
	if p.pending > 0 {
		return fmt.Errorf("prefill: %w: %d layers not waited for", kernels.ErrBusy, p.pending)
	}
	if err := CheckPrefill(p.cfg, layers, gemms); err != nil {
		return err
	}
	p.descs = p.descs[:0]
	for _, g := range gemms {
		p.descs = append(p.descs, C.tk_gemm{m: C.uint32_t(g.M), n: C.uint32_t(g.N), k: C.uint32_t(g.K), count: C.uint32_t(g.Count)})
	}
	if err := status("tk_prefill_run", C.tkp_run(p.h, C.uint32_t(layers), &p.descs[0], C.uint32_t(len(p.descs)))); err != nil {
		return err
	}
	p.pending = layers
	return nil
}

// Wait blocks (in the driver, not spinning) until the run finished and
// appends each layer's GPU time to dst. After Wait, whatever it returned,
// the Prefill can Start again.
func (p *Prefill) Wait(dst []time.Duration) ([]time.Duration, error) {
	if p.pending == 0 {
		return dst, fmt.Errorf("prefill: %w: nothing started", kernels.ErrInvalid)
	}
	n := p.pending
	p.pending = 0
	if err := status("tk_prefill_wait", C.tkp_wait(p.h, &p.ms[0], C.uint32_t(n))); err != nil {
		return dst, err
	}
	for _, ms := range p.ms[:n] {
		dst = append(dst, time.Duration(float64(ms)*1e6))
	}
	return dst, nil
}

// Run is Start and Wait.
func (p *Prefill) Run(layers int, gemms []GEMM, dst []time.Duration) ([]time.Duration, error) {
	if err := p.Start(layers, gemms); err != nil {
		return dst, err
	}
	return p.Wait(dst)
}

// Close waits for anything enqueued and frees the GPU memory, the stream,
// the events and the cuBLAS handle. Calling it again does nothing.
func (p *Prefill) Close() error {
	if p.h == 0 {
		return nil
	}
	h := p.h
	p.h, p.pending = 0, 0
	return status("tk_prefill_destroy", C.tkp_destroy(h))
}
