package kernels

/*
#include <stdlib.h>
#include "tutti_kernels.h"
tk_status tkl_host_map(uint64_t c, const tk_page_map *m, uint32_t n);
tk_status tkl_scatter_host(uint64_t c, uint32_t l, uint64_t a, uint64_t n);
tk_status tkl_gather_host(uint64_t c, uint32_t l, uint64_t a, uint64_t n);
tk_status tkl_scatter_dev(uint64_t c, uint32_t l, uint64_t a, uint64_t n);
tk_status tkl_copy_event(uint64_t c, uint32_t i);
tk_status tkl_copy_event_wait(uint64_t c, uint32_t i);
tk_status tkl_sync(uint64_t c);
tk_status tkl_gather_lane(uint64_t c, uint32_t lane, const tk_page_map *m, uint32_t n, uint32_t l0, uint32_t nl, uint64_t dst, uint64_t stride, uint32_t *crcs, uint64_t ev);
*/
import "C"

import (
	"fmt"
	goruntime "runtime"
	"unsafe"
)

// SetHostMap sets the page map of the following ScatterHost/GatherHost/
// ScatterDevice calls (after the earlier ones finished).
func (r *Restorer) SetHostMap(pages []PageMap) error {
	if len(pages) == 0 {
		return fmt.Errorf("host map: %w: no pages", ErrInvalid)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return status("tk_host_map", C.tkl_host_map(r.ctx, (*C.tk_page_map)(unsafe.Pointer(&pages[0])), C.uint32_t(len(pages))))
}

// ScatterHost enqueues the copy of one layer from host memory [addr,
// addr+bytes) (object layout; inside the staging pool or HostRegister'ed
// memory) into the KV tensors.
func (r *Restorer) ScatterHost(layer int, addr uintptr, bytes int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return status(fmt.Sprintf("scatter layer %d", layer), C.tkl_scatter_host(r.ctx, C.uint32_t(layer), C.uint64_t(addr), C.uint64_t(bytes)))
}

// GatherHost enqueues the copy of one layer from the KV tensors into host
// memory (object layout), for a save.
func (r *Restorer) GatherHost(layer int, addr uintptr, bytes int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return status(fmt.Sprintf("gather layer %d", layer), C.tkl_gather_host(r.ctx, C.uint32_t(layer), C.uint64_t(addr), C.uint64_t(bytes)))
}

// ScatterDevice enqueues the copy of one layer from device memory (object
// layout) into the KV tensors.
func (r *Restorer) ScatterDevice(layer int, dptr uint64, bytes int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return status(fmt.Sprintf("scatter layer %d from device", layer), C.tkl_scatter_dev(r.ctx, C.uint32_t(layer), C.uint64_t(dptr), C.uint64_t(bytes)))
}

// RecordCopy records copy event i (i < StagingSlots) after the copies enqueued so far.
func (r *Restorer) RecordCopy(i int) error {
	return status("recording copy event", C.tkl_copy_event(r.ctx, C.uint32_t(i)))
}

// WaitCopy blocks until copy event i has passed.
func (r *Restorer) WaitCopy(i int) error {
	return status("waiting for copy event", C.tkl_copy_event_wait(r.ctx, C.uint32_t(i)))
}

// SyncCopies blocks until every enqueued copy finished.
func (r *Restorer) SyncCopies() error { return status("sync copies", C.tkl_sync(r.ctx)) }

// Gather copies layers [firstLayer, firstLayer+layers) of the given engine
// pages into dst (registered host memory) in object layout, layer l at
// dst + (l-firstLayer)*layerStride, and waits. It goes through the host page
// map and the copy stream (SetHostMap, GatherHost, SyncCopies), so it waits
// for, and excludes, every other host copy; concurrent savers use
// GatherLane instead.
func (r *Restorer) Gather(pages []int32, firstLayer, layers int, dst uintptr, layerStride int64) error {
	pm, err := r.gatherMap(pages, firstLayer, layers, layerStride)
	if err != nil {
		return fmt.Errorf("gather: %w", err)
	}
	if err := r.SetHostMap(pm); err != nil {
		return fmt.Errorf("gather: %w", err)
	}
	for l := 0; l < layers; l++ {
		if err := r.GatherHost(firstLayer+l, dst+uintptr(int64(l)*layerStride), layerStride); err != nil {
			return fmt.Errorf("gather: %w", err)
		}
	}
	return r.SyncCopies()
}

// GatherLanes is how many GatherLane calls may run at once: lanes
// 0..GatherLanes()-1 (Config.GatherLanes).
func (r *Restorer) GatherLanes() int { return r.cfg.GatherLanes }

// GatherLane is Gather on gather lane lane: the save path's HBM -> staging
// step (the bytes are then written by the CPU). Each lane has its own stream
// and page map buffers in the library, so calls on different lanes run at
// once and take no lock of r's; the caller hands out the lanes (one call per
// lane at a time: a lane already in a call is refused with ErrBusy). dst and
// layerStride must be multiples of 16 and dst..dst+layers*layerStride
// registered host memory (HostRegister, or the staging pool), else ErrInvalid,
// as for a bad lane or more than MaxPages pages. The bytes are in dst when it
// returns; pages is not kept. Like every method, not after Close.
//
// planeCRCs, if not nil, must have layers*len(pages)*Planes entries: it gets
// the CRC32C (objmap's chunk CRC) of every page plane gathered, computed on
// the GPU from the KV tensors, planeCRCs[(l*len(pages)+i)*Planes+p] for
// layer firstLayer+l, page i, plane p, so that the caller need not read the
// bytes in dst to checksum them. Its contents are undefined after an error.
//
// afterEvent, if not 0, is a cudaEvent_t of the device recorded where the
// engine's stream has written the pages: the copies start once it completed
// (the engine's host need not wait for its stream first). The caller keeps
// the event alive until GatherLane returned.
func (r *Restorer) GatherLane(lane int, pages []int32, firstLayer, layers int, dst uintptr, layerStride int64, planeCRCs []uint32, afterEvent uintptr) error {
	op := fmt.Sprintf("gather lane %d", lane)
	pm, err := r.gatherMap(pages, firstLayer, layers, layerStride)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if lane < 0 { // the library checks the upper bound
		return fmt.Errorf("%s: %w: %d lanes", op, ErrInvalid, r.cfg.GatherLanes)
	}
	var crcs *C.uint32_t
	if planeCRCs != nil {
		if want := layers * len(pages) * r.cfg.Geometry.Planes; len(planeCRCs) != want {
			return fmt.Errorf("%s: %w: %d plane CRCs for %d layers of %d pages of %d planes", op, ErrInvalid, len(planeCRCs), layers, len(pages), r.cfg.Geometry.Planes)
		}
		crcs = (*C.uint32_t)(unsafe.Pointer(&planeCRCs[0]))
	}
	// The library's error message is per OS thread: the call and status's
	// read of the message must run on one.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	// pm and planeCRCs hold no Go pointers, so C may use them for the
	// call's duration.
	return status(op, C.tkl_gather_lane(r.ctx, C.uint32_t(lane), (*C.tk_page_map)(unsafe.Pointer(&pm[0])), C.uint32_t(len(pm)),
		C.uint32_t(firstLayer), C.uint32_t(layers), C.uint64_t(dst), C.uint64_t(layerStride), crcs, C.uint64_t(afterEvent)))
}

// gatherMap checks a gather's arguments and returns its page map, the one
// rule of a gather's object layout: request page i at i*PageBytesPerLayer.
func (r *Restorer) gatherMap(pages []int32, firstLayer, layers int, layerStride int64) ([]PageMap, error) {
	pb := r.cfg.Geometry.PageBytesPerLayer()
	if len(pages) == 0 || layerStride < int64(len(pages))*pb || firstLayer < 0 || layers <= 0 || firstLayer+layers > r.cfg.Geometry.Layers {
		return nil, fmt.Errorf("%w: stride %d for %d pages, layers [%d,+%d)", ErrInvalid, layerStride, len(pages), firstLayer, layers)
	}
	pm := make([]PageMap, len(pages))
	for i, p := range pages {
		pm[i] = PageMap{DstPage: uint32(p), SlotOff: uint32(int64(i) * pb)}
	}
	return pm, nil
}

// failedPages counts (layer, page) pairs that a failed entry kept from being
// scattered.
func failedPages(pages []PageMap, entries []EntryResult, epl int) int {
	n := 0
	for l := 0; l*epl < len(entries); l++ {
		layer := entries[l*epl : (l+1)*epl]
		for _, p := range pages {
			for e := p.FirstEntry; e <= p.LastEntry; e++ {
				if layer[e].Status != EntryOK {
					n++
					break
				}
			}
		}
	}
	return n
}
