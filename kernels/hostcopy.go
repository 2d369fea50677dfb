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
*/
import "C"

import (
	"fmt"
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
// dst + (l-firstLayer)*layerStride, and waits. This is the save path's
// HBM -> staging step; the bytes are then written by the CPU (uring).
func (r *Restorer) Gather(pages []int32, firstLayer, layers int, dst uintptr, layerStride int64) error {
	pb := r.cfg.Geometry.PageBytesPerLayer()
	if layerStride < int64(len(pages))*pb || firstLayer < 0 || layers <= 0 || firstLayer+layers > r.cfg.Geometry.Layers {
		return fmt.Errorf("gather: %w: stride %d for %d pages, layers [%d,+%d)", ErrInvalid, layerStride, len(pages), firstLayer, layers)
	}
	pm := make([]PageMap, len(pages))
	for i, p := range pages {
		pm[i] = PageMap{DstPage: uint32(p), SlotOff: uint32(int64(i) * pb)}
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
