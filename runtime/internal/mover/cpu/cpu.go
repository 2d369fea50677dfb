// Package cpu is PathCPU's mover: Go submits O_DIRECT reads and writes to
// the store's io_uring (package ring) between the pool files and host KV
// memory. A restore reads exactly the chunks it needs, straight into the
// engine's pages where they meet O_DIRECT's alignment (else into staging,
// copied), and a consume pool of min(GOMAXPROCS, 8) goroutines shared by
// the store's restores verifies every chunk against its CRC32C from the
// run's chunk table before the run counts as restored; a read larger than a
// staging slot is read and checked in pieces (splitread.go). A save write
// goes from the pages themselves where they allow it (gather.go).
package cpu

import (
	"errors"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/runtime/internal/staging"
	"github.com/tutti-io/tutti/runtime/internal/workpool"
	"github.com/tutti-io/tutti/uring"
)

// Config is what the mover works with; every pointer is the store's,
// shared, and outlives the mover.
type Config struct {
	Geometry kvshape.Geometry
	Layout   kvshape.Layout
	// Pool is where the store's runs lie (every read's file and offset).
	Pool     mover.Pool
	NumPages int
	Staging  *staging.Pool
	Worker   *ring.Worker
	Sched    *iosched.Scheduler
	Counters *mover.Counters
}

// Mover is PathCPU's mover.Mover.
type Mover struct {
	g        kvshape.Geometry
	layout   kvshape.Layout
	pool     mover.Pool
	numPages int
	staging  *staging.Pool
	worker   *ring.Worker
	sched    *iosched.Scheduler
	counters *mover.Counters
	kv       *Views // set once by Bind

	slots     []slotState // per staging slot, by ID
	consumers *workpool.Pool[*staging.Slot]
}

// slotState is what the mover keeps of a staging slot: the segment a
// restore staged in it (its holder's, while it holds it), whether the
// holder saw it complete, and the slot's iovecs for reads into the pages
// (nil, with iovErr, when they could not be had: its reads are staged).
type slotState struct {
	seg       segment
	completed bool
	iov       *uring.Iovecs
	iovErr    error
}

// New is the mover of cfg, with its consume pool started.
func New(cfg Config) *Mover {
	m := &Mover{g: cfg.Geometry, layout: cfg.Layout, pool: cfg.Pool, numPages: cfg.NumPages, staging: cfg.Staging, worker: cfg.Worker,
		sched: cfg.Sched, counters: cfg.Counters, slots: make([]slotState, len(cfg.Staging.Slots()))}
	m.consumers = newConsumePool(m, len(m.slots))
	m.newReadIovecs(m.g.PageBytesPerPlane())
	return m
}

// Bind views the engine's host KV memory.
func (m *Mover) Bind(kv []mover.Region) error {
	m.kv = NewViews(m.g, m.layout, m.numPages, kv)
	return nil
}

// Cut takes every cached block: reads are bounded by staging, not by the
// restore.
func (m *Mover) Cut(_ []mover.Run, cached int) int { return cached }

// Whole is false: the mover issues a restore's reads one by one.
func (m *Mover) Whole() bool { return false }

// SaveSlots is half the slots: restores stage their reads in the others.
func (m *Mover) SaveSlots(slots int) int { return max(1, slots/2) }

// Close stops the consume pool and frees the slots' iovecs (every restore
// ended).
func (m *Mover) Close() error {
	m.consumers.Close()
	var errs []error
	for i := range m.slots {
		if iov := m.slots[i].iov; iov != nil {
			errs = append(errs, iov.Free())
			m.slots[i].iov = nil
		}
	}
	return errors.Join(errs...)
}
