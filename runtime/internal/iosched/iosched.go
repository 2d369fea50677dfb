// Package iosched is a store's scheduler wiring: every load read and save
// write goes through sched.Planner (a GPU load as one Whole restore, retired
// layer by layer), which decides the load-versus-recompute split, admits
// saves (partially when its budgets are short) and hands out I/O in
// least-slack order, deferring writes into the reads' slack within the save
// bound. The planner is not safe for concurrent use; Scheduler serialises it
// and one dispatcher goroutine routes what Dispatch hands out to the channel
// of the request that owns it (whose driver goroutine stages and submits
// it). Everything the store asks of the planner goes through a method here,
// so no caller takes the planner's lock.
package iosched

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tutti-io/tutti/sched"
)

// Route receives the I/O the planner dispatched for one request. Sends on it
// must never block: its buffer holds every I/O its request can have.
type Route chan<- sched.IO

// Scheduler is the planner of one store behind its lock, with the
// dispatcher goroutine. Its methods are safe for concurrent use.
type Scheduler struct {
	mu      sync.Mutex
	p       *sched.Planner
	startAt time.Time
	routes  map[uint64]Route
	nextID  uint64
	buf     []sched.IO
	// readSeenNs: per device, when its model last saw reads (a load's, or a
	// re-probe; Open's probe at 0).
	readSeenNs []atomic.Int64

	kick chan struct{}
	quit chan struct{}
	done chan struct{}
}

// New starts the scheduler of cfg and its dispatcher; Close stops it.
func New(cfg sched.Config) (*Scheduler, error) {
	p, err := sched.NewPlanner(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting the scheduler: %w", err)
	}
	sc := &Scheduler{
		p:          p,
		startAt:    time.Now(),
		routes:     make(map[uint64]Route),
		readSeenNs: make([]atomic.Int64, len(cfg.Devices)),
		kick:       make(chan struct{}, 1),
		quit:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	go sc.loop()
	return sc, nil
}

// NowNs is the scheduler's clock: nanoseconds since New.
func (sc *Scheduler) NowNs() int64 { return int64(time.Since(sc.startAt)) }

func (sc *Scheduler) poke() {
	select {
	case sc.kick <- struct{}{}:
	default:
	}
}

// PlanLoad plans req (its ID and NowNs are filled in) and routes its reads
// to r. With no block admitted nothing is routed. A Whole request (the GPU
// path) gets a dispatch round here: its IORestore is routed before PlanLoad
// returns unless saves near their bound hold it, so a GPU load is submitted
// from the caller's goroutine, with no hop through the dispatcher's. Every
// read routed must be retired (Complete; CompleteLayers first for a Whole
// restore).
func (sc *Scheduler) PlanLoad(req sched.LoadRequest, r Route) (sched.Plan, error) {
	sc.mu.Lock()
	sc.nextID++
	req.ID = sc.nextID
	req.NowNs = sc.NowNs()
	plan, err := sc.p.PlanLoad(req)
	if err == nil && plan.LoadBlocks > 0 {
		sc.routes[req.ID] = r
		if req.Whole {
			sc.dispatchLocked(req.NowNs)
		}
	}
	sc.mu.Unlock()
	if err != nil {
		return plan, fmt.Errorf("planning load: %w", err)
	}
	sc.poke()
	return plan, nil
}

// AskLoad is how many blocks PlanLoad would load of req now, asked and
// withdrawn under the lock (sched.Planner.Cancel), so that no read of it is
// ever dispatched: a lookup that commits to a hit before it loads.
func (sc *Scheduler) AskLoad(req sched.LoadRequest) (sched.Plan, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.nextID++
	req.ID, req.NowNs = sc.nextID, sc.NowNs()
	plan, err := sc.p.PlanLoad(req)
	if err != nil {
		return plan, fmt.Errorf("asking for a load plan: %w", err)
	}
	sc.p.Cancel(plan.ID)
	return plan, nil
}

// EnqueueSave admits the leading blocks of a run's save (the ticket says
// how many, and how many writes will be routed to r) and returns the
// request's id, which its routed writes carry as ReqID.
func (sc *Scheduler) EnqueueSave(req sched.SaveRequest, r Route) (uint64, sched.SaveTicket, error) {
	sc.mu.Lock()
	sc.nextID++
	req.ID = sc.nextID
	req.NowNs = sc.NowNs()
	t, err := sc.p.EnqueueSave(req)
	if err == nil && t.Blocks > 0 {
		sc.routes[req.ID] = r
	}
	sc.mu.Unlock()
	if err != nil {
		return 0, t, fmt.Errorf("enqueueing save: %w", err)
	}
	sc.poke()
	return req.ID, t, nil
}

// TakeRouted appends to dst every I/O routed to ios so far. It holds the
// lock that dispatch rounds route under, so a round in progress has routed
// all of its I/O first: the caller sees a round whole and can order it
// (routing never blocks, so holding the lock while draining cannot
// deadlock).
func (sc *Scheduler) TakeRouted(ios <-chan sched.IO, dst []sched.IO) []sched.IO {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return drainIOs(ios, dst)
}

// drainIOs appends to dst the I/O waiting in ios, without blocking.
func drainIOs(ios <-chan sched.IO, dst []sched.IO) []sched.IO {
	for {
		select {
		case io := <-ios:
			dst = append(dst, io)
		default:
			return dst
		}
	}
}

// Complete retires a dispatched I/O. last says the request has no more
// I/O, so its route is dropped.
func (sc *Scheduler) Complete(io sched.IO, last bool) {
	sc.mu.Lock()
	err := sc.p.Complete(io.ID, sc.NowNs())
	if last {
		delete(sc.routes, io.ReqID)
	}
	sc.mu.Unlock()
	if err != nil {
		// Only a runtime bug gets here (an I/O completed twice).
		panic(fmt.Sprintf("iosched: %v", err))
	}
	sc.poke()
}

// CompleteLayers retires layers [0, layers) of a dispatched IORestore: the
// GPU has them in HBM, so their reads no longer hold saves back.
func (sc *Scheduler) CompleteLayers(io sched.IO, layers int) {
	sc.mu.Lock()
	err := sc.p.CompleteLayers(io.ID, layers, sc.NowNs())
	sc.mu.Unlock()
	if err != nil {
		// Only a runtime bug gets here (a restore retired twice).
		panic(fmt.Sprintf("iosched: %v", err))
	}
	sc.poke()
}

// ObserveReads feeds the device model with a load's reads as one batch.
func (sc *Scheduler) ObserveReads(dev int, bytes int64, ops int, busyNs int64) {
	sc.mu.Lock()
	sc.p.ObserveReads(dev, bytes, ops, busyNs, false)
	sc.mu.Unlock()
	sc.ReadsSeen(dev)
}

// ReadsSeen records that device dev's model saw reads now.
func (sc *Scheduler) ReadsSeen(dev int) { sc.readSeenNs[dev].Store(sc.NowNs()) }

// ReadsStale is whether device dev's model saw no reads for every.
func (sc *Scheduler) ReadsStale(dev int, every time.Duration) bool {
	return sc.NowNs()-sc.readSeenNs[dev].Load() >= int64(every)
}

// RemeasureReads sets device dev's read rate to a fresh measurement.
func (sc *Scheduler) RemeasureReads(dev int, bytesPerSec float64) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.p.RemeasureReads(dev, bytesPerSec)
}

// ObserveWrites feeds the device model with a finished save's writes.
func (sc *Scheduler) ObserveWrites(dev int, bytes int64, ops int, busyNs int64, withReads bool) {
	sc.mu.Lock()
	sc.p.ObserveWrites(dev, bytes, ops, busyNs, withReads)
	sc.mu.Unlock()
}

// Device is device dev's model as the scheduler holds it now.
func (sc *Scheduler) Device(dev int) sched.DeviceModel {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.p.Device(dev)
}

// Stats is the planner's counters.
func (sc *Scheduler) Stats() sched.Stats {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.p.Stats()
}

func (sc *Scheduler) loop() {
	defer close(sc.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		sc.mu.Lock()
		now := sc.NowNs()
		wake := sc.dispatchLocked(now)
		sc.mu.Unlock()
		if wake != math.MaxInt64 {
			timer.Reset(time.Duration(max(wake-now, 0)))
		}
		select {
		case <-sc.kick:
		case <-timer.C:
		case <-sc.quit:
			return
		}
	}
}

// DispatchNow runs one dispatch round now, as the dispatcher does after
// every request and completion: a test's way to see what a round hands out
// without racing the dispatcher for it.
func (sc *Scheduler) DispatchNow() {
	sc.mu.Lock()
	sc.dispatchLocked(sc.NowNs())
	sc.mu.Unlock()
}

// dispatchLocked runs one dispatch round (sc.mu held), routes what it
// handed out and returns when the next round is due.
func (sc *Scheduler) dispatchLocked(nowNs int64) (wakeNs int64) {
	sc.buf = sc.p.Dispatch(nowNs, sc.buf[:0])
	for _, io := range sc.buf {
		sc.routes[io.ReqID] <- io
	}
	return sc.p.NextWakeNs()
}

// Close stops the dispatcher (every request retired or given up first).
func (sc *Scheduler) Close() {
	close(sc.quit)
	<-sc.done
}
