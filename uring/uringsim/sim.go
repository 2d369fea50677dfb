// Package uringsim is a deterministic uring.Engine for tests: seeded,
// tick-based latency, the real pread/pwrite/fsync on the file when an op
// completes, a simulated power loss (Crash), and faults from injectors that
// compose (AnyOf, Count, Toggle), so a test can inject a fault and assert
// that it reached the API above.
//
// It lives beside package uring, not in it, so the product (the runtime, the
// C library) does not carry it; it drives uring.Completion through uring's
// engine kit (Validate, Perform, Apply, Abort, Deliver), so it checks,
// retries and continues ops by the Ring's rules.
package uringsim

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/tutti-io/tutti/uring"
)

// Config configures a Sim. Zero fields take the defaults noted.
type Config struct {
	Seed            uint64
	MinLatencyTicks uint64 // latency of one attempt, uniform in [Min, Max] ticks; defaults 1 and 4
	MaxLatencyTicks uint64
	MaxInFlight     int // ops "in the device" at once; 0 = 64; the rest wait in the overflow queue
	SectorBytes     int // torn-write granularity; 0 = 512
	// Injectors are consulted in order for every attempt; the first fault
	// wins (AnyOf(Injectors...)).
	Injectors []Injector
}

// Stats are the Sim's counters: the Engine's plus the faults injected.
type Stats struct {
	uring.Stats
	Faults     uint64 // attempts an injector changed
	TornWrites uint64 // writes torn at Crash
	Ticks      uint64
}

// op is a completion in the "device", due at a tick.
type op struct {
	c        *uring.Completion
	due, seq uint64
}

// Sim is the simulated engine.
//
// Time: each Flush advances the clock by at least one tick (Flush(0) by
// exactly one); ops complete when their due tick is reached, in (due tick,
// submission order), so a given seed and call sequence always produces the
// same completions. Like every Engine, a Sim is owned by one goroutine.
type Sim struct {
	cfg     Config
	inject  Injector
	rng     *rand.Rand
	tick    uint64
	seq     uint64
	pending []op                // in the "device", at most MaxInFlight
	retry   []*uring.Completion // continuations and retries, next first from the end
	queue   []*uring.Completion // waiting for the device, FIFO from qhead
	qhead   int
	done    []*uring.Completion // finished, callbacks pending
	crashed bool
	closed  bool
	bufs    []*uring.Buffer
	stats   Stats
	written int64 // bytes written so far (for ENOSPC)
	due     []op
}

// New returns a Sim. It performs no I/O until ops complete.
func New(cfg Config) *Sim {
	if cfg.MinLatencyTicks == 0 {
		cfg.MinLatencyTicks = 1
	}
	if cfg.MaxLatencyTicks < cfg.MinLatencyTicks {
		cfg.MaxLatencyTicks = max(cfg.MinLatencyTicks, 4)
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 64
	}
	if cfg.SectorBytes <= 0 {
		cfg.SectorBytes = 512
	}
	return &Sim{cfg: cfg, inject: AnyOf(cfg.Injectors...),
		rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
}

// Recipe names the seed and the injectors, e.g.
// "seed=7 eio(p=0.05,op=read)+torn-write(at=crash)"; print it when a test
// fails so the failure can be replayed.
func (s *Sim) Recipe() string {
	if len(s.cfg.Injectors) == 0 {
		return fmt.Sprintf("seed=%d none", s.cfg.Seed)
	}
	parts := make([]string, len(s.cfg.Injectors))
	for i, in := range s.cfg.Injectors {
		parts[i] = in.String()
	}
	return fmt.Sprintf("seed=%d %s", s.cfg.Seed, strings.Join(parts, "+"))
}

// Tick is the current simulated time.
func (s *Sim) Tick() uint64 { return s.tick }

// Written is the bytes the Sim has written to files so far.
func (s *Sim) Written() int64 { return s.written }

// Stats returns the counters so far.
func (s *Sim) Stats() Stats { st := s.stats; st.Ticks = s.tick; return st }

func (s *Sim) waiting() int { return len(s.retry) + len(s.queue) - s.qhead }

// InFlight implements uring.Engine. After Crash it includes the completions
// failed by the crash until a Flush runs their callbacks.
func (s *Sim) InFlight() int { return len(s.pending) + s.waiting() + len(s.done) }

// Submit implements uring.Engine.
func (s *Sim) Submit(c *uring.Completion) error {
	switch {
	case s.closed:
		return fmt.Errorf("uringsim: submit %s: %w", c.Op(), uring.ErrClosed)
	case s.crashed:
		return c.OpError(uring.ErrCrashed)
	}
	if err := c.Validate(); err != nil {
		return err
	}
	if o := c.Op(); o == uring.OpReadFixed || o == uring.OpWriteFixed {
		buf, idx := c.Buffer()
		if int(idx) >= len(s.bufs) || s.bufs[idx] != buf {
			return fmt.Errorf("uringsim: %s %s: %w: buffer index %d is not that buffer's registration on this engine",
				o, c.File().Path, uring.ErrInvalid, idx)
		}
	}
	s.queue = append(s.queue, c)
	if len(s.pending) >= s.cfg.MaxInFlight {
		s.stats.Overflowed++
	}
	s.fill()
	return nil
}

// next takes the next waiting completion: continuations and retries first.
func (s *Sim) next() *uring.Completion {
	if n := len(s.retry); n > 0 {
		c := s.retry[n-1]
		s.retry[n-1] = nil
		s.retry = s.retry[:n-1]
		return c
	}
	if s.qhead == len(s.queue) {
		return nil
	}
	c := s.queue[s.qhead]
	s.queue[s.qhead] = nil
	s.qhead++
	if s.qhead == len(s.queue) {
		s.queue, s.qhead = s.queue[:0], 0
	}
	return c
}

func (s *Sim) fill() {
	for len(s.pending) < s.cfg.MaxInFlight && s.waiting() > 0 {
		s.schedule(s.next())
	}
}

func (s *Sim) schedule(c *uring.Completion) {
	lat := s.cfg.MinLatencyTicks
	if span := s.cfg.MaxLatencyTicks - s.cfg.MinLatencyTicks; span > 0 {
		lat += s.rng.Uint64N(span + 1)
	}
	s.pending = append(s.pending, op{c: c, due: s.tick + lat, seq: s.seq})
	s.seq++
	s.stats.Submitted++
}

// Flush implements uring.Engine.
func (s *Sim) Flush(waitNr int) error {
	if s.closed {
		return fmt.Errorf("uringsim: flush: %w", uring.ErrClosed)
	}
	target := min(waitNr, s.InFlight())
	delivered := len(s.done) // failed by Crash, callbacks pending
	// Every op completes within MaxLatencyTicks of being scheduled, and each
	// continuation or retry reschedules it; this bounds the loop generously.
	limit := (s.cfg.MaxLatencyTicks + 1) * uint64(s.InFlight()+1) * (uring.MaxIORetries + 2) * 64
	for i := uint64(0); ; i++ {
		s.fill()
		s.tick++
		delivered += s.completeDue()
		if delivered >= target {
			break
		}
		if i > limit {
			return fmt.Errorf("uringsim: flush: no progress after %d ticks (%s)", i, s.Recipe())
		}
	}
	done := s.done
	s.done = nil
	uring.Deliver(done)
	return nil
}

func (s *Sim) completeDue() int {
	s.due = s.due[:0]
	keep := s.pending[:0]
	for _, o := range s.pending {
		if o.due <= s.tick {
			s.due = append(s.due, o)
		} else {
			keep = append(keep, o)
		}
	}
	clear(s.pending[len(keep):])
	s.pending = keep
	slices.SortFunc(s.due, func(a, b op) int {
		if a.due != b.due {
			return cmp.Compare(a.due, b.due)
		}
		return cmp.Compare(a.seq, b.seq)
	})
	finished := 0
	for _, o := range s.due {
		if o.c.Apply(s.attempt(o.c), &s.stats.Stats) {
			s.stats.Completed++
			s.done = append(s.done, o.c)
			finished++
		} else {
			s.retry = append(s.retry, o.c)
		}
	}
	clear(s.due)
	s.fill()
	return finished
}

// attempt performs one attempt of c (after the injectors had their say) and
// returns the kernel-style result: bytes, or -errno.
func (s *Sim) attempt(c *uring.Completion) int32 {
	f := s.inject.Fault(s.rng, c, s)
	if f != (Fault{}) {
		s.stats.Faults++
	}
	if f.Errno != 0 {
		return -int32(f.Errno)
	}
	limit := c.Remaining()
	if f.ShortBytes > 0 && f.ShortBytes < limit {
		limit = f.ShortBytes
	}
	res := c.Perform(limit)
	if res > 0 && c.Op().IsWrite() {
		s.written += int64(res)
	}
	return res
}

// Crash simulates power loss: every write still in flight (in the device
// or queued) is torn — a seeded prefix of its sectors reaches the file if a
// torn-write injector is configured, nothing otherwise — and every op in
// flight completes with uring.ErrCrashed at the next Flush. Later Submits
// fail with uring.ErrCrashed.
func (s *Sim) Crash() {
	if s.crashed {
		return
	}
	s.crashed = true
	slices.SortFunc(s.pending, func(a, b op) int { return cmp.Compare(a.seq, b.seq) })
	victims := make([]*uring.Completion, 0, len(s.pending)+s.waiting())
	for _, o := range s.pending {
		victims = append(victims, o.c)
	}
	for c := s.next(); c != nil; c = s.next() {
		victims = append(victims, c)
	}
	clear(s.pending)
	s.pending = s.pending[:0]
	tear, _ := s.inject.(Tearer)
	for _, c := range victims {
		if tear != nil && c.Op().IsWrite() && c.Remaining() > 0 {
			s.tearWrite(c, tear)
		}
		c.Abort(uring.ErrCrashed)
		s.stats.Completed++
		s.done = append(s.done, c)
	}
}

// tearWrite writes a seeded prefix of c's remaining sectors, without
// advancing c.
func (s *Sim) tearWrite(c *uring.Completion, tear Tearer) {
	sector := uint32(s.cfg.SectorBytes)
	remaining := c.Remaining()
	sectors := int((remaining + sector - 1) / sector)
	k := tear.TornSectors(s.rng, sectors)
	if k <= 0 {
		return
	}
	s.stats.TornWrites++
	_ = c.Perform(min(uint32(k)*sector, remaining))
}

// RegisterFiles implements uring.Engine (indexes are assigned; the Sim uses the fds).
func (s *Sim) RegisterFiles(files []*uring.File) error {
	if s.InFlight() > 0 {
		return fmt.Errorf("uringsim: register files: %w: %d I/O in flight", uring.ErrInvalid, s.InFlight())
	}
	for i, f := range files {
		f.Index = int32(i)
	}
	return nil
}

// RegisterBuffers implements uring.Engine.
func (s *Sim) RegisterBuffers(bufs []*uring.Buffer) error {
	if s.InFlight() > 0 {
		return fmt.Errorf("uringsim: register buffers: %w: %d I/O in flight", uring.ErrInvalid, s.InFlight())
	}
	s.bufs = slices.Clone(bufs)
	return nil
}

// Close implements uring.Engine.
func (s *Sim) Close() error {
	if s.closed {
		return fmt.Errorf("uringsim: close: %w", uring.ErrClosed)
	}
	if n := s.InFlight(); n > 0 && !s.crashed {
		return fmt.Errorf("uringsim: close: %w: %d I/O in flight (Flush them first)", uring.ErrInvalid, n)
	}
	s.closed = true
	return nil
}

var _ uring.Engine = (*Sim)(nil)
