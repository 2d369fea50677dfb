// Command capi is the C ABI of the tutti runtime, built as a shared library:
//
//	go build -buildmode=c-shared -o bin/libtutti.so ./runtime/capi
//
// The contract is tutti.h (checked in next to this file; the generated
// bin/libtutti.h includes it). Every exported function is a thin shell: it
// copies its arguments out of C memory, checks them, calls package runtime,
// and turns the error into a tutti_status plus a thread-local message.
// Handles are integers into a Go table; no Go pointer crosses the boundary,
// and no C pointer is kept past the call except the registered KV memory.
package main

/*
#include <stdlib.h>
#include <string.h>
#include "tutti.h"

void tuttiSetError(const char *msg, size_t n);
int64_t tuttiCopyError(char *buf, uint64_t len);
*/
import "C"

import (
	"fmt"
	"runtime/debug"
	"sync"
	"unsafe"

	"github.com/tutti-io/tutti/runtime"
)

func main() {}

// Version-1.0 sizes of the growable structs: a caller's struct_size below
// them is refused; fields past a caller's struct_size read as 0. The array
// lengths fail to compile if tutti.h changes the sizes.
const (
	configSizeV1 = 208
	statsSizeV1  = 176
	recovSizeV1  = 32
	// configSize is tutti_config of ABI 1.3 (1.1: gpu_io_window ...
	// gpu_flags, 1.3: save_writes_per_device, reserved3).
	configSize = 232
)

var (
	_ [configSize - unsafe.Sizeof(C.tutti_config{})]byte
	_ [unsafe.Sizeof(C.tutti_config{}) - configSize]byte
	_ [statsSizeV1 - unsafe.Sizeof(C.tutti_stats{})]byte
	_ [unsafe.Sizeof(C.tutti_stats{}) - statsSizeV1]byte
	_ [recovSizeV1 - unsafe.Sizeof(C.tutti_recovery{})]byte
	_ [unsafe.Sizeof(C.tutti_recovery{}) - recovSizeV1]byte
)

var handles = newTable()

// storeEntry is what a store handle names.
type storeEntry struct {
	s   *runtime.Store
	cfg runtime.Config

	regMu sync.Mutex // serialises tutti_register_kv

	mu         sync.Mutex
	closed     bool
	registered uint32              // memory kind of the registered KV memory, 0 = none
	children   map[uint64]struct{} // live load and save handles of this store
}

// addChild registers h as belonging to e; it fails once e is closing, so
// no handle outlives its store.
func (e *storeEntry) addChild(h uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errorf(errClosed, "the store was closed during the call")
	}
	e.children[h] = struct{}{}
	return nil
}

func (e *storeEntry) dropChild(h uint64) {
	e.mu.Lock()
	delete(e.children, h)
	e.mu.Unlock()
}

type loadEntry struct {
	owner *storeEntry
	l     *runtime.Load
}

type saveEntry struct {
	owner *storeEntry
	s     *runtime.Save
}

func setError(msg string) {
	if msg == "" {
		return
	}
	C.tuttiSetError((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
}

// finish turns err into the status returned to C and records the message.
func finish(op string, err error) C.int32_t {
	if err == nil {
		return C.int32_t(statusOK)
	}
	setError(op + ": " + err.Error())
	return C.int32_t(classify(err))
}

// guard turns a panic into TUTTI_ERR_INTERNAL: a bug must not take the
// engine process down through a foreign call.
func guard(op string, rc *C.int32_t) {
	if r := recover(); r != nil {
		setError(fmt.Sprintf("%s: internal error: %v\n%s", op, r, debug.Stack()))
		*rc = C.int32_t(errInternal)
	}
}

func storeArg(h uint64) (*storeEntry, error) {
	v, err := handles.get(h, kindStore)
	if err != nil {
		return nil, err
	}
	return v.(*storeEntry), nil
}

// copyU64 copies n uint64 from C memory after checking p and n.
func copyU64(name string, p *C.uint64_t, n uint64, limit uint64) ([]uint64, error) {
	if err := countArg(name+" length", n, limit); err != nil {
		return nil, err
	}
	if p == nil {
		return nil, errorf(errInvalidArgument, "%s is NULL with length %d", name, n)
	}
	out := make([]uint64, n)
	copy(out, unsafe.Slice((*uint64)(unsafe.Pointer(p)), n))
	return out, nil
}

// copyChainPages copies a (chain, pages) pair after checking that the counts
// agree with each other and the geometry, so that an inconsistent count is
// refused before any caller memory is read.
func copyChainPages(cfg runtime.Config, chainP *C.uint64_t, chainLen uint64, pagesP *C.int32_t, numPages uint64) ([]uint64, []int32, error) {
	if err := countArg("chain length", chainLen, maxChainBlocks); err != nil {
		return nil, nil, err
	}
	if want := chainLen * uint64(cfg.Geometry.ChunkPages); numPages != want {
		return nil, nil, errorf(errGeometry, "num_pages = %d, want chain_len (%d) * chunk_pages (%d) = %d",
			numPages, chainLen, cfg.Geometry.ChunkPages, want)
	}
	chain, err := copyU64("chain", chainP, chainLen, maxChainBlocks)
	if err != nil {
		return nil, nil, err
	}
	pages, err := copyI32("pages", pagesP, numPages, maxPagesPerOp)
	if err != nil {
		return nil, nil, err
	}
	return chain, pages, nil
}

func copyI32(name string, p *C.int32_t, n uint64, limit uint64) ([]int32, error) {
	if err := countArg(name+" length", n, limit); err != nil {
		return nil, err
	}
	if p == nil {
		return nil, errorf(errInvalidArgument, "%s is NULL with length %d", name, n)
	}
	out := make([]int32, n)
	copy(out, unsafe.Slice((*int32)(unsafe.Pointer(p)), n))
	return out, nil
}

//export tutti_abi_version
func tutti_abi_version() C.uint32_t {
	return C.uint32_t(abiMajor<<16 | abiMinor)
}

//export tutti_last_error
func tutti_last_error(buf *C.char, n C.uint64_t) C.int64_t {
	if buf == nil {
		n = 0
	}
	return C.int64_t(C.tuttiCopyError(buf, n))
}

// readConfig copies the caller's tutti_config (only struct_size bytes of it).
func readConfig(p *C.tutti_config) (config, error) { return readConfigFor(p, false) }

// readConfigFor is readConfig; for a connected store (connect) dirs and
// capacity_bytes are not read (the service's: runtime.Connect sets them)
// and stand as a placeholder while the rest is checked.
func readConfigFor(p *C.tutti_config, connect bool) (config, error) {
	var c config
	if p == nil {
		return c, errorf(errInvalidArgument, "cfg is NULL")
	}
	size := uint64(p.struct_size)
	if size < configSizeV1 {
		return c, errorf(errVersion, "cfg->struct_size = %d, the smallest supported tutti_config is %d bytes (ABI %d.0)", size, configSizeV1, abiMajor)
	}
	var local C.tutti_config
	n := min(size, uint64(unsafe.Sizeof(local)))
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&local)), n), unsafe.Slice((*byte)(unsafe.Pointer(p)), n))

	c.abiMajor = uint32(local.abi_major)
	if c.abiMajor != abiMajor {
		return c, errorf(errVersion, "cfg->abi_major = %d, this library is ABI %d.%d", c.abiMajor, abiMajor, abiMinor)
	}
	if connect {
		local.num_dirs, local.dirs = 0, nil
		c.dirs = []string{serviceDirPlaceholder}
	} else if err := countArg("cfg->num_dirs", uint64(local.num_dirs), maxDirs); err != nil {
		return c, err
	}
	if local.dirs == nil && !connect {
		return c, errorf(errInvalidArgument, "cfg->dirs is NULL with num_dirs = %d", local.num_dirs)
	}
	for i, d := range unsafe.Slice(local.dirs, local.num_dirs) {
		if d == nil {
			return c, errorf(errInvalidArgument, "cfg->dirs[%d] is NULL", i)
		}
		l := C.strnlen(d, maxPathBytes)
		if l == maxPathBytes {
			return c, errorf(errInvalidArgument, "cfg->dirs[%d] is not NUL-terminated within %d bytes", i, maxPathBytes)
		}
		c.dirs = append(c.dirs, C.GoStringN(d, C.int(l)))
	}
	c.path = uint32(local.path)
	c.capacityBytes = int64(local.capacity_bytes)
	if connect {
		c.capacityBytes = 1
	}
	c.layers, c.kvHeads, c.headDim = int32(local.layers), int32(local.kv_heads), int32(local.head_dim)
	c.dtype = uint32(local.dtype)
	c.planes, c.pageTokens, c.chunkPages = int32(local.planes), int32(local.page_tokens), int32(local.chunk_pages)
	c.layout = uint32(local.layout)
	c.numPages = int64(local.num_pages)
	c.queueDepth, c.saveBoundMs = int32(local.queue_depth), int32(local.save_bound_ms)
	c.stagingBytes, c.stagingSlotBytes = int64(local.staging_bytes), int64(local.staging_slot_bytes)
	c.maxLoads = int32(local.max_loads)
	c.tpRank = uint32(local.tp_rank)
	c.saveBudgetBytes = int64(local.save_budget_bytes)
	c.gpuDevice, c.gpuMaxPages, c.gpuMaxRuns = int32(local.gpu_device), int32(local.gpu_max_pages), int32(local.gpu_max_runs)
	c.tpSize = uint32(local.tp_size)
	c.gpuIOWindow, c.gpuMaxIOBytes, c.gpuLookahead = int32(local.gpu_io_window), int32(local.gpu_max_io_bytes), int32(local.gpu_lookahead)
	c.gpuFlags = uint32(local.gpu_flags)
	c.saveWritesPerDevice, c.reserved3 = int32(local.save_writes_per_device), uint32(local.reserved3)
	c.compute = [3]float64{float64(local.compute_fixed_ns), float64(local.compute_per_token_ns), float64(local.compute_per_pair_ns)}
	c.device = [7]float64{float64(local.device_read_bytes_per_sec), float64(local.device_write_bytes_per_sec),
		float64(local.device_read_iops), float64(local.device_write_iops), float64(local.device_read_latency_ns),
		float64(local.device_read_share_under_writes), float64(local.device_write_share_under_reads)}
	return c, nil
}

//export tutti_open
func tutti_open(cfg *C.tutti_config, outStore *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_open", &rc)
	return finish("tutti_open", openStore(cfg, outStore))
}

func openStore(p *C.tutti_config, out *C.uint64_t, edit ...func(*runtime.Config)) error {
	if out == nil {
		return errorf(errInvalidArgument, "out_store is NULL")
	}
	*out = 0
	c, err := readConfig(p)
	if err != nil {
		return err
	}
	rc, err := c.runtimeConfig()
	if err != nil {
		return err
	}
	for _, f := range edit {
		f(&rc)
	}
	s, err := runtime.Open(rc)
	if err != nil {
		return err
	}
	if err := markRank(rc.Dirs, c.tpRank, max(c.tpSize, 1)); err != nil {
		s.Close()
		return err
	}
	e := &storeEntry{s: s, cfg: rc, children: make(map[uint64]struct{})}
	h, err := handles.add(kindStore, e)
	if err != nil {
		s.Close()
		return err
	}
	*out = C.uint64_t(h)
	return nil
}

//export tutti_close
func tutti_close(store C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_close", &rc)
	return finish("tutti_close", closeStore(uint64(store)))
}

func closeStore(h uint64) error {
	v, err := handles.take(h, kindStore)
	if err != nil {
		return err
	}
	e := v.(*storeEntry)
	e.mu.Lock()
	e.closed = true
	children := e.children
	e.children = nil
	e.mu.Unlock()
	// Loads still held are waited for and released so that the store never
	// closes under a restore that writes into the engine's memory.
	var first error
	for ch := range children {
		v, err := handles.take(ch, kind(ch>>kindShift))
		if err != nil {
			continue // released concurrently
		}
		switch x := v.(type) {
		case *loadEntry:
			if err := releaseLoad(x); err != nil && first == nil {
				first = err
			}
		case *saveEntry:
			if err := releaseSave(x); err != nil && first == nil {
				first = err
			}
		case *holdEntry:
			x.h.Release()
		}
	}
	if err := e.s.Close(); err != nil {
		return err
	}
	return first
}

//export tutti_register_kv
func tutti_register_kv(store C.uint64_t, memory C.uint32_t, regions *C.tutti_kv_region, n C.uint32_t) (rc C.int32_t) {
	defer guard("tutti_register_kv", &rc)
	return finish("tutti_register_kv", registerKV(store, uint32(memory), regions, uint64(n)))
}

func registerKV(store C.uint64_t, memory uint32, p *C.tutti_kv_region, n uint64) error {
	e, err := storeArg(uint64(store))
	if err != nil {
		return err
	}
	if err := countArg("num_regions", n, 1<<16); err != nil {
		return err
	}
	if p == nil {
		return errorf(errInvalidArgument, "regions is NULL with num_regions = %d", n)
	}
	rs := make([]region, n)
	for i, r := range unsafe.Slice(p, n) {
		rs[i] = region{addr: uint64(r.addr), lenBytes: uint64(r.len_bytes)}
	}
	kv, err := kvMemory(e.cfg, memory, rs)
	if err != nil {
		return err
	}
	// Serialised per store so that "already registered" is exact.
	e.regMu.Lock()
	defer e.regMu.Unlock()
	if e.registeredKind() != 0 {
		return errorf(errInvalidArgument, "KV memory is already registered (once per store)")
	}
	if err := e.s.RegisterKV(kv); err != nil {
		return err
	}
	e.mu.Lock()
	e.registered = memory
	e.mu.Unlock()
	return nil
}

func (e *storeEntry) registeredKind() uint32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.registered
}

func (e *storeEntry) checkRegistered() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.registered == 0 {
		return errorf(errNotRegistered, "no KV memory registered (call tutti_register_kv first)")
	}
	return nil
}
