package runtime

// The scheduler wiring: every load read and save write goes through
// sched.Planner (a GPU load as one Whole restore, retired layer by layer),
// which decides the load-versus-recompute split, admits saves (partially
// when its budgets are short) and hands out I/O in least-slack order,
// deferring writes into the reads' slack within the save bound. The planner
// is not safe for concurrent use; scheduler serialises it and one
// dispatcher goroutine routes what Dispatch hands out to the Load or Save
// that owns it (whose driver goroutine stages and submits it).

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tutti-io/tutti/sched"
)

// ioRoute receives the I/O the planner dispatched for one request. route must
// not block: receivers buffer every I/O their request can have.
type ioRoute interface {
	route(io sched.IO)
}

type scheduler struct {
	mu      sync.Mutex
	p       *sched.Planner
	startAt time.Time
	routes  map[uint64]ioRoute
	nextID  uint64
	buf     []sched.IO
	// readSeenNs: per device, when its model last saw reads (a load's, or a
	// re-probe; Open's probe at 0).
	readSeenNs []atomic.Int64

	kick chan struct{}
	quit chan struct{}
	done chan struct{}
}

func newScheduler(cfg sched.Config) (*scheduler, error) {
	p, err := sched.NewPlanner(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting the scheduler: %w", err)
	}
	sc := &scheduler{
		p:          p,
		startAt:    time.Now(),
		routes:     make(map[uint64]ioRoute),
		readSeenNs: make([]atomic.Int64, len(cfg.Devices)),
		kick:       make(chan struct{}, 1),
		quit:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	go sc.loop()
	return sc, nil
}

func (sc *scheduler) nowNs() int64 { return int64(time.Since(sc.startAt)) }

func (sc *scheduler) poke() {
	select {
	case sc.kick <- struct{}{}:
	default:
	}
}

// planLoad plans req (its ID and NowNs are filled in) and routes its reads
// to r. With no block admitted nothing is routed. A Whole request (the GPU
// path) gets a dispatch round here: its IORestore is routed before planLoad
// returns unless saves near their bound hold it, so a GPU load is submitted
// from the caller's goroutine, with no hop through the dispatcher's.
func (sc *scheduler) planLoad(req sched.LoadRequest, r ioRoute) (sched.Plan, error) {
	sc.mu.Lock()
	sc.nextID++
	req.ID = sc.nextID
	req.NowNs = sc.nowNs()
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

// enqueueSave admits the leading blocks of a run's save and routes its
// writes to r.
func (sc *scheduler) enqueueSave(req sched.SaveRequest, r ioRoute) (uint64, sched.SaveTicket, error) {
	sc.mu.Lock()
	sc.nextID++
	req.ID = sc.nextID
	req.NowNs = sc.nowNs()
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

// takeRouted appends to dst every I/O routed to ios so far. It holds the
// lock that dispatch rounds route under, so a round in progress has routed
// all of its I/O first: the caller sees a round whole and can order it
// (route never blocks, so holding the lock while draining cannot deadlock).
func (sc *scheduler) takeRouted(ios chan sched.IO, dst []sched.IO) []sched.IO {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return drainIOs(ios, dst)
}

// drainIOs appends to dst the I/O waiting in ios, without blocking.
func drainIOs(ios chan sched.IO, dst []sched.IO) []sched.IO {
	for {
		select {
		case io := <-ios:
			dst = append(dst, io)
		default:
			return dst
		}
	}
}

// complete retires a dispatched I/O. last says the request has no more
// I/O, so its route is dropped.
func (sc *scheduler) complete(io sched.IO, last bool) {
	sc.mu.Lock()
	err := sc.p.Complete(io.ID, sc.nowNs())
	if last {
		delete(sc.routes, io.ReqID)
	}
	sc.mu.Unlock()
	if err != nil {
		// Only a runtime bug gets here (an I/O completed twice).
		panic(fmt.Sprintf("runtime: scheduler: %v", err))
	}
	sc.poke()
}

// completeLayers retires layers [0, layers) of a dispatched IORestore: the
// GPU has them in HBM, so their reads no longer hold saves back.
func (sc *scheduler) completeLayers(io sched.IO, layers int) {
	sc.mu.Lock()
	err := sc.p.CompleteLayers(io.ID, layers, sc.nowNs())
	sc.mu.Unlock()
	if err != nil {
		// Only a runtime bug gets here (a restore retired twice).
		panic(fmt.Sprintf("runtime: scheduler: %v", err))
	}
	sc.poke()
}

// observeReads feeds the device model with a load's reads as one batch.
func (sc *scheduler) observeReads(dev int, bytes int64, ops int, busyNs int64) {
	sc.mu.Lock()
	sc.p.ObserveReads(dev, bytes, ops, busyNs, false)
	sc.mu.Unlock()
	sc.readsSeen(dev)
}

// readsSeen records that device dev's model saw reads now.
func (sc *scheduler) readsSeen(dev int) { sc.readSeenNs[dev].Store(sc.nowNs()) }

// readsStale is whether device dev's model saw no reads for every.
func (sc *scheduler) readsStale(dev int, every time.Duration) bool {
	return sc.nowNs()-sc.readSeenNs[dev].Load() >= int64(every)
}

// remeasureReads sets device dev's read rate to a fresh measurement.
func (sc *scheduler) remeasureReads(dev int, bytesPerSec float64) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.p.RemeasureReads(dev, bytesPerSec)
}

// observeWrites feeds the device model with a finished save's writes.
func (sc *scheduler) observeWrites(dev int, bytes int64, ops int, busyNs int64, withReads bool) {
	sc.mu.Lock()
	sc.p.ObserveWrites(dev, bytes, ops, busyNs, withReads)
	sc.mu.Unlock()
}

// device is device dev's model as the scheduler holds it now.
func (sc *scheduler) device(dev int) sched.DeviceModel {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.p.Device(dev)
}

func (sc *scheduler) stats() sched.Stats {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.p.Stats()
}

func (sc *scheduler) loop() {
	defer close(sc.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		sc.mu.Lock()
		now := sc.nowNs()
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

// dispatchLocked runs one dispatch round (sc.mu held), routes what it
// handed out and returns when the next round is due.
func (sc *scheduler) dispatchLocked(nowNs int64) (wakeNs int64) {
	sc.buf = sc.p.Dispatch(nowNs, sc.buf[:0])
	for _, io := range sc.buf {
		sc.routes[io.ReqID].route(io)
	}
	return sc.p.NextWakeNs()
}

func (sc *scheduler) close() {
	close(sc.quit)
	<-sc.done
}
