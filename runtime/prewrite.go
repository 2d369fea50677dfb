package runtime

// The background prewrite (objmap.Map.Prewrite): a store whose pool has
// unwritten extents (fallocate's) writes zeros over their free parts while
// no load or save runs, so that saves overwrite written blocks instead of
// paying the file system's conversion of each extent they land in. One
// write of at most prewriteStepBytes is in flight at a time, on one device;
// a load or save that starts meanwhile waits behind at most that one write
// on that device. Config.NoPrewrite turns it off.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tutti-io/tutti/objmap"
)

const (
	// prewriteStepBytes is one prewrite write: short enough that a load
	// arriving behind it is not held back long (a few ms on one device).
	prewriteStepBytes = 4 << 20
	// prewriteIdle is how long the store must have had no load or save
	// before a prewrite write starts; prewritePoll is how often it looks.
	prewriteIdle = 20 * time.Millisecond
	prewritePoll = 10 * time.Millisecond
	// prewriteMaxErrors failed writes stop the prewrite for the store's life.
	prewriteMaxErrors = 3
)

// prewriter is a store's background prewrite.
type prewriter struct {
	// active counts the store's loads, saves and discards in flight
	// (Store.begin, Store.endOp); lastEndNs is when the last one ended.
	active    atomic.Int64
	lastEndNs atomic.Int64

	quit chan struct{}
	done chan struct{} // closed when the goroutine ended (nil: never started)

	mu      sync.Mutex
	errs    int64
	lastErr string
	state   PrewriteState
	reason  string // Stats.Prewrite.Reason
}

// startPrewrite starts the background prewrite unless cfg turns it off or
// the pool has nothing unwritten.
func (s *Store) startPrewrite() {
	p := &s.pre
	switch {
	case s.cfg.NoPrewrite:
		p.state, p.reason = PrewriteOff, "Config.NoPrewrite"
		return
	case s.m.PrewriteLeftBytes() == 0:
		p.state, p.reason = PrewriteDone, "nothing unwritten"
		if note := s.m.PrewriteNote(); note != "" {
			p.state, p.reason = PrewriteOff, note
		}
		return
	}
	p.state = PrewriteRunning
	p.quit, p.done = make(chan struct{}), make(chan struct{})
	go s.prewriteLoop()
}

// stopPrewrite ends the goroutine and waits for it (Close, before the map
// closes).
func (s *Store) stopPrewrite() {
	if s.pre.done == nil {
		return
	}
	close(s.pre.quit)
	<-s.pre.done
}

func (s *Store) prewriteLoop() {
	p := &s.pre
	defer close(p.done)
	tick := time.NewTicker(prewritePoll)
	defer tick.Stop()
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		if p.active.Load() > 0 || time.Since(time.Unix(0, p.lastEndNs.Load())) < prewriteIdle {
			select {
			case <-p.quit:
				return
			case <-tick.C:
			}
			continue
		}
		n, err := s.m.Prewrite(prewriteStepBytes)
		switch {
		case errors.Is(err, objmap.ErrClosed):
			return
		case err != nil:
			p.mu.Lock()
			p.errs++
			p.lastErr = err.Error()
			stop := p.errs >= prewriteMaxErrors
			if stop {
				p.state, p.reason = PrewriteStopped, fmt.Sprintf("%d failed writes", p.errs)
			}
			p.mu.Unlock()
			if stop {
				return
			}
		case n == 0:
			p.mu.Lock()
			p.state = PrewriteDone
			p.mu.Unlock()
			return
		}
	}
}

// endOp ends an operation begin registered.
func (s *Store) endOp() {
	s.pre.lastEndNs.Store(time.Now().UnixNano())
	s.pre.active.Add(-1)
	s.ops.Done()
}

// prewriteStats is Stats.Prewrite.
func (s *Store) prewriteStats() PrewriteStats {
	st := PrewriteStats{WrittenBytes: s.m.PrewrittenBytes(), LeftBytes: s.m.PrewriteLeftBytes()}
	p := &s.pre
	p.mu.Lock()
	defer p.mu.Unlock()
	st.State, st.Reason, st.Errors, st.LastError = p.state, p.reason, p.errs, p.lastErr
	return st
}

// WaitPrewrite blocks until the background prewrite has ended (done,
// stopped, or never started) or timeout passed, and says whether it ended.
func (s *Store) WaitPrewrite(timeout time.Duration) bool {
	if s.pre.done == nil {
		return true
	}
	select {
	case <-s.pre.done:
		return true
	case <-time.After(timeout):
		return false
	}
}
