package kernels

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tutti_kernels.h"

// The library's entry points, resolved once by tkl_load. Calls go through
// these trampolines because Go cannot call C function pointers directly.
static struct {
	int32_t (*abi_version)(void);
	tk_status (*init)(int32_t);
	int32_t (*last_error)(char *, int32_t);
	tk_status (*device_name)(int32_t, char *, int32_t, int32_t *);
	tk_status (*dev_alloc)(uint64_t, uint64_t *);
	tk_status (*dev_alloc_on)(int32_t, uint64_t, uint64_t *);
	tk_status (*dev_free)(uint64_t);
	tk_status (*memcpy_htod)(uint64_t, uint64_t, uint64_t);
	tk_status (*memcpy_dtoh)(uint64_t, uint64_t, uint64_t);
	tk_status (*memset_dev)(uint64_t, uint32_t, uint64_t);
	tk_status (*host_register)(uint64_t, uint64_t);
	tk_status (*host_unregister)(uint64_t);
	tk_status (*bind)(const tk_bind_params *, uint64_t *);
	tk_status (*unbind)(uint64_t);
	tk_status (*restore_submit)(uint64_t, const tk_restore_params *, uint32_t *);
	tk_status (*restore_enqueue)(uint64_t, uint32_t, uint32_t);
	tk_status (*restore_stream_wait)(uint64_t, uint32_t, uint32_t, uint64_t);
	tk_status (*restore_wait_layer)(uint64_t, uint32_t, uint32_t);
	tk_status (*restore_wait)(uint64_t, uint32_t, tk_entry_result *, uint32_t, float *, uint32_t);
	tk_status (*restore_release)(uint64_t, uint32_t);
	tk_status (*host_map)(uint64_t, const tk_page_map *, uint32_t);
	tk_status (*scatter_host)(uint64_t, uint32_t, uint64_t, uint64_t);
	tk_status (*gather_host)(uint64_t, uint32_t, uint64_t, uint64_t);
	tk_status (*scatter_dev)(uint64_t, uint32_t, uint64_t, uint64_t);
	tk_status (*copy_event)(uint64_t, uint32_t);
	tk_status (*copy_event_wait)(uint64_t, uint32_t);
	tk_status (*sync)(uint64_t);
	tk_status (*gather_lane)(uint64_t, uint32_t, const tk_page_map *, uint32_t, uint32_t, uint32_t, uint64_t, uint64_t, uint32_t *, uint64_t);
} T;

static int tkl_load(const char *path, char *err, int n) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) { snprintf(err, n, "%s", dlerror()); return -1; }
#define S(f) if (!(*(void **)&T.f = dlsym(h, "tk_" #f))) { snprintf(err, n, "%s lacks tk_%s", path, #f); dlclose(h); memset(&T, 0, sizeof T); return -1; }
	S(abi_version) S(init) S(last_error) S(device_name) S(dev_alloc) S(dev_alloc_on) S(dev_free) S(memcpy_htod) S(memcpy_dtoh)
	S(memset_dev) S(host_register) S(host_unregister) S(bind) S(unbind) S(restore_submit) S(restore_enqueue) S(restore_stream_wait)
	S(restore_wait_layer) S(restore_wait) S(restore_release) S(host_map) S(scatter_host) S(gather_host)
	S(scatter_dev) S(copy_event) S(copy_event_wait) S(sync) S(gather_lane)
#undef S
	return 0;
}

int32_t tkl_abi_version(void) { return T.abi_version(); }
tk_status tkl_init(int32_t d) { return T.init(d); }
int32_t tkl_last_error(char *b, int32_t n) { return T.last_error(b, n); }
tk_status tkl_device_name(int32_t d, char *b, int32_t n, int32_t *sm) { return T.device_name(d, b, n, sm); }
tk_status tkl_dev_alloc(uint64_t n, uint64_t *p) { return T.dev_alloc(n, p); }
tk_status tkl_dev_alloc_on(int32_t d, uint64_t n, uint64_t *p) { return T.dev_alloc_on(d, n, p); }
tk_status tkl_dev_free(uint64_t p) { return T.dev_free(p); }
tk_status tkl_memcpy_htod(uint64_t d, uint64_t h, uint64_t n) { return T.memcpy_htod(d, h, n); }
tk_status tkl_memcpy_dtoh(uint64_t h, uint64_t d, uint64_t n) { return T.memcpy_dtoh(h, d, n); }
tk_status tkl_memset_dev(uint64_t d, uint32_t v, uint64_t n) { return T.memset_dev(d, v, n); }
tk_status tkl_host_register(uint64_t a, uint64_t n) { return T.host_register(a, n); }
tk_status tkl_host_unregister(uint64_t a) { return T.host_unregister(a); }
tk_status tkl_bind(const tk_bind_params *p, uint64_t *c) { return T.bind(p, c); }
tk_status tkl_unbind(uint64_t c) { return T.unbind(c); }
tk_status tkl_restore_submit(uint64_t c, const tk_restore_params *p, uint32_t *r) { return T.restore_submit(c, p, r); }
tk_status tkl_restore_enqueue(uint64_t c, uint32_t r, uint32_t u) { return T.restore_enqueue(c, r, u); }
tk_status tkl_restore_stream_wait(uint64_t c, uint32_t r, uint32_t l, uint64_t s) { return T.restore_stream_wait(c, r, l, s); }
tk_status tkl_restore_wait_layer(uint64_t c, uint32_t r, uint32_t l) { return T.restore_wait_layer(c, r, l); }
tk_status tkl_restore_wait(uint64_t c, uint32_t r, tk_entry_result *res, uint32_t n, float *ms, uint32_t nm) { return T.restore_wait(c, r, res, n, ms, nm); }
tk_status tkl_restore_release(uint64_t c, uint32_t r) { return T.restore_release(c, r); }
tk_status tkl_host_map(uint64_t c, const tk_page_map *m, uint32_t n) { return T.host_map(c, m, n); }
tk_status tkl_scatter_host(uint64_t c, uint32_t l, uint64_t a, uint64_t n) { return T.scatter_host(c, l, a, n); }
tk_status tkl_gather_host(uint64_t c, uint32_t l, uint64_t a, uint64_t n) { return T.gather_host(c, l, a, n); }
tk_status tkl_scatter_dev(uint64_t c, uint32_t l, uint64_t a, uint64_t n) { return T.scatter_dev(c, l, a, n); }
tk_status tkl_copy_event(uint64_t c, uint32_t i) { return T.copy_event(c, i); }
tk_status tkl_copy_event_wait(uint64_t c, uint32_t i) { return T.copy_event_wait(c, i); }
tk_status tkl_sync(uint64_t c) { return T.sync(c); }
tk_status tkl_gather_lane(uint64_t c, uint32_t lane, const tk_page_map *m, uint32_t n, uint32_t l0, uint32_t nl, uint64_t dst, uint64_t stride, uint32_t *crcs, uint64_t ev) {
	return T.gather_lane(c, lane, m, n, l0, nl, dst, stride, crcs, ev);
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"
)

// ABIVersion is the version of tutti_kernels.h this package was built with.
const ABIVersion = C.TK_ABI_VERSION

// GatherStageBytes is each gather lane's device staging (HBM, allocated at
// Bind unless BenchOptions.ZeroCopyGather), or one page of one layer where
// that is larger.
const GatherStageBytes = C.TK_GATHER_STAGE_BYTES

var (
	loadOnce sync.Once
	loadErr  error
	loadPath string
)

// candidates lists where the library is looked for, in order: the environment
// variable TUTTI_KERNELS_LIB, the build folder seen from the repository root
// or from the package directory (go test), and next to the executable.
func candidates() []string {
	if p := os.Getenv("TUTTI_KERNELS_LIB"); p != "" {
		return []string{p}
	}
	c := []string{"kernels/build/libtutti_kernels.so", "build/libtutti_kernels.so"}
	if exe, err := os.Executable(); err == nil {
		d := filepath.Dir(exe)
		c = append(c, filepath.Join(d, "libtutti_kernels.so"), filepath.Join(d, "..", "kernels", "build", "libtutti_kernels.so"))
	}
	return c
}

// Load loads the library once (later calls return the first result). It
// returns an error wrapping ErrNotLoaded when no candidate exists or loads, and
// ErrABI when the library's ABI version differs from this package's.
func Load() error {
	loadOnce.Do(func() { loadErr = load() })
	return loadErr
}

// Path is the library's path after a successful Load.
func Path() string { return loadPath }

// Explicit reports whether the library path was named (TUTTI_KERNELS_LIB):
// then a failure to load is a failure, not a reason to skip.
func Explicit() bool { return os.Getenv("TUTTI_KERNELS_LIB") != "" }

func load() error {
	abs, err := LoadFirst(candidates(), "TUTTI_KERNELS_LIB", func(abs string) error {
		cp := C.CString(abs)
		var buf [512]C.char
		rc := C.tkl_load(cp, &buf[0], C.int(len(buf)))
		C.free(unsafe.Pointer(cp))
		if rc != 0 {
			return fmt.Errorf("%w: %s", ErrNotLoaded, C.GoString(&buf[0]))
		}
		if v := int(C.tkl_abi_version()); v != ABIVersion {
			return fmt.Errorf("%w: %s has ABI %d, package kernels wants %d", ErrABI, abs, v, ABIVersion)
		}
		return nil
	})
	if err == nil {
		loadPath = abs
	}
	return err
}

// LoadFirst is the library search of Load (and of the test library's
// loader): the first of candidates that exists is opened by open, given its
// absolute path, and open's result is final; when none exists, the error
// wraps ErrNotLoaded, lists what was tried and names env, the variable
// that points at the library.
func LoadFirst(candidates []string, env string, open func(abs string) error) (string, error) {
	var tried []string
	for _, p := range candidates {
		if _, err := os.Stat(p); err != nil {
			tried = append(tried, p+": "+err.Error())
			continue
		}
		abs, _ := filepath.Abs(p)
		if err := open(abs); err != nil {
			return "", err
		}
		return abs, nil
	}
	return "", fmt.Errorf("%w: tried %v (build it with `make kernels` on a CUDA machine, or set %s)", ErrNotLoaded, tried, env)
}

// status turns a tk_status into an error naming op, with the library's message.
func status(op string, s C.tk_status) error {
	if s == C.TK_OK {
		return nil
	}
	var buf [512]C.char
	C.tkl_last_error(&buf[0], C.int(len(buf)))
	msg := C.GoString(&buf[0])
	var sentinel error
	switch s {
	case C.TK_ERR_NO_GPU:
		sentinel = ErrNoGPU
	case C.TK_ERR_CUDA:
		sentinel = ErrCUDA
	case C.TK_ERR_INVALID:
		sentinel = ErrInvalid
	case C.TK_ERR_BUSY:
		sentinel = ErrBusy
	case C.TK_ERR_RING:
		sentinel = ErrRingBroken
	case C.TK_ERR_NOT_SUPPORTED:
		sentinel = ErrNotSupported
	case C.TK_ERR_IO:
		sentinel = ErrIO
	default:
		sentinel = fmt.Errorf("tk_status %d", int(s))
	}
	return fmt.Errorf("%s: %w: %s", op, sentinel, msg)
}

var (
	initMu   sync.Mutex
	initDone = map[int]error{}
)

// Init loads the library and selects device (blocking host waits, mapped host
// memory). ErrNotLoaded without the library, ErrNoGPU without a device.
func Init(device int) error {
	if err := Load(); err != nil {
		return err
	}
	initMu.Lock()
	defer initMu.Unlock()
	if err, ok := initDone[device]; ok {
		return err
	}
	err := status("tk_init", C.tkl_init(C.int32_t(device)))
	initDone[device] = err
	return err
}

// DeviceName returns the device's name and multiprocessor count.
func DeviceName(device int) (string, int, error) {
	if err := Init(device); err != nil {
		return "", 0, err
	}
	var buf [256]C.char
	var sm C.int32_t
	if err := status("tk_device_name", C.tkl_device_name(C.int32_t(device), &buf[0], C.int32_t(len(buf)), &sm)); err != nil {
		return "", 0, err
	}
	return C.GoString(&buf[0]), int(sm), nil
}

// DevAlloc allocates device memory (tests and benchmarks; an engine brings its
// own tensors). The caller frees it with DevFree.
func DevAlloc(bytes int64) (uint64, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var p C.uint64_t
	err := status("tk_dev_alloc", C.tkl_dev_alloc(C.uint64_t(bytes), &p))
	return uint64(p), err
}

// DevAllocOn allocates device memory on GPU device (DevAlloc allocates on
// whichever device the calling OS thread has current, which a goroutine
// cannot choose: use this where a process drives several GPUs).
func DevAllocOn(device int, bytes int64) (uint64, error) {
	if device < 0 {
		return 0, fmt.Errorf("allocating %d bytes on GPU %d: %w", bytes, device, ErrInvalid)
	}
	// Init sets the device's flags (blocking sync, mapped host memory) before
	// its context exists.
	if err := Init(device); err != nil {
		return 0, err
	}
	var p C.uint64_t
	err := status(fmt.Sprintf("tk_dev_alloc_on(device %d)", device), C.tkl_dev_alloc_on(C.int32_t(device), C.uint64_t(bytes), &p))
	return uint64(p), err
}

// DevFree frees memory from DevAlloc.
func DevFree(p uint64) error {
	if err := Load(); err != nil {
		return err
	}
	return status("tk_dev_free", C.tkl_dev_free(C.uint64_t(p)))
}

// CopyToHost copies device memory into host memory at dst (off-heap or
// pinned; the call is synchronous).
func CopyToHost(dst uintptr, src uint64, bytes int64) error {
	if err := Load(); err != nil {
		return err
	}
	return status("tk_memcpy_dtoh", C.tkl_memcpy_dtoh(C.uint64_t(dst), C.uint64_t(src), C.uint64_t(bytes)))
}

// CopyToDevice copies host memory at src into device memory (synchronous).
func CopyToDevice(dst uint64, src uintptr, bytes int64) error {
	if err := Load(); err != nil {
		return err
	}
	return status("tk_memcpy_htod", C.tkl_memcpy_htod(C.uint64_t(dst), C.uint64_t(src), C.uint64_t(bytes)))
}

// MemsetDevice sets bytes of device memory at dst to b (synchronous; tests
// and benchmarks poison KV tensors with it).
func MemsetDevice(dst uint64, b byte, bytes int64) error {
	if err := Load(); err != nil {
		return err
	}
	return status("tk_memset_dev", C.tkl_memset_dev(C.uint64_t(dst), C.uint32_t(b), C.uint64_t(bytes)))
}

// HostRegister pins and maps off-heap host memory for the GPU (it must stay
// mapped until HostUnregister). Copies to or from host memory are refused
// unless it lies in a registered range or the bound staging pool.
func HostRegister(addr uintptr, bytes int64) error {
	if err := Load(); err != nil {
		return err
	}
	return status("tk_host_register", C.tkl_host_register(C.uint64_t(addr), C.uint64_t(bytes)))
}

// HostUnregister undoes HostRegister.
func HostUnregister(addr uintptr) error {
	if err := Load(); err != nil {
		return err
	}
	return status("tk_host_unregister", C.tkl_host_unregister(C.uint64_t(addr)))
}
