package uring

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// SimConfig configures a Sim. Zero fields take the defaults noted.
type SimConfig struct {
	Seed            uint64
	MinLatencyTicks uint64 // latency of one attempt, uniform in [Min, Max] ticks; defaults 1 and 4
	MaxLatencyTicks uint64
	MaxInFlight     int // ops "in the device" at once; 0 = 64; the rest wait in the overflow queue
	SectorBytes     int // torn-write granularity; 0 = 512
	Injectors       []Injector
}

// Sim is a deterministic engine for the packages above: seeded, tick-based
// latency, and faults from composable injectors. It performs the real
// pread/pwrite/fsync on the file when an op completes, so data written
// through it is really there (and survives Crash, which only tears what was
// still in flight).
//
// Time: each Flush advances the clock by at least one tick (Flush(0) by
// exactly one); ops complete when their due tick is reached, in (due tick,
// submission order), so a given seed and call sequence always produces the
// same completions. Like every Engine, a Sim is owned by one goroutine.
type Sim struct {
	cfg      SimConfig
	rng      *rand.Rand
	tick     uint64
	seq      uint64
	pending  []*Completion // in the "device"
	overflow queue
	done     queue
	crashed  bool
	closed   bool
	bufs     []*Buffer
	stats    SimStats
	written  int64 // bytes written so far (for ENOSPC)
	due      []*Completion
}

// SimStats are the Sim's counters: the Engine's plus the faults injected.
type SimStats struct {
	Stats
	Faults     uint64 // attempts an injector changed
	TornWrites uint64 // writes torn at Crash
	Ticks      uint64
}

// NewSim returns a Sim. It performs no I/O until ops complete.
func NewSim(cfg SimConfig) *Sim {
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
	return &Sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
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

// Stats returns the counters so far.
func (s *Sim) Stats() SimStats { st := s.stats; st.Ticks = s.tick; return st }

// InFlight implements Engine. After Crash it includes the completions
// failed by the crash until a Flush runs their callbacks.
func (s *Sim) InFlight() int { return len(s.pending) + s.overflow.n + s.done.n }

// Submit implements Engine.
func (s *Sim) Submit(c *Completion) error {
	switch {
	case s.closed:
		return fmt.Errorf("uring: sim submit %s: %w", c.op, ErrClosed)
	case s.crashed:
		return c.opError(ErrCrashed)
	}
	if err := c.validate(); err != nil {
		return err
	}
	if (c.op == OpReadFixed || c.op == OpWriteFixed) && (int(c.bufIndex) >= len(s.bufs) || s.bufs[c.bufIndex] != c.buf) {
		return fmt.Errorf("uring: %s %s: %w: buffer index %d is not that buffer's registration on this engine", c.op, c.file.Path, ErrInvalid, c.bufIndex)
	}
	s.overflow.push(c)
	if len(s.pending) >= s.cfg.MaxInFlight {
		s.stats.Overflowed++
	}
	s.fill()
	return nil
}

func (s *Sim) fill() {
	for len(s.pending) < s.cfg.MaxInFlight && s.overflow.head != nil {
		c := s.overflow.pop()
		s.schedule(c)
	}
}

func (s *Sim) schedule(c *Completion) {
	lat := s.cfg.MinLatencyTicks
	if span := s.cfg.MaxLatencyTicks - s.cfg.MinLatencyTicks; span > 0 {
		lat += s.rng.Uint64N(span + 1)
	}
	c.dueTick = s.tick + lat
	c.seq = s.seq
	s.seq++
	s.stats.Submitted++
	s.pending = append(s.pending, c)
}

// Flush implements Engine.
func (s *Sim) Flush(waitNr int) error {
	if s.closed {
		return fmt.Errorf("uring: sim flush: %w", ErrClosed)
	}
	target := min(waitNr, s.InFlight())
	delivered := s.done.n // failed by Crash, callbacks pending
	// Every op completes within MaxLatencyTicks of being scheduled, and each
	// continuation or retry reschedules it; this bounds the loop generously.
	limit := (s.cfg.MaxLatencyTicks + 1) * uint64(s.InFlight()+1) * (maxIORetries + 2) * 64
	for i := uint64(0); ; i++ {
		s.fill()
		s.tick++
		delivered += s.completeDue()
		if delivered >= target {
			break
		}
		if i > limit {
			return fmt.Errorf("uring: sim flush: no progress after %d ticks (%s)", i, s.Recipe())
		}
	}
	runCallbacks(s.done.take())
	return nil
}

func (s *Sim) completeDue() int {
	s.due = s.due[:0]
	keep := s.pending[:0]
	for _, c := range s.pending {
		if c.dueTick <= s.tick {
			s.due = append(s.due, c)
		} else {
			keep = append(keep, c)
		}
	}
	clear(s.pending[len(keep):])
	s.pending = keep
	slices.SortFunc(s.due, func(a, b *Completion) int {
		if a.dueTick != b.dueTick {
			return cmp.Compare(a.dueTick, b.dueTick)
		}
		return cmp.Compare(a.seq, b.seq)
	})
	finished := 0
	for _, c := range s.due {
		res := s.attempt(c)
		if applyResult(c, res, &s.stats.Stats) {
			s.stats.Completed++
			s.done.push(c)
			finished++
		} else {
			s.overflow.pushFront(c)
		}
	}
	clear(s.due)
	s.fill()
	return finished
}

// attempt performs one attempt of c (after the injectors had their say) and
// returns the kernel-style result: bytes, or -errno.
func (s *Sim) attempt(c *Completion) int32 {
	var f Fault
	for _, in := range s.cfg.Injectors {
		if f = in.Fault(s.rng, c, s); f != (Fault{}) {
			s.stats.Faults++
			break
		}
	}
	if f.Errno != 0 {
		return -int32(f.Errno)
	}
	limit := c.length - c.progress
	if f.ShortBytes > 0 && f.ShortBytes < limit {
		limit = f.ShortBytes
	}
	var n int
	var err error
	switch c.op {
	case OpNop:
		return 0
	case OpFsync:
		err = unix.Fsync(int(c.file.FD))
	case OpFdatasync:
		err = unix.Fdatasync(int(c.file.FD))
	case OpRead, OpReadFixed:
		addr, _, off := c.cur()
		n, err = sysPread(c.file.FD, addr, limit, off)
	case OpWrite, OpWriteFixed:
		addr, _, off := c.cur()
		n, err = sysPwrite(c.file.FD, addr, limit, off)
	case OpReadv, OpWritev:
		n, err = s.vectored(c, limit)
	}
	if err != nil {
		return -int32(err.(unix.Errno))
	}
	if c.op.IsWrite() {
		s.written += int64(n)
	}
	return int32(n)
}

// vectored transfers up to limit bytes of a vectored op entry by entry.
func (s *Sim) vectored(c *Completion, limit uint32) (int, error) {
	total := 0
	off := c.offset + uint64(c.progress)
	for i := c.iovStart; i < c.iov.n && uint32(total) < limit; i++ {
		e := c.iov.vec[i]
		n := uint32(min(e.Len, uint64(limit-uint32(total))))
		var got int
		var err error
		if c.op == OpReadv {
			got, err = sysPread(c.file.FD, uintptr(e.Base), n, off)
		} else {
			got, err = sysPwrite(c.file.FD, uintptr(e.Base), n, off)
		}
		if err != nil {
			if total > 0 {
				return total, nil
			}
			return 0, err
		}
		total += got
		off += uint64(got)
		if uint32(got) < n {
			break
		}
	}
	return total, nil
}

// Crash simulates power loss: every write still in flight (in the device
// or queued) is torn — a seeded prefix of its sectors reaches the file if a
// torn-write injector is configured, nothing otherwise — and every op in
// flight completes with ErrCrashed at the next Flush. Later Submits fail
// with ErrCrashed.
func (s *Sim) Crash() {
	if s.crashed {
		return
	}
	s.crashed = true
	var tear Tearer
	for _, in := range s.cfg.Injectors {
		if t, ok := in.(Tearer); ok {
			tear = t
			break
		}
	}
	victims := slices.Clone(s.pending)
	slices.SortFunc(victims, func(a, b *Completion) int { return cmp.Compare(a.seq, b.seq) })
	for c := s.overflow.pop(); c != nil; c = s.overflow.pop() {
		victims = append(victims, c)
	}
	s.pending = s.pending[:0]
	for _, c := range victims {
		if tear != nil && c.op.IsWrite() && c.progress < c.length {
			s.tearWrite(c, tear)
		}
		c.restoreIov()
		c.Result, c.Err = int64(c.progress), c.opError(ErrCrashed)
		s.stats.Completed++
		s.done.push(c)
	}
}

func (s *Sim) tearWrite(c *Completion, tear Tearer) {
	sector := uint32(s.cfg.SectorBytes)
	remaining := c.length - c.progress
	sectors := int((remaining + sector - 1) / sector)
	k := tear.TornSectors(s.rng, sectors)
	if k <= 0 {
		return
	}
	s.stats.TornWrites++
	n := min(uint32(k)*sector, remaining)
	if c.op == OpWritev {
		// Write the prefix entry by entry, without advancing the completion.
		_, _ = s.vectored(c, n)
		return
	}
	addr, _, off := c.cur()
	_, _ = sysPwrite(c.file.FD, addr, n, off)
}

// RegisterFiles implements Engine (indexes are assigned; the Sim uses the fds).
func (s *Sim) RegisterFiles(files []*File) error {
	if s.InFlight() > 0 {
		return fmt.Errorf("uring: sim register files: %w: %d I/O in flight", ErrInvalid, s.InFlight())
	}
	for i, f := range files {
		f.Index = int32(i)
	}
	return nil
}

// RegisterBuffers implements Engine.
func (s *Sim) RegisterBuffers(bufs []*Buffer) error {
	if s.InFlight() > 0 {
		return fmt.Errorf("uring: sim register buffers: %w: %d I/O in flight", ErrInvalid, s.InFlight())
	}
	s.bufs = slices.Clone(bufs)
	return nil
}

// Close implements Engine.
func (s *Sim) Close() error {
	if s.closed {
		return fmt.Errorf("uring: sim close: %w", ErrClosed)
	}
	if n := s.InFlight(); n > 0 && !s.crashed {
		return fmt.Errorf("uring: sim close: %w: %d I/O in flight (Flush them first)", ErrInvalid, n)
	}
	s.closed = true
	return nil
}

var _ Engine = (*Sim)(nil)
