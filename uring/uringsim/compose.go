package uringsim

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"

	"github.com/tutti-io/tutti/uring"
)

// anyOf is AnyOf's injector.
type anyOf []Injector

// AnyOf consults ins in order for every attempt; the first fault wins. At
// Crash the first of them that tears writes (a Tearer) decides how much of
// each write in flight reaches the file.
func AnyOf(ins ...Injector) Injector { return anyOf(append([]Injector(nil), ins...)) }

// Fault implements Injector.
func (a anyOf) Fault(rng *rand.Rand, c *uring.Completion, s *Sim) Fault {
	for _, in := range a {
		if f := in.Fault(rng, c, s); f != (Fault{}) {
			return f
		}
	}
	return Fault{}
}

// TornSectors implements Tearer: the first Tearer among them decides; none
// tears nothing.
func (a anyOf) TornSectors(rng *rand.Rand, sectors int) int {
	for _, in := range a {
		if t, ok := in.(Tearer); ok {
			return t.TornSectors(rng, sectors)
		}
	}
	return 0
}

func (a anyOf) String() string {
	parts := make([]string, len(a))
	for i, in := range a {
		parts[i] = in.String()
	}
	return "any(" + strings.Join(parts, ",") + ")"
}

// Counter counts the faults its injector caused (and the writes it tore),
// so a test can assert that every injected fault reached the API above:
// e.g. that a store reports as many failed reads as were injected. Safe to
// read from any goroutine while the Sim runs.
type Counter struct {
	in     Injector
	faults atomic.Uint64
	errnos atomic.Uint64
	torn   atomic.Uint64
}

// Count wraps in in a Counter.
func Count(in Injector) *Counter { return &Counter{in: in} }

// Fault implements Injector.
func (c *Counter) Fault(rng *rand.Rand, comp *uring.Completion, s *Sim) Fault {
	f := c.in.Fault(rng, comp, s)
	if f != (Fault{}) {
		c.faults.Add(1)
		if f.Errno != 0 {
			c.errnos.Add(1)
		}
	}
	return f
}

// TornSectors implements Tearer when the wrapped injector does (else it
// tears nothing).
func (c *Counter) TornSectors(rng *rand.Rand, sectors int) int {
	t, ok := c.in.(Tearer)
	if !ok {
		return 0
	}
	k := t.TornSectors(rng, sectors)
	if k > 0 {
		c.torn.Add(1)
	}
	return k
}

// Faults is the attempts the injector changed so far.
func (c *Counter) Faults() uint64 { return c.faults.Load() }

// Errnos is the attempts it failed with an errno (the rest were short).
func (c *Counter) Errnos() uint64 { return c.errnos.Load() }

// Torn is the writes it tore at Crash.
func (c *Counter) Torn() uint64 { return c.torn.Load() }

func (c *Counter) String() string { return "count(" + c.in.String() + ")" }

// Switch turns its injector on and off: a test sets a store up with faults
// off, then turns them on for the phase under test. Safe to flip from any
// goroutine while the Sim runs; an attempt sees the state at its start.
type Switch struct {
	in Injector
	on atomic.Bool
}

// Toggle wraps in in a Switch, on or off.
func Toggle(in Injector, on bool) *Switch {
	s := &Switch{in: in}
	s.on.Store(on)
	return s
}

// On turns the injector on.
func (s *Switch) On() { s.on.Store(true) }

// Off turns the injector off.
func (s *Switch) Off() { s.on.Store(false) }

// Enabled reports whether the injector is on.
func (s *Switch) Enabled() bool { return s.on.Load() }

// Fault implements Injector.
func (s *Switch) Fault(rng *rand.Rand, c *uring.Completion, sim *Sim) Fault {
	if !s.on.Load() {
		return Fault{}
	}
	return s.in.Fault(rng, c, sim)
}

// TornSectors implements Tearer when the wrapped injector does and it is on.
func (s *Switch) TornSectors(rng *rand.Rand, sectors int) int {
	t, ok := s.in.(Tearer)
	if !ok || !s.on.Load() {
		return 0
	}
	return t.TornSectors(rng, sectors)
}

func (s *Switch) String() string {
	state := "off"
	if s.on.Load() {
		state = "on"
	}
	return fmt.Sprintf("toggle(%s,%s)", s.in.String(), state)
}
