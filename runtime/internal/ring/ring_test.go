package ring

import (
	"errors"
	"sync"
	"testing"

	"github.com/tutti-io/tutti/uring"
)

// fakeEngine completes what it was given at its next Flush, each with
// result 7, or fails that Flush as a whole once broken is set.
type fakeEngine struct {
	mu       sync.Mutex
	queued   []*uring.Completion
	broken   error
	refuse   error // Submit's error, when set
	inFlight int
	maxSeen  int
	closed   bool
}

func (e *fakeEngine) Submit(c *uring.Completion) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.refuse != nil {
		return e.refuse
	}
	e.queued = append(e.queued, c)
	e.inFlight++
	e.maxSeen = max(e.maxSeen, e.inFlight)
	return nil
}

func (e *fakeEngine) Flush(int) error {
	e.mu.Lock()
	if e.broken != nil {
		err := e.broken
		e.mu.Unlock()
		return err
	}
	q := e.queued
	e.queued = nil
	e.inFlight -= len(q)
	e.mu.Unlock()
	for _, c := range q {
		c.Result = 7
		c.Callback(c)
	}
	return nil
}

func (e *fakeEngine) InFlight() int                           { e.mu.Lock(); defer e.mu.Unlock(); return e.inFlight }
func (e *fakeEngine) RegisterFiles(files []*uring.File) error { return nil }
func (e *fakeEngine) RegisterBuffers(b []*uring.Buffer) error { return nil }
func (e *fakeEngine) Close() error                            { e.closed = true; return nil }

// owner records the requests told done.
type owner struct{ done chan *Req }

func (o *owner) IODone(r *Req) { o.done <- r }

// TestWorker: every submitted request is told done once with its result;
// the engine never holds more than depth; a request the engine refuses, or
// every one after the engine broke, is told done with the error; Close
// closes the engine.
func TestWorker(t *testing.T) {
	const depth, n = 4, 64
	e := &fakeEngine{}
	w := New("test", e, depth)
	o := &owner{done: make(chan *Req, n+3)}
	reqs := make([]Req, n)
	for i := range reqs {
		reqs[i].Owner = o
		w.Submit(&reqs[i])
	}
	for range n {
		if r := <-o.done; r.Result != 7 || r.Err != nil {
			t.Fatalf("request done with %d, %v", r.Result, r.Err)
		}
	}
	if e.maxSeen > depth {
		t.Fatalf("%d requests in the engine at once, depth %d", e.maxSeen, depth)
	}

	refused := errors.New("refused")
	e.mu.Lock()
	e.refuse = refused
	e.mu.Unlock()
	r := Req{Owner: o}
	w.Submit(&r)
	if got := <-o.done; !errors.Is(got.Err, refused) {
		t.Fatalf("refused request: %v", got.Err)
	}

	broken := errors.New("ring fd gone")
	e.mu.Lock()
	e.refuse, e.broken = nil, broken
	e.mu.Unlock()
	a, b := Req{Owner: o}, Req{Owner: o}
	w.Submit(&a)
	if got := <-o.done; !errors.Is(got.Err, broken) {
		t.Fatalf("request on a broken engine: %v", got.Err)
	}
	w.Submit(&b)
	if got := <-o.done; !errors.Is(got.Err, broken) {
		t.Fatalf("request after the engine broke: %v", got.Err)
	}

	if err := w.Close(); err != nil || !e.closed {
		t.Fatalf("Close: %v, engine closed %v", err, e.closed)
	}
}
