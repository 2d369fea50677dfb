package runtime

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tutti-io/tutti/uring"
)

// ioOwner is told when one of its requests completed. ioDone runs on the
// worker goroutine that owns the engine: it must not block (record the
// result, signal a buffered channel, return).
type ioOwner interface {
	ioDone(r *ioReq)
}

// ioReq is one I/O: a uring.Completion plus who to tell. Requests live in
// staging slots and save states, allocated once; nothing is allocated per I/O.
type ioReq struct {
	c     uring.Completion
	owner ioOwner
	// Set by the worker before ioDone: bytes transferred and error.
	result int64
	err    error
}

// ioWorker is the one goroutine that owns a uring.Engine (engines are
// single-issuer). Requests arrive on a bounded channel; at most depth are
// in the engine at once.
type ioWorker struct {
	name  string
	eng   uring.Engine
	depth int
	reqs  chan *ioReq
	quit  chan struct{}
	done  chan struct{}

	mu     sync.Mutex
	broken error // set when the engine failed as a whole; later requests fail with it

	inflight []*ioReq // requests in the engine, for failing them if the engine breaks
	onDone   func(*uring.Completion)
}

var errWorkerClosed = errors.New("runtime: I/O worker closed")

func newIOWorker(name string, eng uring.Engine, depth int) *ioWorker {
	w := &ioWorker{
		name:     name,
		eng:      eng,
		depth:    depth,
		reqs:     make(chan *ioReq, depth),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		inflight: make([]*ioReq, 0, depth),
	}
	w.onDone = w.complete
	go w.loop()
	return w
}

// submit hands r (prepared with a Prep* call) to the worker. It blocks only
// while the request queue is full (bounded); r.owner.ioDone is called exactly
// once, on the worker goroutine, also when the worker is closing or broken.
func (w *ioWorker) submit(r *ioReq) {
	r.c.Context = r
	r.c.Callback = w.onDone
	select {
	case w.reqs <- r:
	case <-w.done:
		r.result, r.err = 0, errWorkerClosed
		r.owner.ioDone(r)
	}
}

// complete is the engine callback, on the worker goroutine.
func (w *ioWorker) complete(c *uring.Completion) {
	r := c.Context.(*ioReq)
	for i, x := range w.inflight {
		if x == r {
			last := len(w.inflight) - 1
			w.inflight[i] = w.inflight[last]
			w.inflight[last] = nil
			w.inflight = w.inflight[:last]
			break
		}
	}
	r.result, r.err = c.Result, c.Err
	r.owner.ioDone(r)
}

func (w *ioWorker) fail(r *ioReq, err error) {
	r.result, r.err = 0, err
	r.owner.ioDone(r)
}

func (w *ioWorker) loop() {
	defer close(w.done)
	quitting := false
	for {
		// Take new requests while the engine has room; block only when
		// nothing is in flight.
		for len(w.inflight) < w.depth {
			var r *ioReq
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
			if err := w.eng.Submit(&r.c); err != nil {
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

func (w *ioWorker) brokenErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.broken
}

// close waits until every submitted request completed, then closes the
// engine. No submit may start after close.
func (w *ioWorker) close() error {
	close(w.quit)
	<-w.done
	// Requests that raced with quit: fail them.
	for {
		select {
		case r := <-w.reqs:
			w.fail(r, errWorkerClosed)
			continue
		default:
		}
		break
	}
	return w.eng.Close()
}
