package kernels

/*
#include <stdlib.h>
#include "tutti_kernels.h"
tk_status tkl_restore_submit(uint64_t c, const tk_restore_params *p, uint32_t *r);
tk_status tkl_restore_enqueue(uint64_t c, uint32_t r, uint32_t u);
tk_status tkl_restore_stream_wait(uint64_t c, uint32_t r, uint32_t l, uint64_t s);
tk_status tkl_restore_wait_layer(uint64_t c, uint32_t r, uint32_t l);
tk_status tkl_restore_wait(uint64_t c, uint32_t r, tk_entry_result *res, uint32_t n, float *ms, uint32_t nm);
tk_status tkl_restore_release(uint64_t c, uint32_t r);
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// Restore is one GPU-driven restore in flight.
type Restore struct {
	r        *Restorer
	f        feedItem // its enqueue state and layers; f.id is the library's request id
	epl      int
	released bool
}

// Restore checks req, builds its descriptors and puts them on the GPU: it
// enqueues the first EnqueueLayers layers (each the GPU I/O kernel and the
// scatter kernel) and returns; the feeder enqueues the others as earlier
// layers finish. While an earlier restore still has layers to enqueue, req
// waits in the feeder's queue and Restore returns at once. The caller must
// call Release (after Wait, or to abandon it). ErrBusy: MaxRequests
// restores are live.
func (r *Restorer) Restore(req Request) (*Restore, error) {
	if r.ring == nil {
		return nil, fmt.Errorf("restore: %w: bound without a ring", ErrNotSupported)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("restore: %w: restorer closed", ErrInvalid)
	}
	if r.live >= r.cfg.MaxRequests || len(r.plans) == 0 {
		return nil, fmt.Errorf("restore: %d restores live: %w", r.live, ErrBusy)
	}
	pl := r.plans[len(r.plans)-1]
	if err := BuildPlan(r.cfg.Geometry, r.lim, req, pl); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	r.plans = r.plans[:len(r.plans)-1]
	if r.fixed {
		for i := range pl.Entries {
			pl.Entries[i].Flags |= ioFixedBuf
		}
	}
	// The wake helper must run before the layers are enqueued: the first
	// layer's I/O kernel only finishes if the SQPOLL thread is woken (or the
	// ring kicked), and enqueueing can block until then.
	if r.helper.begin() {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
	x := &Restore{r: r, f: feedItem{first: req.FirstLayer, layers: len(req.Layers), plan: pl}, epl: pl.EntriesPerLayer}
	r.live++
	if err := r.feed.start(&x.f); err != nil {
		// Never submitted (a submit that fails gives its plan back itself):
		// x.f is ours again, and the feeder never saw it.
		r.live--
		r.helper.end()
		r.putPlan(&x.f)
		return nil, fmt.Errorf("restore: %w", err)
	}
	return x, nil
}

// putPlan gives back the descriptors of a restore that was never submitted
// (cFeed.submit gives back the others), with r.mu held.
func (r *Restorer) putPlan(it *feedItem) {
	if it.plan != nil {
		r.plans = append(r.plans, it.plan)
		it.plan = nil
	}
}

// cFeed is the feeder's view of the library. Its submit and enqueue run with
// Restorer.mu held.
type cFeed struct{ r *Restorer }

func (c cFeed) submit(it *feedItem, layers int) error {
	r, pl := c.r, it.plan
	defer func() {
		r.plans = append(r.plans, pl) // the library copied it
		it.plan = nil
	}()
	// The parameter block points at the plan's slices: pin them for the call.
	var pin runtime.Pinner
	pin.Pin(&pl.Pages[0])
	pin.Pin(&pl.Entries[0])
	defer pin.Unpin()
	var rp C.tk_restore_params
	rp.n_pages = C.uint32_t(len(pl.Pages))
	rp.pages = (*C.tk_page_map)(unsafe.Pointer(&pl.Pages[0]))
	rp.first_layer = C.uint32_t(it.first)
	rp.n_layers = C.uint32_t(it.layers)
	rp.entries_per_layer = C.uint32_t(pl.EntriesPerLayer)
	rp.entries = (*C.tk_io_entry)(unsafe.Pointer(&pl.Entries[0]))
	rp.enqueue_layers = C.uint32_t(layers)
	var id C.uint32_t
	if err := status("tk_restore_submit", C.tkl_restore_submit(r.ctx, &rp, &id)); err != nil {
		return err
	}
	it.id = uint32(id)
	s := &r.slots[id]
	s.entries = append(s.entries[:0], pl.Entries...)
	s.extents = append(s.extents[:0], pl.EntryExtent...)
	s.pages = append(s.pages[:0], pl.Pages...)
	return nil
}

func (c cFeed) enqueue(it *feedItem, upto int) error {
	return status("tk_restore_enqueue", C.tkl_restore_enqueue(c.r.ctx, C.uint32_t(it.id), C.uint32_t(upto)))
}

func (c cFeed) waitLayer(it *feedItem, layer int) error {
	return status(fmt.Sprintf("waiting for layer %d", it.first+layer),
		C.tkl_restore_wait_layer(c.r.ctx, C.uint32_t(it.id), C.uint32_t(it.first+layer)))
}

// fed waits until layer (absolute) is enqueued: the library's waits on a
// layer not enqueued yet would not wait at all.
func (x *Restore) fed(layer int) error {
	if layer < x.f.first || layer >= x.f.first+x.f.layers {
		return fmt.Errorf("layer %d not in the restore's [%d, %d): %w", layer, x.f.first, x.f.first+x.f.layers, ErrInvalid)
	}
	return x.r.feed.waitFed(&x.f, layer-x.f.first+1)
}

// Layers is the range of layers the restore covers.
func (x *Restore) Layers() (first, n int) { return x.f.first, x.f.layers }

// StreamWaitLayer makes a CUDA stream (a cudaStream_t; 0 is the legacy
// default stream) wait until layer is in the KV tensors, with no host round
// trip: the compute of that layer can be enqueued right after.
//
// A layer the feeder has not enqueued yet is waited for on the host first
// (it is enqueued once layer-EnqueueLayers is scattered).
func (x *Restore) StreamWaitLayer(layer int, stream uintptr) error {
	if err := x.fed(layer); err != nil {
		return fmt.Errorf("waiting on layer %d in stream: %w", layer, err)
	}
	return status(fmt.Sprintf("waiting on layer %d in stream", layer),
		C.tkl_restore_stream_wait(x.r.ctx, C.uint32_t(x.f.id), C.uint32_t(layer), C.uint64_t(stream)))
}

// WaitLayer blocks until layer is scattered; it returns an error wrapping
// ErrIO if one of its entries failed (its pages were not written).
func (x *Restore) WaitLayer(layer int) error {
	if err := x.fed(layer); err != nil {
		return fmt.Errorf("waiting for layer %d: %w", layer, err)
	}
	return status(fmt.Sprintf("waiting for layer %d", layer),
		C.tkl_restore_wait_layer(x.r.ctx, C.uint32_t(x.f.id), C.uint32_t(layer)))
}

// Result is the outcome of a whole restore.
type Result struct {
	Entries         []EntryResult // layer-major; valid until Release
	EntriesPerLayer int
	LayerMs         []float32 // per layer: ms from submit until scattered
	Failed          []*EntryError
	FailedPages     int // (layer, page) pairs not written because an entry failed
}

// Wait blocks until every layer is done. err wraps ErrIO (or ErrRingBroken)
// when entries failed; Result lists them. The pages of a failed entry keep
// whatever the KV memory held before: they were never scattered.
func (x *Restore) Wait() (*Result, error) {
	if err := x.fed(x.f.first + x.f.layers - 1); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	s := &x.r.slots[x.f.id]
	n := x.f.layers * x.epl
	st := C.tkl_restore_wait(x.r.ctx, C.uint32_t(x.f.id), (*C.tk_entry_result)(unsafe.Pointer(&s.results[0])),
		C.uint32_t(n), (*C.float)(unsafe.Pointer(&s.layerMs[0])), C.uint32_t(x.f.layers))
	res := &Result{Entries: s.results[:n], EntriesPerLayer: x.epl, LayerMs: s.layerMs[:x.f.layers]}
	err := status("restore", st)
	if err != nil && !errors.Is(err, ErrIO) && !errors.Is(err, ErrRingBroken) {
		return res, err
	}
	for e, er := range res.Entries {
		if er.Status != EntryOK {
			res.Failed = append(res.Failed, &EntryError{Layer: x.f.first + e/x.epl, Entry: e % x.epl,
				Extent: int(s.extents[e%x.epl]), Offset: int64(s.entries[e].Offset), Result: er})
		}
	}
	if len(res.Failed) > 0 {
		res.FailedPages = failedPages(s.pages, res.Entries, x.epl)
		errs := make([]error, 0, 4)
		errs = append(errs, err)
		for i, f := range res.Failed {
			if i == 3 {
				errs = append(errs, fmt.Errorf("and %d more failed entries", len(res.Failed)-3))
				break
			}
			errs = append(errs, f)
		}
		return res, errors.Join(errs...)
	}
	return res, err
}

// Release frees the request slot (waiting for the GPU if it is still busy).
func (x *Restore) Release() error {
	if x.released {
		return nil
	}
	submitted := x.r.feed.waitDone(&x.f) // the feeder is done with it
	x.r.mu.Lock()
	defer x.r.mu.Unlock()
	x.released = true
	x.r.live--
	x.r.helper.end()
	if !submitted {
		x.r.putPlan(&x.f)
		return nil // never submitted (refused, or the feeder stopped first): no request to release
	}
	return status("releasing restore", C.tkl_restore_release(x.r.ctx, C.uint32_t(x.f.id)))
}

// ---- host-issued paths and saves: copies between host object layout and the KV tensors.
