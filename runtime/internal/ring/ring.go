// Package ring is the goroutine that owns a store's io_uring engine: engines
// are single-issuer, so every I/O of the CPU side (a load's reads on
// PathCPU, every save write) is handed to one Worker, which submits it,
// runs the completions and tells each request's owner. Requests live in
// their owners (staging slots, write buffers), allocated once: nothing is
// allocated per I/O, and the queue is bounded by the engine's depth.
package ring

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tutti-io/tutti/uring"
)

// Owner is told when one of its requests completed. IODone runs on the
// worker goroutine that owns the engine: it must not block (record the
// result, signal a buffered channel, return).
type Owner interface {
	IODone(r *Req)
}

// Req is one I/O: a uring.Completion (prepared with one of its Prep calls)
// plus who to tell. Requests live in staging slots and write buffers,
// allocated once; nothing is allocated per I/O.
type Req struct {
	C     uring.Completion
	Owner Owner
	// Set by the worker before IODone: bytes transferred and error.
	Result int64
	Err    error
}

// Worker is the one goroutine that owns a uring.Engine (engines are
// single-issuer). Requests arrive on a bounded channel; at most depth are
// in the engine at once.
type Worker struct {
	name  string
	eng   uring.Engine
	depth int
	reqs  chan *Req
	quit  chan struct{}
	done  chan struct{}

	mu     sync.Mutex
	broken error // set when the engine failed as a whole; later requests fail with it

	inflight []*Req // requests in the engine, for failing them if the engine breaks
	onDone   func(*uring.Completion)
}

// ErrClosed fails the requests submitted after Close began.
var ErrClosed = errors.New("ring: I/O worker closed")

// New starts the worker of eng (which it owns from now on: Close closes it);
// name prefixes its errors, depth bounds the requests in the engine.
func New(name string, eng uring.Engine, depth int) *Worker {
	w := &Worker{
		name:     name,
		eng:      eng,
		depth:    depth,
		reqs:     make(chan *Req, depth),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		inflight: make([]*Req, 0, depth),
	}
	w.onDone = w.complete
	go w.loop()
	return w
}

// Submit hands r (prepared with a Prep* call of r.C) to the worker. It
// blocks only while the request queue is full (bounded); r.Owner.IODone is
// called exactly once, on the worker goroutine, also when the worker is
// closing or broken (r.Err says why). r must not be touched until then.
func (w *Worker) Submit(r *Req) {
	r.C.Context = r
	r.C.Callback = w.onDone
	select {
	case w.reqs <- r:
	case <-w.done:
		r.Result, r.Err = 0, ErrClosed
		r.Owner.IODone(r)
	}
}

// complete is the engine callback, on the worker goroutine.
func (w *Worker) complete(c *uring.Completion) {
	r := c.Context.(*Req)
	for i, x := range w.inflight {
		if x == r {
			last := len(w.inflight) - 1
			w.inflight[i] = w.inflight[last]
			w.inflight[last] = nil
			w.inflight = w.inflight[:last]
			break
		}
	}
	r.Result, r.Err = c.Result, c.Err
	r.Owner.IODone(r)
}

func (w *Worker) fail(r *Req, err error) {
	r.Result, r.Err = 0, err
	r.Owner.IODone(r)
}

func (w *Worker) loop() {
	defer close(w.done)
	quitting := false
	for {
		// Take new requests while the engine has room; block only when
		// nothing is in flight.
		for len(w.inflight) < w.depth {
			var r *Req
			if len(w.inflight) == 0 {
				if quitting {
					return
				}
				select {
				case r = <-w.reqs:
				case <-w.quit:
					quitting = true
					continue
				}
			} else {
				select {
				case r = <-w.reqs:
				default:
				}
			}
			if r == nil {
				break
			}
			if err := w.brokenErr(); err != nil {
				w.fail(r, err)
				continue
			}
			if err := w.eng.Submit(&r.C); err != nil {
				w.fail(r, fmt.Errorf("%s: submit: %w", w.name, err))
				continue
			}
			w.inflight = append(w.inflight, r)
		}
		if len(w.inflight) == 0 {
			continue
		}
		if err := w.eng.Flush(1); err != nil {
			// The engine as a whole failed (not one op: those come back in
			// callbacks). Fail what it holds and everything after.
			err = fmt.Errorf("%s: flush: %w", w.name, err)
			w.mu.Lock()
			w.broken = err
			w.mu.Unlock()
			for _, r := range w.inflight {
				w.fail(r, err)
			}
			w.inflight = w.inflight[:0]
		}
	}
}

func (w *Worker) brokenErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.broken
}

// Close waits until every submitted request completed, then closes the
// engine. No Submit may start after Close.
func (w *Worker) Close() error {
	close(w.quit)
	<-w.done
	// Requests that raced with quit: fail them.
	for {
		select {
		case r := <-w.reqs:
			w.fail(r, ErrClosed)
			continue
		default:
		}
		break
	}
	return w.eng.Close()
}
