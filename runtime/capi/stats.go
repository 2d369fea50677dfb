package main

// Counters: the store's stats (flat, and whole as JSON), recovery report
// and GPU read sizing.

/*
#include "tutti.h"
*/
import "C"

import (
	"encoding/json"
	"unsafe"

	"github.com/tutti-io/tutti/runtime"
)

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
	return finish("tutti_get_gpu_reads", textOut(store, buf, n, outLen, func(e *storeEntry) ([]byte, error) {
		return []byte(e.s.Stats().GPU.Reads.String()), nil
	}))
}

//export tutti_get_stats_json
func tutti_get_stats_json(store C.uint64_t, buf *C.char, n C.uint64_t, outLen *C.uint64_t) (rc C.int32_t) {
	defer guard("tutti_get_stats_json", &rc)
	return finish("tutti_get_stats_json", textOut(store, buf, n, outLen, func(e *storeEntry) ([]byte, error) {
		return statsJSON(e.s.Stats())
	}))
}

// statsJSON is what tutti_get_stats_json hands over: st as its json tags
// name it (runtime.Stats's doc).
func statsJSON(st runtime.Stats) ([]byte, error) {
	b, err := json.Marshal(st)
	if err != nil {
		return nil, errorf(errInternal, "encoding the stats: %v", err)
	}
	return b, nil
}

// textOut is the text functions' contract (tutti.h): *outLen = the text's
// length without its NUL; copied NUL-terminated into buf when len exceeds
// it, TUTTI_ERR_BUFFER_TOO_SMALL (nothing copied) otherwise.
func textOut(store C.uint64_t, buf *C.char, n C.uint64_t, outLen *C.uint64_t, text func(*storeEntry) ([]byte, error)) error {
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
	t, err := text(e)
	if err != nil {
		return err
	}
	*outLen = C.uint64_t(len(t))
	if uint64(n) <= uint64(len(t)) {
		return errorf(errBufferTooSmall, "len = %d, the text needs %d bytes with its NUL", n, len(t)+1)
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(t)+1)
	copy(dst, t)
	dst[len(t)] = 0
	return nil
}

// fillStats is the flat tutti_stats of ABI 1.0, kept as it was; new
// counters go only into tutti_get_stats_json.
func fillStats(out *C.tutti_stats, e *storeEntry) {
	s := e.s.Stats()
	u := func(v int64) C.uint64_t { return C.uint64_t(max(v, 0)) }
	lk, ld, sv := s.Lookups, s.Loads, s.Saves
	out.lookups, out.lookup_blocks, out.hit_blocks = u(lk.Calls), u(lk.AskedBlocks), u(lk.HitBlocks)
	out.loads, out.cached_blocks, out.planned_blocks = u(ld.Calls), u(ld.CachedBlocks), u(ld.PlannedBlocks)
	out.restored_blocks, out.restored_bytes = u(ld.RestoredBlocks), u(ld.RestoredBytes)
	out.read_ios, out.split_ios, out.overread_bytes = u(ld.ReadIOs), u(ld.SplitIOs), u(ld.OverreadBytes)
	out.miss_blocks = u(ld.MissBlocks.Total())
	out.saves, out.save_blocks, out.saved_blocks, out.saved_bytes = u(sv.Calls), u(sv.AskedBlocks), u(sv.SavedBlocks), u(sv.SavedBytes)
	out.write_ios, out.committed_runs, out.corrupt_dropped = u(sv.WriteIOs), u(sv.CommittedRuns), u(ld.CorruptDroppedRuns)
	out.skipped_blocks, out.fallbacks = u(sv.SkippedBlocks.Total()), u(s.Path.Fallbacks)
}
