package gpu

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/sched"
)

// restore is one load's restore on the GPU.
type restore struct {
	m *Mover
	r *mover.Restore
	// pieces are the request's extents: extent i of every layer is piece i
	// (drive maps failed entries back to runs by it).
	pieces  []piece
	devRead []int64  // the request's bytes on each device
	io      sched.IO // the scheduler's IORestore of it
	firstNs int64    // when it was submitted
	ios     int64
	err     error // the restore's error (driver)

	mu   sync.Mutex
	cond sync.Cond
	// x is the restore on the GPU: nil until submitted and after release;
	// ended once it will not be.
	x     Restoration
	ended bool
}

// Restore builds the load's GPU request and submits it once the scheduler
// dispatched it (Whole) and the GPU has a request slot for it (MaxRestores
// live at once): at once when the plan's round dispatched it and a slot is
// free, else from the restore's goroutine once saves near their bound no
// longer hold it and an earlier restore released its slot. A goroutine
// then waits for the GPU layer by layer.
func (m *Mover) Restore(r *mover.Restore) mover.StreamWaiter {
	rs := &restore{m: m, r: r}
	rs.cond.L = &rs.mu
	req := rs.request()
	select {
	case io := <-r.IOs:
		if m.trySlot() {
			rs.submit(io, req)
			go rs.drive()
			return rs
		}
		go func() {
			m.waitSlot()
			rs.submit(io, req)
			rs.drive()
		}()
	default:
		go func() {
			io := <-r.IOs
			if !m.trySlot() {
				m.waitSlot()
			}
			rs.submit(io, req)
			rs.drive()
		}()
	}
	return rs
}

// trySlot takes a GPU request slot for a restore if one is free.
func (m *Mover) trySlot() bool {
	select {
	case m.restoreSlots <- struct{}{}:
		return true
	default:
		return false
	}
}

// waitSlot takes a GPU request slot once one is free, counted as a wait.
func (m *Mover) waitSlot() {
	m.cfg.Counters.SlotWaits.Add(1)
	m.restoreSlots <- struct{}{}
}

// request is the kernels request of the restore's runs, cut into pieces
// ordered over the devices (pieces).
func (rs *restore) request() kernels.Request {
	cfg := rs.m.cfg
	g := cfg.Geometry
	runs := rs.r.Runs
	devs := make([]int, len(runs)) // where each run's layer 0 lies
	for i, r := range runs {
		devs[i] = cfg.Pool.Layout.LayerDevices(r.Info.File)[0]
	}
	rs.pieces = pieces(runs, devs, g, cfg.IOWindow, cfg.MaxIOBytes, cfg.MaxExtents())
	req := kernels.Request{Layers: make([][]kernels.Extent, g.Layers)}
	for _, p := range rs.pieces {
		base := (runs[p.run].ChainPos + p.first) * g.ChunkPages
		req.Pages = append(req.Pages, rs.r.Pages[base:base+p.k*g.ChunkPages]...)
	}
	for layer := range req.Layers {
		req.Layers[layer] = make([]kernels.Extent, 0, len(rs.pieces))
		for _, p := range rs.pieces {
			r := runs[p.run]
			loc, f := cfg.Pool.Object(r, layer, r.First+p.first)
			req.Layers[layer] = append(req.Layers[layer], kernels.Extent{FD: f.FD, Align: f.DirectAlign,
				Offset: loc.Offset, Pages: p.k * g.ChunkPages})
			for len(rs.devRead) <= loc.Device {
				rs.devRead = append(rs.devRead, 0)
			}
			rs.devRead[loc.Device] += (int64(p.k)*g.ChunkBytesPerLayer() + objmap.BlockBytes - 1) &^ (objmap.BlockBytes - 1)
		}
	}
	return req
}

// submit puts the dispatched restore io on the GPU. A refusal fails the
// whole load (MissGPU); drive still retires io.
func (rs *restore) submit(io sched.IO, req kernels.Request) {
	rs.io = io
	rs.firstNs = rs.m.cfg.Sched.NowNs()
	x, err := rs.m.r.Restore(req)
	if err != nil {
		rs.r.Load.Fail(0, mover.MissGPU, err)
	}
	rs.mu.Lock()
	if err != nil {
		rs.err, rs.ended = err, true
	} else {
		rs.x = x
		rs.ios = int64(rs.m.cfg.Geometry.Layers * len(rs.r.Runs))
		for dev, n := range rs.devRead {
			mover.Count(rs.m.cfg.Counters.ReadBytes, dev, n)
		}
	}
	rs.mu.Unlock()
	rs.cond.Broadcast()
}

// drive waits for the submitted restore layer by layer: each layer the GPU
// finished is done for the load and retired in the scheduler (its reads
// leave their devices' pending work, so saves queued behind them may go),
// failed entries are mapped to runs, the reads are reported to the device
// models, and the restore is released and retired.
func (rs *restore) drive() {
	rs.mu.Lock()
	x := rs.x
	rs.mu.Unlock()
	if x != nil {
		rs.wait(x) // released there
	}
	<-rs.m.restoreSlots // its slot, taken before submit, free again
	rs.m.cfg.Sched.Complete(rs.io, true)
	rs.r.Load.Done(mover.Result{IOs: rs.ios, Err: rs.err})
}

func (rs *restore) wait(x Restoration) {
	sc := rs.m.cfg.Sched
	for layer := 0; layer < rs.m.cfg.Geometry.Layers; layer++ {
		// ErrIO here is a failed entry: mapped to runs after Wait.
		if err := x.WaitLayer(layer); err != nil && !errors.Is(err, kernels.ErrIO) && rs.err == nil {
			rs.err = err
		}
		rs.r.Load.LayersDone(layer + 1)
		sc.CompleteLayers(rs.io, layer+1)
	}
	res, err := x.Wait()
	if res != nil {
		for _, f := range res.Failed {
			// Extent i of every layer is piece i (request); one out of
			// range fails the whole load.
			r := 0
			if f.Extent >= 0 && f.Extent < len(rs.pieces) {
				r = rs.pieces[f.Extent].run
			}
			rs.r.Load.Fail(r, mover.MissIOError, f)
		}
	}
	rs.observeReads()
	if err != nil && (res == nil || len(res.Failed) == 0) {
		rs.r.Load.Fail(0, mover.MissGPU, err)
		if rs.err == nil {
			rs.err = err
		}
	}
	rerr := x.Release()
	rs.mu.Lock()
	if rerr != nil && rs.err == nil {
		rs.err = fmt.Errorf("releasing the GPU restore: %w", rerr)
	}
	rs.x, rs.ended = nil, true
	rs.mu.Unlock()
}

// observeReads reports a finished restore's reads to each device's model:
// each piece's bytes of each layer to the device that holds that layer of
// its run, the reads counted as kernels cuts them (MaxIOBytes), busy from
// submission to the last layer.
func (rs *restore) observeReads() {
	cfg := rs.m.cfg
	g := cfg.Geometry
	now := cfg.Sched.NowNs()
	var bs []iosched.Batch
	for _, p := range rs.pieces {
		if !rs.r.Load.Valid(p.run) {
			continue
		}
		perLayer := (int64(p.k)*g.ChunkBytesPerLayer() + objmap.BlockBytes - 1) &^ (objmap.BlockBytes - 1)
		reads := (perLayer + int64(cfg.MaxIOBytes) - 1) / int64(cfg.MaxIOBytes)
		for _, dev := range cfg.Pool.Layout.LayerDevices(rs.r.Runs[p.run].Info.File) {
			b := iosched.BatchOf(&bs, dev)
			b.Bytes += perLayer
			b.Ops += reads
		}
	}
	for dev, b := range bs {
		if b.Ops > 0 {
			cfg.Sched.ObserveReads(dev, b.Bytes, int(b.Ops), now-rs.firstNs)
		}
	}
}

// StreamWaitLayer makes a CUDA stream wait until layer is in the KV
// tensors. A restore not submitted yet (the scheduler has not dispatched it,
// saves near their bound holding it, or it waits for a request slot that an
// earlier restore frees once its last layer is in) is not on the GPU's
// streams: it waits for its submission first, or the stream would not wait
// at all. Once the restore was
// released (or refused) there is nothing to wait for.
func (rs *restore) StreamWaitLayer(layer int, stream uintptr) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for rs.x == nil && !rs.ended {
		rs.cond.Wait()
	}
	if rs.x == nil {
		return nil // nothing in flight: the layer is as done as it gets
	}
	return rs.x.StreamWaitLayer(layer, stream)
}
