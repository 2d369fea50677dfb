package kernels

import (
	"errors"
	"fmt"
	"sync"
)

// The feeder puts a restore's layers on the GPU's streams a few at a time.
//
// Why: enqueueing a layer (its I/O kernel, its scatter kernel and their
// events) blocks the calling thread once the GPU's command queue is full,
// some tens of layers. Enqueued all at once, a restore of a deep model held
// the engine's Load call until many layers had already been read: they all
// became ready at once, long after a CPU-issued path's first layer, and the
// engine could not start computing layer 0 before then.
//
// So Restore enqueues the first EnqueueLayers layers itself and returns; the
// feeder enqueues layer l once layer l-EnqueueLayers is scattered (a host
// wait on its event, which sleeps: blocking-sync events). Restores are fed
// one after another in submission order, since the staging slots are handed
// out in enqueue order: a restore waits in the queue, unsubmitted, until the
// one before it is entirely enqueued. On the GPU it would have waited anyway
// (the layers of both share one I/O stream).

// feedOps are the library calls the feeder makes (cFeed: the library; the
// tests: a simulated GPU). The feeder serializes submit and enqueue with the
// Restorer's other calls (Restorer.mu); waitLayer runs without it.
type feedOps interface {
	// submit enqueues the first layers layers of it and sets it.id.
	submit(it *feedItem, layers int) error
	// enqueue enqueues its layers up to (not including) upto.
	enqueue(it *feedItem, upto int) error
	// waitLayer blocks until the layer is scattered; ErrIO (a failed
	// entry) is not the feeder's concern.
	waitLayer(it *feedItem, layer int) error
}

// feedItem is one restore's enqueue state. fed and err are guarded by the
// feeder's mu; id and plan belong to whoever holds Restorer.mu.
type feedItem struct {
	first  int // the request's first layer (the library's waits take absolute layers)
	layers int
	id     uint32
	plan   *Plan // the descriptors until submitted (then back to the pool)
	fed    int   // layers enqueued; > 0 once submitted (id is a live request of the library)
	err    error // why the rest will never be enqueued
	done   bool  // the feeder is finished with it
}

// feeder owns the queue of restores that still have layers to enqueue.
type feeder struct {
	ops   feedOps
	lib   *sync.Mutex // Restorer.mu: serializes library calls that change the context
	ahead int         // layers enqueued beyond the last one scattered
	chunk int         // layers enqueued per wake-up (1..ahead)

	mu      sync.Mutex
	cond    sync.Cond
	queue   []*feedItem // the head is being fed; the rest wait unsubmitted
	stopped bool
	exited  chan struct{}
	// broken: why no restore can be fed any more. A failed enqueue leaves a
	// request with layers that will never be on the streams, while the I/O
	// kernels it did enqueue may still fill staging slots a later request
	// would take: fail closed, every later restore fails with it.
	broken error
}

func newFeeder(ops feedOps, lib *sync.Mutex, ahead, chunk int) *feeder {
	ahead = max(1, ahead)
	f := &feeder{ops: ops, lib: lib, ahead: ahead, chunk: min(max(1, chunk), ahead), exited: make(chan struct{})}
	f.cond.L = &f.mu
	go f.loop()
	return f
}

// start is called with f.lib held: it submits it at once when no restore is
// still being fed (the common case: no goroutine hop on the way to the GPU),
// and queues whatever is left to enqueue. It returns the error that ended it
// before anything was enqueued (the feeder broken or closing, or its submit
// failed; it.err says the same); the caller then owns it again. After a nil
// return it belongs to the feeder until it.done, and its fields are read
// under f.mu only.
func (f *feeder) start(it *feedItem) error {
	f.mu.Lock()
	broken := f.broken
	if f.stopped && broken == nil {
		broken = fmt.Errorf("restorer closing: %w", ErrInvalid) // no loop would feed it
	}
	if broken != nil || len(f.queue) > 0 {
		if broken != nil {
			it.err, it.done = broken, true
		} else {
			f.queue = append(f.queue, it) // the loop submits it after the ones before
			f.cond.Broadcast()
		}
		f.mu.Unlock()
		return broken
	}
	// The queue stays empty until we append: only start appends, and its
	// callers hold f.lib.
	f.mu.Unlock()
	_, err := f.submit(it)
	f.mu.Lock()
	switch {
	case err != nil:
		it.err, it.done = err, true
		f.breakOn(err, true)
	case it.fed == it.layers:
		it.done = true
	default:
		f.queue = append(f.queue, it)
	}
	f.cond.Broadcast()
	f.mu.Unlock()
	return err
}

// submit submits it with its first ahead layers enqueued, with f.lib held,
// and returns how many layers that is.
func (f *feeder) submit(it *feedItem) (fed int, err error) {
	n := min(it.layers, f.ahead)
	if err := f.ops.submit(it, n); err != nil {
		return 0, err
	}
	f.set(it, n)
	return n, nil
}

func (f *feeder) loop() {
	defer close(f.exited)
	for {
		f.mu.Lock()
		for len(f.queue) == 0 && !f.stopped {
			f.cond.Wait()
		}
		if len(f.queue) == 0 {
			f.mu.Unlock()
			return
		}
		it := f.queue[0]
		f.mu.Unlock()
		submitErr, err := f.feed(it)
		f.mu.Lock()
		if err != nil {
			it.err = err
			f.breakOn(err, submitErr)
		}
		it.done = true
		f.queue = f.queue[1:]
		f.cond.Broadcast()
		f.mu.Unlock()
	}
}

// feed submits it if it waited in the queue, then enqueues the rest of its
// layers, layer l once layer l-ahead is scattered: it waits for layer
// fed-ahead+chunk-1, then enqueues chunk layers (one wake-up per chunk; the
// GPU keeps at least ahead-chunk+1 layers queued). submitErr: err is the
// submit's.
func (f *feeder) feed(it *feedItem) (submitErr bool, err error) {
	f.mu.Lock()
	fed, broken := it.fed, f.broken
	f.mu.Unlock()
	if broken != nil {
		return false, broken
	}
	if fed == 0 { // waited in the queue unsubmitted
		f.lib.Lock()
		fed, err = f.submit(it)
		f.lib.Unlock()
		if err != nil {
			return true, err
		}
	}
	for fed < it.layers {
		upto := min(it.layers, fed+f.chunk)
		if err := f.ops.waitLayer(it, upto-1-f.ahead); err != nil && !errors.Is(err, ErrIO) {
			return false, fmt.Errorf("enqueueing layer %d: %w", fed, err)
		}
		f.lib.Lock()
		err := f.ops.enqueue(it, upto)
		f.lib.Unlock()
		if err != nil {
			return false, fmt.Errorf("enqueueing layer %d: %w", fed, err)
		}
		fed = upto
		f.set(it, fed)
	}
	return false, nil
}

// breakOn records err as the feeder's end, with f.mu held, unless it is a
// submit's that only refused one restore (a descriptor the library
// rejected, no free request slot): nothing of it reached the streams.
func (f *feeder) breakOn(err error, submit bool) {
	if submit && (errors.Is(err, ErrInvalid) || errors.Is(err, ErrBusy)) {
		return
	}
	if f.broken == nil {
		f.broken = fmt.Errorf("GPU restores stopped after a failed enqueue: %w", err)
	}
}

// set records fed (≥ 1) layers of a submitted it and wakes the waiters.
func (f *feeder) set(it *feedItem, fed int) {
	f.mu.Lock()
	it.fed = fed
	f.cond.Broadcast()
	f.mu.Unlock()
}

// waitFed blocks until layers [0, n) of it are enqueued. It returns the
// feeder's error when they never will be.
func (f *feeder) waitFed(it *feedItem, n int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for it.fed < n && !it.done {
		f.cond.Wait()
	}
	if it.fed < n {
		return fmt.Errorf("%d of %d layers enqueued: %w", it.fed, it.layers, it.err)
	}
	return nil
}

// waitDone blocks until the feeder is finished with it and says whether it
// was submitted (a live request of the library to release).
func (f *feeder) waitDone(it *feedItem) (submitted bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for !it.done {
		f.cond.Wait()
	}
	return it.fed > 0
}

// stop ends the feeder once its queue is empty (every restore released).
func (f *feeder) stop() {
	f.mu.Lock()
	f.stopped = true
	f.cond.Broadcast()
	f.mu.Unlock()
	<-f.exited
}
