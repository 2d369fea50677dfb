package uringsim

import (
	"fmt"
	"math/rand/v2"

	"golang.org/x/sys/unix"

	"github.com/tutti-io/tutti/uring"
)

// Injector decides faults for the Sim. Fault is called once per attempt of
// an op (the first submission, each continuation and retry) just before the
// Sim performs it, on the Sim's goroutine; the zero Fault means "no fault
// from me". String is the recipe part, e.g. "eio(p=0.05,op=read)". Injectors
// compose: AnyOf, Count, Toggle.
type Injector interface {
	Fault(rng *rand.Rand, c *uring.Completion, s *Sim) Fault
	String() string
}

// Fault is what one attempt suffers: an errno (the attempt fails with it), or
// a short transfer of ShortBytes bytes (the engine then continues).
type Fault struct {
	Errno      unix.Errno
	ShortBytes uint32
}

// Tearer is implemented by injectors that decide how much of a write in
// flight reaches the disk at Crash.
type Tearer interface {
	// TornSectors returns how many leading sectors (0..sectors) are written.
	TornSectors(rng *rand.Rand, sectors int) int
}

// OpClass selects the ops an injector applies to.
type OpClass uint8

// Op classes.
const (
	AnyOp OpClass = iota
	ReadOps
	WriteOps
	SyncOps
)

func (k OpClass) String() string {
	return [...]string{"any", "read", "write", "sync"}[k]
}

func (k OpClass) match(o uring.Op) bool {
	switch k {
	case ReadOps:
		return o.IsRead()
	case WriteOps:
		return o.IsWrite()
	case SyncOps:
		return o == uring.OpFsync || o == uring.OpFdatasync
	}
	return o != uring.OpNop
}

// EIO fails attempts of the matching ops with EIO: the Nth matching attempt
// (1-based) if Nth > 0, else each with probability P.
type EIO struct {
	P   float64
	Nth uint64
	Ops OpClass
	n   uint64
}

// Fault implements Injector.
func (e *EIO) Fault(rng *rand.Rand, c *uring.Completion, _ *Sim) Fault {
	if !e.Ops.match(c.Op()) {
		return Fault{}
	}
	e.n++
	if e.Nth > 0 {
		if e.n == e.Nth {
			return Fault{Errno: unix.EIO}
		}
		return Fault{}
	}
	if rng.Float64() < e.P {
		return Fault{Errno: unix.EIO}
	}
	return Fault{}
}

func (e *EIO) String() string {
	if e.Nth > 0 {
		return fmt.Sprintf("eio(nth=%d,op=%s)", e.Nth, e.Ops)
	}
	return fmt.Sprintf("eio(p=%g,op=%s)", e.P, e.Ops)
}

// ShortRead makes a read attempt transfer only a seeded prefix (a multiple
// of the file's O_DIRECT alignment) with probability P; the engine must
// continue for the rest.
type ShortRead struct{ P float64 }

// Fault implements Injector.
func (sr *ShortRead) Fault(rng *rand.Rand, c *uring.Completion, _ *Sim) Fault {
	if !c.Op().IsRead() {
		return Fault{}
	}
	unit := max(c.File().DirectAlign, 1)
	units := c.Remaining() / unit
	if units < 2 || rng.Float64() >= sr.P {
		return Fault{}
	}
	return Fault{ShortBytes: unit * (1 + uint32(rng.Uint64N(uint64(units-1))))}
}

func (sr *ShortRead) String() string { return fmt.Sprintf("short-read(p=%g)", sr.P) }

// ENOSPC fails a write attempt with ENOSPC once the Sim has written
// AfterBytes in total (as if the device filled up).
type ENOSPC struct{ AfterBytes int64 }

// Fault implements Injector.
func (e *ENOSPC) Fault(_ *rand.Rand, c *uring.Completion, s *Sim) Fault {
	if c.Op().IsWrite() && s.Written()+int64(c.Remaining()) > e.AfterBytes {
		return Fault{Errno: unix.ENOSPC}
	}
	return Fault{}
}

func (e *ENOSPC) String() string { return fmt.Sprintf("enospc(after=%d)", e.AfterBytes) }

// TornWrite tears the writes in flight at Crash: a seeded prefix of 0..all
// of their sectors reaches the file.
type TornWrite struct{}

// Fault implements Injector (TornWrite acts only at Crash).
func (TornWrite) Fault(*rand.Rand, *uring.Completion, *Sim) Fault { return Fault{} }

// TornSectors implements Tearer.
func (TornWrite) TornSectors(rng *rand.Rand, sectors int) int { return rng.IntN(sectors + 1) }

func (TornWrite) String() string { return "torn-write(at=crash)" }
