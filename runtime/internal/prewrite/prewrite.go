// Package prewrite is a store's background prewrite
// (objmap.Map.Prewrite): a store whose pool has unwritten extents
// (fallocate's) writes zeros over their free parts while no load or save
// runs, so that saves overwrite written blocks instead of paying the file
// system's conversion of each extent they land in. One write of at most
// stepBytes is in flight at a time, on one device; a load or save that
// starts meanwhile waits behind at most that one write on that device.
package prewrite

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tutti-io/tutti/objmap"
)

const (
	// stepBytes is one prewrite write: short enough that a load arriving
	// behind it is not held back long (a few ms on one device).
	stepBytes = 4 << 20
	// Idle is how long the store must have had no load or save before a
	// prewrite write starts; poll is how often it looks.
	Idle = 20 * time.Millisecond
	poll = 10 * time.Millisecond
	// maxErrors failed writes stop the prewrite for the store's life.
	maxErrors = 3
)

// Pool is what the prewrite uses of the object map (*objmap.Map).
type Pool interface {
	// Prewrite writes at most maxBytes of unwritten free space and
	// returns how much it wrote (0: nothing is left); objmap.ErrClosed
	// once the map closed.
	Prewrite(maxBytes int64) (int64, error)
	PrewriteLeftBytes() int64
	PrewrittenBytes() int64
	// PrewriteNote says why the pool cannot be prewritten ("" if it can).
	PrewriteNote() string
}

// State is where the prewrite is.
type State uint8

const (
	Off     State = iota // never started (turned off, or the pool cannot be prewritten)
	Running              // writing while no load or save runs
	Done                 // nothing unwritten is left
	Stopped              // stopped after too many failed writes
)

// Prewriter is a store's background prewrite. Its methods are safe for
// concurrent use.
type Prewriter struct {
	pool Pool
	// active counts the store's loads, saves and discards in flight
	// (Begin, End); lastEndNs is when the last one ended.
	active    atomic.Int64
	lastEndNs atomic.Int64

	quit chan struct{}
	done chan struct{} // closed when the goroutine ended (nil: never started)

	mu      sync.Mutex
	errs    int64
	lastErr string
	state   State
	reason  string
}

// Start starts the background prewrite of pool unless off (the reason then
// says who turned it off) or the pool has nothing unwritten; its first write
// comes after Idle without a load or save. Stop ends it.
func Start(pool Pool, off bool, reason string) *Prewriter {
	p := &Prewriter{pool: pool}
	switch {
	case off:
		p.state, p.reason = Off, reason
		return p
	case pool.PrewriteLeftBytes() == 0:
		p.state, p.reason = Done, "nothing unwritten"
		if note := pool.PrewriteNote(); note != "" {
			p.state, p.reason = Off, note
		}
		return p
	}
	p.state = Running
	// A store just opened is about to be used: the first write waits Idle
	// as after an operation (and a Begin right after Start is never behind
	// a write).
	p.lastEndNs.Store(time.Now().UnixNano())
	p.quit, p.done = make(chan struct{}), make(chan struct{})
	go p.loop()
	return p
}

// Begin says a load, save or discard started: no prewrite write starts
// until it ended (End) and the store stayed idle for Idle.
func (p *Prewriter) Begin() { p.active.Add(1) }

// End says an operation Begin counted ended.
func (p *Prewriter) End() {
	p.lastEndNs.Store(time.Now().UnixNano())
	p.active.Add(-1)
}

// Stop ends the goroutine and waits for it (before the map closes).
func (p *Prewriter) Stop() {
	if p.done == nil {
		return
	}
	close(p.quit)
	<-p.done
}

func (p *Prewriter) loop() {
	defer close(p.done)
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		if p.active.Load() > 0 || time.Since(time.Unix(0, p.lastEndNs.Load())) < Idle {
			select {
			case <-p.quit:
				return
			case <-tick.C:
			}
			continue
		}
		n, err := p.pool.Prewrite(stepBytes)
		switch {
		case errors.Is(err, objmap.ErrClosed):
			return
		case err != nil:
			p.mu.Lock()
			p.errs++
			p.lastErr = err.Error()
			stop := p.errs >= maxErrors
			if stop {
				p.state, p.reason = Stopped, fmt.Sprintf("%d failed writes", p.errs)
			}
			p.mu.Unlock()
			if stop {
				return
			}
		case n == 0:
			p.mu.Lock()
			p.state = Done
			p.mu.Unlock()
			return
		}
	}
}

// Stats is what the prewrite did: its state and why (off, done or
// stopped), the bytes it wrote and those left, its failed writes and the
// last one's error.
type Stats struct {
	State                   State
	Reason                  string
	WrittenBytes, LeftBytes int64
	Errors                  int64
	LastError               string
}

// Stats is the prewrite's counters now.
func (p *Prewriter) Stats() Stats {
	st := Stats{WrittenBytes: p.pool.PrewrittenBytes(), LeftBytes: p.pool.PrewriteLeftBytes()}
	p.mu.Lock()
	defer p.mu.Unlock()
	st.State, st.Reason, st.Errors, st.LastError = p.state, p.reason, p.errs, p.lastErr
	return st
}

// Wait blocks until the prewrite has ended (done, stopped, or never
// started) or timeout passed, and says whether it ended.
func (p *Prewriter) Wait(timeout time.Duration) bool {
	if p.done == nil {
		return true
	}
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}
