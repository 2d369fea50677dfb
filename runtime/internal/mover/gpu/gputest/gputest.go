// Package gputest is PathGPU's restorer without a GPU, for tests (test
// support: no product package imports it). The "device" KV memory is host
// memory; a restore reads each layer's extents with pread and scatters them
// into the pages as the scatter kernel does, layer after layer on its own
// goroutine, and GatherLane copies pages out in object layout. Its gather
// lanes are checked as the library checks them (range, one call per lane
// at a time, MaxPages, 16-byte alignment), and its requests by
// kernels.BuildPlan under the store's kernels limits, and at most the
// kernels' MaxRequests restores are live (unreleased) at once, so a mover
// that shares a lane, misaligns a gather, builds a request the kernels
// refuse or has more restores live than they take fails in CI too.
package gputest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/mover/cpu"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu"
	"github.com/tutti-io/tutti/uring"
)

// Restorer is the CPU's gpu.Restorer. With a gate, each layer of a restore
// waits for a token first, so a test holds a restore in flight for as long
// as it likes.
type Restorer struct {
	v        *cpu.Views
	g        kvshape.Geometry
	maxPages int
	gate     chan struct{}
	laneBusy []atomic.Bool // per gather lane: a GatherLane call holds it
	// OnGather, if set, runs in every GatherLane call before it copies (on
	// the caller's goroutine, with the lane held).
	OnGather func(lane int)
	// NoIO: layers complete at once, nothing read (the Go side's own cost).
	NoIO bool
	// FailEntry, if set, fails the entry of (layer, extent) with EIO.
	FailEntry func(layer, extent int) bool

	lim kernels.Limits // what the store binds the kernels for

	mu       sync.Mutex
	events   map[uintptr]chan struct{} // NewEvent's, closed by Complete
	restores int                       // Restore calls the plan accepted
	live     int                       // restores not released yet (kernels.Limits.MaxRequests at most)
	maxLive  int                       // the most live at once
	last     kernels.Request           // the last of them
	plan     kernels.Plan
}

// New is the restorer of kv (host memory of numPages pages of cfg's
// geometry in its layout, checked by the caller) for a mover bound with
// cfg; gate, if not nil, holds each layer of a restore until a token.
func New(cfg gpu.Config, kv []mover.Region, gate chan struct{}) *Restorer {
	return &Restorer{v: cpu.NewViews(cfg.Geometry, cfg.Layout, cfg.NumPages, kv), g: cfg.Geometry, maxPages: cfg.MaxPages,
		gate: gate, laneBusy: make([]atomic.Bool, gatherLanes), lim: kernels.PlanLimits(gpu.KernelsConfig(cfg, nil, nil))}
}

// NewEvent is a CPU stand-in for an engine's CUDA event recorded behind its
// writes of the pages (GatherLane's afterEvent): a gather given it copies
// only after Complete, as the device's copies would wait for the event.
func (c *Restorer) NewEvent() uintptr {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.events == nil {
		c.events = map[uintptr]chan struct{}{}
	}
	ev := uintptr(0xE0000 + len(c.events)*16) // any distinct non-zero value
	c.events[ev] = make(chan struct{})
	return ev
}

// Complete completes NewEvent's ev: the engine's writes before it are done.
func (c *Restorer) Complete(ev uintptr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.events[ev])
}

// Calls is how many restores the kernels' plan accepted.
func (c *Restorer) Calls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.restores
}

// MaxLive is the most restores that were live at once.
func (c *Restorer) MaxLive() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxLive
}

// Last is the last request the kernels' plan accepted.
func (c *Restorer) Last() kernels.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// Restore checks req as the kernels would and starts reading it.
func (c *Restorer) Restore(req kernels.Request) (gpu.Restoration, error) {
	if req.FirstLayer != 0 || len(req.Layers) != c.g.Layers {
		return nil, fmt.Errorf("cpu restorer: layers [%d, +%d) of %d: %w", req.FirstLayer, len(req.Layers), c.g.Layers, kernels.ErrInvalid)
	}
	c.mu.Lock()
	// What the kernels would refuse is refused here too.
	err := kernels.BuildPlan(c.g, c.lim, req, &c.plan)
	if err == nil && c.live >= c.lim.MaxRequests {
		err = fmt.Errorf("%d restores live: %w", c.live, kernels.ErrBusy)
	}
	if err == nil {
		c.restores++
		c.live++
		c.maxLive = max(c.maxLive, c.live)
		c.last = req
	}
	c.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("cpu restorer: %w", err)
	}
	x := &cpuRestore{c: c, req: req, done: make([]chan struct{}, c.g.Layers), failed: make([][]*kernels.EntryError, c.g.Layers)}
	for l := range x.done {
		x.done[l] = make(chan struct{})
	}
	go x.run()
	return x, nil
}

// gatherLanes is the restorer's gather lanes: the kernels' default.
const gatherLanes = 8

// GatherLanes is the restorer's lanes.
func (c *Restorer) GatherLanes() int { return len(c.laneBusy) }

// GatherLane copies pages of one layer out in object layout, with their
// planes' CRC32C, as the kernels do: after afterEvent (NewEvent's) completed,
// where not 0; an event not NewEvent's is ErrInvalid.
func (c *Restorer) GatherLane(lane int, pages []int32, firstLayer, layers int, dst uintptr, layerStride int64, planeCRCs []uint32, afterEvent uintptr) error {
	n := int64(len(pages)) * c.g.PageBytesPerLayer()
	switch {
	case lane < 0 || lane >= len(c.laneBusy):
		return fmt.Errorf("cpu restorer: gather lane %d of %d: %w", lane, len(c.laneBusy), kernels.ErrInvalid)
	case layers != 1:
		return fmt.Errorf("cpu restorer: gather of %d layers: %w", layers, kernels.ErrNotSupported)
	case len(pages) == 0 || len(pages) > c.maxPages || firstLayer < 0 || firstLayer >= c.g.Layers || layerStride < n ||
		dst%16 != 0 || layerStride%16 != 0:
		return fmt.Errorf("cpu restorer: gather of %d pages (max %d), layer %d, dst %#x, stride %d: %w",
			len(pages), c.maxPages, firstLayer, dst, layerStride, kernels.ErrInvalid)
	}
	if !c.laneBusy[lane].CompareAndSwap(false, true) {
		return fmt.Errorf("cpu restorer: gather lane %d is in another call: %w", lane, kernels.ErrBusy)
	}
	defer c.laneBusy[lane].Store(false)
	if c.OnGather != nil {
		c.OnGather(lane)
	}
	if afterEvent != 0 {
		c.mu.Lock()
		done, ok := c.events[afterEvent]
		c.mu.Unlock()
		if !ok {
			return fmt.Errorf("cpu restorer: gather after event %#x, not one of NewEvent's: %w", afterEvent, kernels.ErrInvalid)
		}
		<-done
	}
	if planeCRCs != nil && len(planeCRCs) != len(pages)*c.g.Planes {
		return fmt.Errorf("cpu restorer: %d plane CRCs for %d pages: %w", len(planeCRCs), len(pages), kernels.ErrInvalid)
	}
	out := cpu.View(dst, n)
	c.v.CopyPages(firstLayer, pages, 0, n, out, false)
	// The kernels' contract: each plane's CRC32C, as the GPU computes it
	// from the KV (here from the bytes just gathered, which are the same).
	ppb := c.g.PageBytesPerPlane()
	for k := range planeCRCs {
		planeCRCs[k] = objmap.CRC32C(out[int64(k)*ppb : int64(k+1)*ppb])
	}
	return nil
}

// FixedBuffers, Wakeups, BatchTimeouts and Close: a restorer with nothing
// to report or release.
func (c *Restorer) FixedBuffers() (bool, error) { return true, nil }
func (c *Restorer) Wakeups() int64              { return 0 }
func (c *Restorer) BatchTimeouts() int64        { return 0 }
func (c *Restorer) Close() error                { return nil }

type cpuRestore struct {
	c        *Restorer
	released atomic.Bool
	req      kernels.Request
	done     []chan struct{}         // closed once the layer is scattered
	failed   [][]*kernels.EntryError // per layer, written before done closes
}

func (x *cpuRestore) run() {
	g := x.c.g
	var buf *uring.Buffer
	defer func() {
		if buf != nil {
			_ = buf.Free()
		}
	}()
	for l := 0; l < g.Layers; l++ {
		if x.c.gate != nil {
			<-x.c.gate
		}
		page := 0
		for e, ext := range x.req.Layers[l] {
			if x.c.NoIO {
				break
			}
			n := int64(ext.Pages) * g.PageBytesPerLayer()
			align := int64(max(ext.Align, 1))
			lo := ext.Offset / align * align
			hi := (ext.Offset + n + align - 1) / align * align
			if buf == nil || int64(buf.Len()) < hi-lo {
				if buf != nil {
					_ = buf.Free()
				}
				var err error
				if buf, err = uring.AllocBuffer(int(hi - lo)); err != nil {
					panic(fmt.Sprintf("cpu restorer: %v", err)) // test memory
				}
			}
			b := buf.Bytes()[:hi-lo]
			got, err := unix.Pread(int(ext.FD), b, lo)
			if x.c.FailEntry != nil && x.c.FailEntry(l, e) {
				err = syscall.EIO
			}
			switch {
			case err != nil:
				var errno syscall.Errno
				if !errors.As(err, &errno) {
					errno = syscall.EIO
				}
				x.failed[l] = append(x.failed[l], &kernels.EntryError{Layer: l, Entry: e, Extent: e, Offset: lo,
					Result: kernels.EntryResult{Status: kernels.EntryIOError, Res: -int32(errno)}})
			case int64(got) < ext.Offset-lo+n:
				x.failed[l] = append(x.failed[l], &kernels.EntryError{Layer: l, Entry: e, Extent: e, Offset: lo,
					Result: kernels.EntryResult{Status: kernels.EntryShort, Res: int32(got)}})
			default:
				x.c.v.CopyPages(l, x.req.Pages[page:], 0, n, b[ext.Offset-lo:ext.Offset-lo+n], true)
			}
			page += ext.Pages
		}
		close(x.done[l])
	}
}

func (x *cpuRestore) WaitLayer(layer int) error {
	if layer < 0 || layer >= len(x.done) {
		return fmt.Errorf("cpu restore: layer %d: %w", layer, kernels.ErrInvalid)
	}
	<-x.done[layer]
	if len(x.failed[layer]) > 0 {
		return fmt.Errorf("cpu restore: layer %d: %w", layer, kernels.ErrIO)
	}
	return nil
}

func (x *cpuRestore) StreamWaitLayer(layer int, _ uintptr) error { return x.WaitLayer(layer) }

func (x *cpuRestore) Wait() (*kernels.Result, error) {
	<-x.done[len(x.done)-1]
	res := &kernels.Result{}
	for _, f := range x.failed {
		res.Failed = append(res.Failed, f...)
	}
	if len(res.Failed) > 0 {
		return res, fmt.Errorf("cpu restore: %d entries failed: %w", len(res.Failed), kernels.ErrIO)
	}
	return res, nil
}

func (x *cpuRestore) Release() error {
	<-x.done[len(x.done)-1]
	if !x.released.Swap(true) {
		x.c.mu.Lock()
		x.c.live--
		x.c.mu.Unlock()
	}
	return nil
}
