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

	"github.com/tutti-io/tutti/prefix"
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
	// configSize is tutti_config of ABI 1.1 (gpu_io_window ... gpu_flags).
	configSize = 224
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
func readConfig(p *C.tutti_config) (config, error) {
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
	if err := countArg("cfg->num_dirs", uint64(local.num_dirs), maxDirs); err != nil {
		return c, err
	}
	if local.dirs == nil {
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

//export tutti_lookup
func tutti_lookup(store C.uint64_t, chain *C.uint64_t, n C.uint32_t, outBlocks *C.uint32_t) (rc C.int32_t) {
	defer guard("tutti_lookup", &rc)
	return finish("tutti_lookup", lookup(store, chain, uint64(n), outBlocks))
}

func lookup(store C.uint64_t, chainP *C.uint64_t, n uint64, out *C.uint32_t) error {
	if out == nil {
		return errorf(errInvalidArgument, "out_blocks is NULL")
	}
	*out = 0
	e, err := storeArg(uint64(store))
	if err != nil {
		return err
	}
	if err := countArg("chain length", n, maxChainBlocks); err != nil {
		return err
	}
	if chainP == nil {
		return errorf(errInvalidArgument, "chain is NULL with length %d", n)
	}
	// Lookup only reads the chain during the call and keeps nothing, so it
	// gets a view of the caller's array instead of a copy.
	*out = C.uint32_t(e.s.Lookup(unsafe.Slice((*uint64)(unsafe.Pointer(chainP)), n)))
	return nil
}

//export tutti_load
func tutti_load(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, pages *C.int32_t, numPages C.uint32_t, outLoad *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_load", &rc)
	return finish("tutti_load", startLoad(store, chain, uint64(chainLen), pages, uint64(numPages), outLoad))
}

func startLoad(store C.uint64_t, chainP *C.uint64_t, chainLen uint64, pagesP *C.int32_t, numPages uint64, out *C.uint64_t) error {
	e, chain, pages, err := requestArgs(store, chainP, chainLen, pagesP, numPages, out, "out_load", true)
	if err != nil {
		return err
	}
	l, err := e.s.Load(chain, pages)
	if err != nil {
		return err
	}
	le := &loadEntry{owner: e, l: l}
	return publish(e, kindLoad, le, func() error { return releaseLoad(le) }, "load", out)
}

// requestArgs checks and copies what tutti_load and tutti_save share: the
// out pointer (zeroed), the store, the chain and its block table (distinct
// pages for a load: two blocks cannot be restored into one page), and that
// KV memory is registered.
func requestArgs(store C.uint64_t, chainP *C.uint64_t, chainLen uint64, pagesP *C.int32_t, numPages uint64,
	out *C.uint64_t, outName string, distinct bool) (*storeEntry, []uint64, []int32, error) {
	if out == nil {
		return nil, nil, nil, errorf(errInvalidArgument, "%s is NULL", outName)
	}
	*out = 0
	e, err := storeArg(uint64(store))
	if err != nil {
		return nil, nil, nil, err
	}
	chain, pages, err := copyChainPages(e.cfg, chainP, chainLen, pagesP, numPages)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := checkPages(e.cfg, len(chain), pages, distinct); err != nil {
		return nil, nil, nil, err
	}
	if err := e.checkRegistered(); err != nil {
		return nil, nil, nil, err
	}
	return e, chain, pages, nil
}

// publish gives the caller a handle of kind k for v, a child of store e; if
// no handle can be made, v is released (so nothing is left running that the
// caller cannot reach) and the error says so.
func publish(e *storeEntry, k kind, v any, release func() error, what string, out *C.uint64_t) error {
	h, err := handles.add(k, v)
	if err == nil {
		if err = e.addChild(h); err != nil {
			handles.take(h, k)
		}
	}
	if err != nil {
		if rerr := release(); rerr != nil {
			return fmt.Errorf("%w (releasing the %s: %v)", err, what, rerr)
		}
		return err
	}
	*out = C.uint64_t(h)
	return nil
}

func loadArg(h C.uint64_t) (*loadEntry, error) {
	v, err := handles.get(uint64(h), kindLoad)
	if err != nil {
		return nil, err
	}
	return v.(*loadEntry), nil
}

//export tutti_load_wait_layer
func tutti_load_wait_layer(load C.uint64_t, layer C.int32_t) (rc C.int32_t) {
	defer guard("tutti_load_wait_layer", &rc)
	return finish("tutti_load_wait_layer", waitLayer(load, int(layer)))
}

func waitLayer(h C.uint64_t, layer int) error {
	le, err := loadArg(h)
	if err != nil {
		return err
	}
	if n := le.owner.cfg.Geometry.Layers; layer < 0 || layer >= n {
		return errorf(errOutOfRange, "layer = %d, want 0..%d", layer, n-1)
	}
	return le.l.WaitLayer(layer)
}

//export tutti_load_stream_wait_layer
func tutti_load_stream_wait_layer(load C.uint64_t, layer C.int32_t, stream C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_load_stream_wait_layer", &rc)
	return finish("tutti_load_stream_wait_layer", func() error {
		le, err := loadArg(load)
		if err != nil {
			return err
		}
		if n := le.owner.cfg.Geometry.Layers; layer < 0 || int(layer) >= n {
			return errorf(errOutOfRange, "layer = %d, want 0..%d", layer, n-1)
		}
		return le.l.StreamWaitLayer(int(layer), uintptr(stream))
	}())
}

//export tutti_load_wait
func tutti_load_wait(load C.uint64_t, outBlocks *C.uint32_t) (rc C.int32_t) {
	defer guard("tutti_load_wait", &rc)
	return finish("tutti_load_wait", waitLoad(load, outBlocks))
}

func waitLoad(h C.uint64_t, out *C.uint32_t) error {
	if out != nil {
		*out = 0
	}
	le, err := loadArg(h)
	if err != nil {
		return err
	}
	if err := le.l.Wait(); err != nil {
		return err
	}
	if out != nil {
		*out = C.uint32_t(le.l.Blocks())
	}
	return nil
}

//export tutti_load_plan
func tutti_load_plan(load C.uint64_t, outCached, outPlanned *C.uint32_t) (rc C.int32_t) {
	defer guard("tutti_load_plan", &rc)
	return finish("tutti_load_plan", func() error {
		le, err := loadArg(load)
		if err != nil {
			return err
		}
		if outCached != nil {
			*outCached = C.uint32_t(le.l.Cached())
		}
		if outPlanned != nil {
			*outPlanned = C.uint32_t(le.l.Planned())
		}
		return nil
	}())
}

//export tutti_load_failure
func tutti_load_failure(load C.uint64_t, outStatus *C.int32_t) (rc C.int32_t) {
	defer guard("tutti_load_failure", &rc)
	return finish("tutti_load_failure", func() error {
		if outStatus == nil {
			return errorf(errInvalidArgument, "out_status is NULL")
		}
		*outStatus = C.int32_t(statusOK)
		le, err := loadArg(load)
		if err != nil {
			return err
		}
		if f := le.l.Failure(); f != nil {
			code := classify(f)
			if code == errInternal {
				code = errIO // a miss always comes from reading the store
			}
			*outStatus = C.int32_t(code)
			setError("load: " + f.Error())
		}
		return nil
	}())
}

//export tutti_load_release
func tutti_load_release(load C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_load_release", &rc)
	return finish("tutti_load_release", func() error {
		v, err := handles.take(uint64(load), kindLoad)
		if err != nil {
			return err
		}
		le := v.(*loadEntry)
		le.owner.dropChild(uint64(load))
		return releaseLoad(le)
	}())
}

//export tutti_save
func tutti_save(store C.uint64_t, chain *C.uint64_t, chainLen C.uint32_t, pages *C.int32_t, numPages C.uint32_t, outSave *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_save", &rc)
	return finish("tutti_save", startSave(store, chain, uint64(chainLen), pages, uint64(numPages), outSave))
}

func startSave(store C.uint64_t, chainP *C.uint64_t, chainLen uint64, pagesP *C.int32_t, numPages uint64, out *C.uint64_t) error {
	e, chain, pages, err := requestArgs(store, chainP, chainLen, pagesP, numPages, out, "out_save", false)
	if err != nil {
		return err
	}
	sv, err := e.s.Save(chain, pages)
	if err != nil {
		return err
	}
	se := &saveEntry{owner: e, s: sv}
	return publish(e, kindSave, se, func() error { return releaseSave(se) }, "save", out)
}

func saveArg(h C.uint64_t) (*saveEntry, error) {
	v, err := handles.get(uint64(h), kindSave)
	if err != nil {
		return nil, err
	}
	return v.(*saveEntry), nil
}

//export tutti_save_wait_gathered
func tutti_save_wait_gathered(save C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_save_wait_gathered", &rc)
	return finish("tutti_save_wait_gathered", func() error {
		se, err := saveArg(save)
		if err != nil {
			return err
		}
		return waitGathered(se)
	}())
}

//export tutti_save_release
func tutti_save_release(save C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_save_release", &rc)
	return finish("tutti_save_release", func() error {
		v, err := handles.take(uint64(save), kindSave)
		if err != nil {
			return err
		}
		se := v.(*saveEntry)
		se.owner.dropChild(uint64(save))
		return releaseSave(se)
	}())
}

//export tutti_wait_saves
func tutti_wait_saves(store C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_wait_saves", &rc)
	return finish("tutti_wait_saves", func() error {
		e, err := storeArg(uint64(store))
		if err != nil {
			return err
		}
		return e.s.WaitSaves()
	}())
}

//export tutti_get_stats
func tutti_get_stats(store C.uint64_t, out *C.tutti_stats) (rc C.int32_t) {
	defer guard("tutti_get_stats", &rc)
	return finish("tutti_get_stats", func() error {
		if out == nil {
			return errorf(errInvalidArgument, "out is NULL")
		}
		size := uint64(out.struct_size)
		if size < statsSizeV1 {
			return errorf(errVersion, "out->struct_size = %d, the smallest supported tutti_stats is %d bytes (ABI %d.0)", size, statsSizeV1, abiMajor)
		}
		e, err := storeArg(uint64(store))
		if err != nil {
			return err
		}
		var local C.tutti_stats
		fillStats(&local, e)
		local.struct_size = out.struct_size
		n := min(size, uint64(unsafe.Sizeof(local)))
		copy(unsafe.Slice((*byte)(unsafe.Pointer(out)), n), unsafe.Slice((*byte)(unsafe.Pointer(&local)), n))
		return nil
	}())
}

//export tutti_get_recovery
func tutti_get_recovery(store C.uint64_t, out *C.tutti_recovery) (rc C.int32_t) {
	defer guard("tutti_get_recovery", &rc)
	return finish("tutti_get_recovery", func() error {
		if out == nil {
			return errorf(errInvalidArgument, "out is NULL")
		}
		size := uint64(out.struct_size)
		if size < recovSizeV1 {
			return errorf(errVersion, "out->struct_size = %d, the smallest supported tutti_recovery is %d bytes (ABI %d.0)", size, recovSizeV1, abiMajor)
		}
		e, err := storeArg(uint64(store))
		if err != nil {
			return err
		}
		r := e.s.Recovery()
		var local C.tutti_recovery
		local.struct_size = out.struct_size
		local.indexed_runs = C.uint64_t(max(r.IndexedRuns, 0))
		local.indexed_blocks = C.uint64_t(max(r.IndexedBlocks, 0))
		local.dropped_runs = C.uint64_t(max(r.DroppedRuns, 0))
		n := min(size, uint64(unsafe.Sizeof(local)))
		copy(unsafe.Slice((*byte)(unsafe.Pointer(out)), n), unsafe.Slice((*byte)(unsafe.Pointer(&local)), n))
		return nil
	}())
}

//export tutti_get_gpu_reads
func tutti_get_gpu_reads(store C.uint64_t, buf *C.char, n C.uint64_t, outLen *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_get_gpu_reads", &rc)
	return finish("tutti_get_gpu_reads", func() error {
		if outLen == nil {
			return errorf(errInvalidArgument, "out_len is NULL")
		}
		*outLen = 0
		if buf == nil && n != 0 {
			return errorf(errInvalidArgument, "buf is NULL with len = %d", n)
		}
		e, err := storeArg(uint64(store))
		if err != nil {
			return err
		}
		text := e.s.Stats().GPUReads
		*outLen = C.uint64_t(len(text))
		if uint64(n) <= uint64(len(text)) {
			return errorf(errBufferTooSmall, "len = %d, the text needs %d bytes with its NUL", n, len(text)+1)
		}
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(text)+1)
		copy(dst, text)
		dst[len(text)] = 0
		return nil
	}())
}

//export tutti_chain_from_tokens
func tutti_chain_from_tokens(tokens *C.uint32_t, numTokens C.uint64_t, blockTokens C.uint32_t, seed C.uint64_t, outChain *C.uint64_t, capacity C.uint32_t, outLen *C.uint32_t) (rc C.int32_t) {
	defer guard("tutti_chain_from_tokens", &rc)
	return finish("tutti_chain_from_tokens", func() error {
		if outLen == nil {
			return errorf(errInvalidArgument, "out_len is NULL")
		}
		*outLen = 0
		if blockTokens == 0 || blockTokens > 1<<20 {
			return errorf(errInvalidArgument, "block_tokens = %d, want 1..%d", blockTokens, 1<<20)
		}
		n := uint64(numTokens) / uint64(blockTokens)
		if n > maxChainBlocks {
			return errorf(errInvalidArgument, "%d tokens in blocks of %d give %d ids, more than the limit %d", numTokens, blockTokens, n, maxChainBlocks)
		}
		*outLen = C.uint32_t(n)
		if n > uint64(capacity) {
			return errorf(errBufferTooSmall, "cap = %d, %d tokens in blocks of %d give %d ids", capacity, numTokens, blockTokens, n)
		}
		if n == 0 {
			return nil
		}
		if tokens == nil {
			return errorf(errInvalidArgument, "tokens is NULL with num_tokens = %d", numTokens)
		}
		if outChain == nil {
			return errorf(errInvalidArgument, "out_chain is NULL with cap = %d", capacity)
		}
		// Only the full blocks are read; the C array is hashed in place (the
		// hash keeps no reference to it).
		toks := unsafe.Slice((*uint32)(unsafe.Pointer(tokens)), n*uint64(blockTokens))
		out := unsafe.Slice((*uint64)(unsafe.Pointer(outChain)), n)
		chain, err := prefix.ChainFromTokens(out[:0], toks, int(blockTokens), uint64(seed))
		if err != nil {
			return err
		}
		if len(chain) != int(n) || (n > 0 && &chain[0] != &out[0]) {
			return errorf(errInternal, "ChainFromTokens gave %d ids (want %d) or reallocated", len(chain), n)
		}
		return nil
	}())
}

func fillStats(out *C.tutti_stats, e *storeEntry) {
	s := e.s.Stats()
	var miss, skipped int64
	for _, m := range s.MissBlocks {
		miss += m
	}
	for _, k := range s.SkippedBlocks {
		skipped += k
	}
	u := func(v int64) C.uint64_t { return C.uint64_t(max(v, 0)) }
	out.lookups, out.lookup_blocks, out.hit_blocks = u(s.Lookups), u(s.LookupBlocks), u(s.HitBlocks)
	out.loads, out.cached_blocks, out.planned_blocks = u(s.Loads), u(s.CachedBlocks), u(s.PlannedBlocks)
	out.restored_blocks, out.restored_bytes = u(s.RestoredBlocks), u(s.RestoredBytes)
	out.read_ios, out.split_ios, out.overread_bytes = u(s.ReadIOs), u(s.SplitIOs), u(s.OverreadBytes)
	out.miss_blocks = u(miss)
	out.saves, out.save_blocks, out.saved_blocks, out.saved_bytes = u(s.Saves), u(s.SaveBlocks), u(s.SavedBlocks), u(s.SavedBytes)
	out.write_ios, out.committed_runs, out.corrupt_dropped = u(s.WriteIOs), u(s.CommittedRuns), u(s.CorruptDropped)
	out.skipped_blocks, out.fallbacks = u(skipped), u(s.Fallbacks)
}
