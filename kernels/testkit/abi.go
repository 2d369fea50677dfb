// Package testkit loads libtutti_testkit.so, the GPU code that only tests and
// benchmarks use (tk_testkit.h): content fill and verification of the KV
// tensors in HBM, the cuFile baseline and the harness's prefill GEMMs, plus
// the host-side content generator that the verify kernel checks against
// (FillObject). The product's library (package kernels) holds the restore and
// save path only; an engine never loads this one.
//
// Errors wrap package kernels' sentinels (ErrNotLoaded, ErrNoGPU, ErrInvalid,
// ...), so callers branch on one set.
package testkit

/*
#cgo CFLAGS: -I${SRCDIR}/..
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tk_testkit.h"

static struct {
	int32_t (*abi_version)(void);
	int32_t (*last_error)(char *, int32_t);
	tk_status (*kv_fill)(const tk_kv *, int32_t, uint32_t);
	tk_status (*kv_verify)(const tk_kv *, int32_t, uint64_t, const tk_page_map *, uint32_t, uint32_t, uint32_t, uint64_t *);
	tk_status (*legacy_spin)(int32_t, uint64_t);
	tk_status (*legacy_busy)(int32_t, int32_t *);
	tk_status (*kv_fill_after)(const tk_kv *, int32_t, uint32_t, uint64_t, uint64_t *);
	tk_status (*event_done)(uint64_t, int32_t *);
	tk_status (*event_destroy)(uint64_t);
	tk_status (*cufile_probe)(const char *, int32_t *);
	tk_status (*cufile_batch_read)(const char *, const uint64_t *, const uint64_t *, const uint32_t *, uint32_t, uint64_t, uint64_t);
} T;

static void *tkt_handle;

static int tkt_load(const char *path, char *err, int n) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) { snprintf(err, n, "%s", dlerror()); return -1; }
#define S(f, sym) if (!(*(void **)&T.f = dlsym(h, sym))) { snprintf(err, n, "%s lacks %s", path, sym); dlclose(h); memset(&T, 0, sizeof T); return -1; }
	S(abi_version, "tkt_abi_version") S(last_error, "tkt_last_error") S(kv_fill, "tkt_kv_fill") S(kv_verify, "tkt_kv_verify")
	S(legacy_spin, "tkt_legacy_spin") S(legacy_busy, "tkt_legacy_busy")
	S(kv_fill_after, "tkt_kv_fill_after") S(event_done, "tkt_event_done") S(event_destroy, "tkt_event_destroy")
	S(cufile_probe, "tk_cufile_probe") S(cufile_batch_read, "tk_cufile_batch_read")
#undef S
	tkt_handle = h;
	return 0;
}

static int32_t tkt_abi(void) { return T.abi_version(); }
static int32_t tkt_err(char *b, int32_t n) { return T.last_error(b, n); }
static tk_status tkt_fill(const tk_kv *kv, int32_t d, uint32_t v) { return T.kv_fill(kv, d, v); }
static tk_status tkt_verify(const tk_kv *kv, int32_t d, uint64_t seed, const tk_page_map *m, uint32_t n, uint32_t fl, uint32_t nl, uint64_t *out) { return T.kv_verify(kv, d, seed, m, n, fl, nl, out); }
static tk_status tkt_spin(int32_t d, uint64_t ns) { return T.legacy_spin(d, ns); }
static tk_status tkt_busy(int32_t d, int32_t *b) { return T.legacy_busy(d, b); }
static tk_status tkt_fill_after(const tk_kv *kv, int32_t d, uint32_t v, uint64_t ns, uint64_t *ev) { return T.kv_fill_after(kv, d, v, ns, ev); }
static tk_status tkt_ev_done(uint64_t ev, int32_t *done) { return T.event_done(ev, done); }
static tk_status tkt_ev_destroy(uint64_t ev) { return T.event_destroy(ev); }
static tk_status tkt_cf_probe(const char *p, int32_t *e) { return T.cufile_probe(p, e); }
static tk_status tkt_cf_read(const char *p, const uint64_t *fo, const uint64_t *dof, const uint32_t *len, uint32_t n, uint64_t d, uint64_t db) { return T.cufile_batch_read(p, fo, dof, len, n, d, db); }
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"github.com/tutti-io/tutti/kernels"
)

// LibName is the file the Makefile builds next to libtutti_kernels.so.
const LibName = "libtutti_testkit.so"

var (
	loadOnce sync.Once
	loadErr  error
	loadPath string
)

// candidates: TUTTI_TESTKIT_LIB, then the folder of the loaded product
// library, then the build folders seen from the repository root or a package
// directory.
func candidates() []string {
	if p := os.Getenv("TUTTI_TESTKIT_LIB"); p != "" {
		return []string{p}
	}
	var c []string
	if p := kernels.Path(); p != "" {
		c = append(c, filepath.Join(filepath.Dir(p), LibName))
	}
	return append(c, "kernels/build/"+LibName, "build/"+LibName, "../build/"+LibName)
}

// Load loads the product library (kernels.Init(device) is the caller's) and
// then this one, once. Errors wrap kernels.ErrNotLoaded or kernels.ErrABI.
func Load() error {
	if err := kernels.Load(); err != nil {
		return err
	}
	loadOnce.Do(func() { loadErr = load() })
	return loadErr
}

// Path is the library's path after a successful Load.
func Path() string { return loadPath }

func load() error {
	abs, err := kernels.LoadFirst(candidates(), "TUTTI_TESTKIT_LIB", func(abs string) error {
		cp := C.CString(abs)
		var buf [512]C.char
		rc := C.tkt_load(cp, &buf[0], C.int(len(buf)))
		C.free(unsafe.Pointer(cp))
		if rc != 0 {
			return fmt.Errorf("%w: %s", kernels.ErrNotLoaded, C.GoString(&buf[0]))
		}
		if v := int(C.tkt_abi()); v != kernels.ABIVersion {
			return fmt.Errorf("%w: %s has ABI %d, package kernels wants %d", kernels.ErrABI, abs, v, kernels.ABIVersion)
		}
		return nil
	})
	if err == nil {
		loadPath = abs
	}
	return err
}

// status turns a tk_status into an error naming op, with this library's message.
func status(op string, s C.tk_status) error {
	if s == C.TK_OK {
		return nil
	}
	var buf [512]C.char
	C.tkt_err(&buf[0], C.int32_t(len(buf)))
	msg := C.GoString(&buf[0])
	var sentinel error
	switch s {
	case C.TK_ERR_NO_GPU:
		sentinel = kernels.ErrNoGPU
	case C.TK_ERR_CUDA:
		sentinel = kernels.ErrCUDA
	case C.TK_ERR_INVALID:
		sentinel = kernels.ErrInvalid
	case C.TK_ERR_BUSY:
		sentinel = kernels.ErrBusy
	case C.TK_ERR_NOT_SUPPORTED:
		sentinel = kernels.ErrNotSupported
	case C.TK_ERR_IO:
		sentinel = kernels.ErrIO
	default:
		sentinel = fmt.Errorf("tk_status %d", int(s))
	}
	return fmt.Errorf("%s: %w: %s", op, sentinel, msg)
}

// kvDesc is the tk_kv of the tensors cfg describes.
func kvDesc(cfg kernels.Config) (C.tk_kv, error) {
	var kv C.tk_kv
	g := cfg.Geometry
	if len(cfg.KV) == 0 || len(cfg.KV) > len(kv.kv_ptrs) {
		return kv, fmt.Errorf("kv descriptor: %w: %d tensors", kernels.ErrInvalid, len(cfg.KV))
	}
	kv.layers = C.uint32_t(g.Layers)
	kv.planes = C.uint32_t(g.Planes)
	kv.page_tokens = C.uint32_t(g.PageTokens)
	kv.kv_heads = C.uint32_t(g.KVHeads)
	kv.head_dim = C.uint32_t(g.HeadDim)
	kv.dtype_bytes = C.uint32_t(g.DType.Bytes())
	kv.layout = C.uint32_t(cfg.Layout)
	kv.num_pages = C.uint32_t(cfg.NumPages)
	for i, p := range cfg.KV {
		kv.kv_ptrs[i] = C.uint64_t(p)
	}
	return kv, nil
}

// FillKV sets every byte of r's bound KV tensors to b (poison before a check).
func FillKV(r *kernels.Restorer, b byte) error {
	if err := Load(); err != nil {
		return err
	}
	cfg := r.Config()
	kv, err := kvDesc(cfg)
	if err != nil {
		return err
	}
	return status("fill kv", C.tkt_fill(&kv, C.int32_t(cfg.Device), C.uint32_t(b)))
}

// VerifyKV counts the 8-byte words of layers [firstLayer, +layers) of r's
// mapped pages that differ from FillObject's content for block seed+i, where
// i is the page's index in pages (its place in the saved object). The caller
// has waited for every restore into those pages.
func VerifyKV(r *kernels.Restorer, seed uint64, pages []kernels.PageMap, firstLayer, layers int) (uint64, error) {
	return VerifyTensors(r.Config(), seed, pages, firstLayer, layers)
}

// VerifyTensors is VerifyKV on the tensors cfg describes (Device, Geometry,
// Layout, NumPages, KV), bound to no Restorer: what a benchmark of the
// runtime's GPU path checks after a runtime.Store.Load. Only pages[i].DstPage
// is read.
func VerifyTensors(cfg kernels.Config, seed uint64, pages []kernels.PageMap, firstLayer, layers int) (uint64, error) {
	if len(pages) == 0 {
		return 0, fmt.Errorf("verify: %w: no pages", kernels.ErrInvalid)
	}
	if err := Load(); err != nil {
		return 0, err
	}
	kv, err := kvDesc(cfg)
	if err != nil {
		return 0, err
	}
	var n C.uint64_t
	err = status("verify kv", C.tkt_verify(&kv, C.int32_t(cfg.Device), C.uint64_t(seed), (*C.tk_page_map)(unsafe.Pointer(&pages[0])),
		C.uint32_t(len(pages)), C.uint32_t(firstLayer), C.uint32_t(layers), &n))
	return uint64(n), err
}

// LegacySpin launches a kernel that runs for d on device's legacy default
// stream (where PyTorch puts an engine's work) and returns at once: what a
// test that the product's waits do not wait for an engine's stream runs
// beside them. LegacyBusy reports whether that stream still has work.
func LegacySpin(device int, d time.Duration) error {
	if err := Load(); err != nil {
		return err
	}
	return status("legacy spin", C.tkt_spin(C.int32_t(device), C.uint64_t(d.Nanoseconds())))
}

// LegacyBusy: see LegacySpin.
func LegacyBusy(device int) (bool, error) {
	if err := Load(); err != nil {
		return false, err
	}
	var b C.int32_t
	err := status("legacy stream query", C.tkt_busy(C.int32_t(device), &b))
	return b != 0, err
}

// FillKVAfter is an engine writing its KV on a stream of its own: on a new
// stream of r's device, a kernel that runs for spin, then every byte of r's
// KV tensors set to b, and an event recorded behind them, which it returns at
// once (a cudaEvent_t, to EventDestroy). What a save ordered after the
// engine's writes (GatherLane's afterEvent) is tested with.
func FillKVAfter(r *kernels.Restorer, b byte, spin time.Duration) (event uintptr, err error) {
	if err := Load(); err != nil {
		return 0, err
	}
	cfg := r.Config()
	kv, err := kvDesc(cfg)
	if err != nil {
		return 0, err
	}
	var ev C.uint64_t
	err = status("fill kv after a spin", C.tkt_fill_after(&kv, C.int32_t(cfg.Device), C.uint32_t(b), C.uint64_t(spin.Nanoseconds()), &ev))
	return uintptr(ev), err
}

// EventDone says whether FillKVAfter's event completed.
func EventDone(event uintptr) (bool, error) {
	if err := Load(); err != nil {
		return false, err
	}
	var d C.int32_t
	err := status("event query", C.tkt_ev_done(C.uint64_t(event), &d))
	return d != 0, err
}

// EventDestroy frees FillKVAfter's event.
func EventDestroy(event uintptr) error {
	if err := Load(); err != nil {
		return err
	}
	return status("event destroy", C.tkt_ev_destroy(C.uint64_t(event)))
}

// CuFileProbe opens the cuFile driver and registers path with it. On failure
// code is cuFile's error number (5027 on a volume it cannot handle), and err
// wraps kernels.ErrNotSupported with cuFile's text.
func CuFileProbe(path string) (code int, err error) {
	if err := Load(); err != nil {
		return 0, err
	}
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	var e C.int32_t
	err = status("cuFile probe "+path, C.tkt_cf_probe(cp, &e))
	return int(e), err
}

// CuFileBatchRead reads extents of path with cuFile's batch API into device
// memory dst (dstBytes long) at dstOff[i].
func CuFileBatchRead(path string, fileOff, dstOff []uint64, lens []uint32, dst uint64, dstBytes int64) error {
	if err := Load(); err != nil {
		return err
	}
	if len(fileOff) != len(dstOff) || len(fileOff) != len(lens) || len(lens) == 0 {
		return fmt.Errorf("cuFile batch read: %w: %d/%d/%d extents", kernels.ErrInvalid, len(fileOff), len(dstOff), len(lens))
	}
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	return status("cuFile batch read "+path, C.tkt_cf_read(cp, (*C.uint64_t)(unsafe.Pointer(&fileOff[0])),
		(*C.uint64_t)(unsafe.Pointer(&dstOff[0])), (*C.uint32_t)(unsafe.Pointer(&lens[0])), C.uint32_t(len(lens)),
		C.uint64_t(dst), C.uint64_t(dstBytes)))
}
