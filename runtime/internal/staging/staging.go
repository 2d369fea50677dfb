// Package staging is a store's off-heap staging: a fixed set of slots
// allocated at Open, each with the ring request that fills or drains it.
// Loads stage reads in them (PathCPU) and saves carve them into write
// buffers; nothing is allocated after Open, and Acquire blocks while every
// slot is in use.
package staging

import (
	"fmt"

	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/uring"
)

// Slot is one unit of staging with the ring request that fills or drains
// it. Whoever acquired it owns it (and its Req) until Release; at most one
// I/O uses it at a time. What the staged bytes are is its user's to keep:
// users keep per-slot state in slices indexed by ID.
type Slot struct {
	ID   int // index in Pool.Slots
	Buf  *uring.Buffer
	Data []byte // Buf.Bytes()
	// Req's Owner is the slot: its completion sends the slot on Sink,
	// which the user sets per I/O (a channel with room for every slot, so
	// the ring never blocks).
	Req  ring.Req
	Sink chan<- *Slot
}

// IODone runs on the ring's goroutine.
func (s *Slot) IODone(*ring.Req) { s.Sink <- s }

// Pool is the fixed set of slots.
type Pool struct {
	SlotBytes int64
	all       []*Slot
	free      chan *Slot
}

// New allocates totalBytes of staging in slots of slotBytes.
func New(totalBytes, slotBytes int64) (*Pool, error) {
	n := int(totalBytes / slotBytes)
	p := &Pool{SlotBytes: slotBytes, free: make(chan *Slot, n)}
	for i := 0; i < n; i++ {
		b, err := uring.AllocBuffer(int(slotBytes))
		if err != nil {
			_ = p.Close()
			return nil, fmt.Errorf("allocating staging slot %d of %d (%d bytes): %w", i, n, slotBytes, err)
		}
		s := &Slot{ID: i, Buf: b, Data: b.Bytes()}
		s.Req.Owner = s
		p.all = append(p.all, s)
		p.free <- s
	}
	return p, nil
}

// Slots is every slot, by ID (for registering their memory, and for
// per-slot state).
func (p *Pool) Slots() []*Slot { return p.all }

// Acquire blocks until a slot is free and takes it.
func (p *Pool) Acquire() *Slot { return <-p.free }

// TryAcquire takes a free slot, or returns nil when none is free.
func (p *Pool) TryAcquire() *Slot {
	select {
	case s := <-p.free:
		return s
	default:
		return nil
	}
}

// Release gives a slot back (no I/O of it in flight).
func (p *Pool) Release(s *Slot) { p.free <- s }

// Close frees the slots' memory (every slot released, nothing in flight).
func (p *Pool) Close() error {
	var first error
	for _, s := range p.all {
		if err := s.Buf.Free(); err != nil && first == nil {
			first = err
		}
	}
	p.all = nil
	return first
}
