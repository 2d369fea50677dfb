package faultfs

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Op is a kind of request the FUSE file serves.
type Op uint8

// Ops a Rule can fail. Fsync is what a flush of the loop device above the
// file arrives as (the loop driver fsyncs its backing file).
const (
	Read Op = iota
	Write
	Fsync
	numOps
)

func (o Op) String() string {
	switch o {
	case Read:
		return "read"
	case Write:
		return "write"
	case Fsync:
		return "fsync"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Rule says which requests fail with EIO: those of kind Op whose byte range
// overlaps [Off, Off+Len) (Len 0: any offset; Fsync has no range and
// ignores them), after the first Skip such requests, at most Times of them
// (0: every one until disarmed). A failed request transfers nothing, as a
// device that reports a failed command. With Stall, a matching request
// instead hangs, as on a device that stops answering, until the fault is
// disarmed (then it fails with EIO) or the FUSE connection is aborted.
type Rule struct {
	Op       Op
	Off, Len int64
	Skip     int64
	Times    int64
	Stall    bool
	Note     string // what the rule aims at, for messages (optional)
}

func (r Rule) String() string {
	s := r.Op.String()
	if r.Op != Fsync && r.Len > 0 {
		s += fmt.Sprintf("[%d,+%d)", r.Off, r.Len)
	}
	if r.Skip > 0 {
		s += fmt.Sprintf(" after %d", r.Skip)
	}
	if r.Times > 0 {
		s += fmt.Sprintf(" x%d", r.Times)
	}
	if r.Stall {
		s += " stall"
	}
	if r.Note != "" {
		s += " (" + r.Note + ")"
	}
	return s
}

func (r *Rule) matches(op Op, off, n int64) bool {
	if op != r.Op {
		return false
	}
	if op == Fsync || r.Len == 0 {
		return true
	}
	return off < r.Off+r.Len && r.Off < off+n
}

// Fault is an armed Rule; Hits says how many requests it failed.
type Fault struct {
	rule    Rule
	matched int64 // under Injector.mu
	hits    atomic.Int64
}

// Hits is the number of requests this fault failed so far.
func (f *Fault) Hits() int64 { return f.hits.Load() }

// Rule is the rule the fault was armed with.
func (f *Fault) Rule() Rule { return f.rule }

// maxFaults bounds the rules armed at once (each request walks them).
const maxFaults = 64

// Injector decides, for each request of the FUSE file, whether it fails. It
// is safe for concurrent use; the zero value fails nothing.
type Injector struct {
	mu     sync.Mutex
	faults []*Fault
	// release is closed by DisarmAll: stalled requests wait on it.
	release chan struct{}
	served  [numOps]atomic.Int64 // requests that reached the injector
	failed  [numOps]atomic.Int64
}

// Arm adds r; requests from now on that match it fail. It returns the
// armed fault for its hit count, or an error for a rule that can match
// nothing or when maxFaults are armed.
func (in *Injector) Arm(r Rule) (*Fault, error) {
	if r.Op >= numOps {
		return nil, fmt.Errorf("faultfs: arm: unknown op %d", r.Op)
	}
	if r.Off < 0 || r.Len < 0 || r.Skip < 0 || r.Times < 0 {
		return nil, fmt.Errorf("faultfs: arm: negative field in %v", r)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.faults) >= maxFaults {
		return nil, fmt.Errorf("faultfs: arm: %d faults armed already", maxFaults)
	}
	f := &Fault{rule: r}
	in.faults = append(in.faults, f)
	return f, nil
}

// DisarmAll removes every armed fault (their hit counts stay readable).
func (in *Injector) DisarmAll() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.faults = nil
	if in.release != nil {
		close(in.release)
		in.release = nil
	}
}

// Served is the number of requests of kind op the file received.
func (in *Injector) Served(op Op) int64 { return in.served[op].Load() }

// Failed is the number of requests of kind op failed by any fault.
func (in *Injector) Failed(op Op) int64 { return in.failed[op].Load() }

// decide reports whether the request (op, [off, off+n)) fails, and, for a
// stalling fault, the channel to wait on before failing it. The first armed
// fault that matches and is not exhausted counts it; a fault still within
// its Skip lets the request through.
func (in *Injector) decide(op Op, off, n int64) (fail bool, stall <-chan struct{}) {
	in.served[op].Add(1)
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, f := range in.faults {
		if !f.rule.matches(op, off, n) {
			continue
		}
		f.matched++
		if f.matched <= f.rule.Skip {
			continue
		}
		if f.rule.Times > 0 && f.matched > f.rule.Skip+f.rule.Times {
			continue
		}
		f.hits.Add(1)
		in.failed[op].Add(1)
		if f.rule.Stall {
			if in.release == nil {
				in.release = make(chan struct{})
			}
			return true, in.release
		}
		return true, nil
	}
	return false, nil
}
