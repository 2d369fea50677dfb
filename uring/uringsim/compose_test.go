package uringsim

import (
	"errors"
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tutti-io/tutti/uring"
)

// TestComposedFaultsReachCompletions: a counted EIO behind a switch fails
// nothing while off, and while on fails exactly the reads it counts, each
// on its own completion, wrapped with the op.
func TestComposedFaultsReachCompletions(t *testing.T) {
	const blk, n = 4096, 32
	eio := Count(&EIO{P: 0.5, Ops: ReadOps})
	sw := Toggle(eio, false)
	s := New(Config{Seed: 21, Injectors: []Injector{sw}})
	f, _ := directFile(t, t.TempDir(), n*blk, 21)
	buf := mustBuffer(t, n*blk)
	readAll := func() (failed int) {
		cs := make([]uring.Completion, n)
		for i := range cs {
			cs[i].PrepRead(f, buf.Addr()+uintptr(i*blk), blk, uint64(i*blk))
			if err := s.Submit(&cs[i]); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Flush(n); err != nil {
			t.Fatal(err)
		}
		for i := range cs {
			if cs[i].Err != nil {
				if !errors.Is(cs[i].Err, unix.EIO) {
					t.Fatalf("read %d: %v, want EIO", i, cs[i].Err)
				}
				failed++
			}
		}
		return failed
	}
	if got := readAll(); got != 0 || eio.Faults() != 0 {
		t.Fatalf("switched off: %d reads failed, %d faults counted", got, eio.Faults())
	}
	sw.On()
	got := readAll()
	if got == 0 || got == n {
		t.Fatalf("eio(p=0.5) on: %d of %d reads failed", got, n)
	}
	if eio.Faults() != uint64(got) || eio.Errnos() != uint64(got) || s.Stats().Faults != uint64(got) {
		t.Fatalf("%d reads failed, counter %d faults %d errnos, sim %d", got, eio.Faults(), eio.Errnos(), s.Stats().Faults)
	}
	sw.Off()
	if got := readAll(); got != 0 {
		t.Fatalf("switched off again: %d reads failed", got)
	}
}

// fixed faults every attempt with errno e.
type fixed unix.Errno

func (e fixed) Fault(*rand.Rand, *uring.Completion, *Sim) Fault { return Fault{Errno: unix.Errno(e)} }
func (e fixed) String() string                                  { return unix.Errno(e).Error() }

func TestAnyOfFirstWins(t *testing.T) {
	var c uring.Completion
	c.PrepNop()
	rng := rand.New(rand.NewPCG(1, 2))
	first, second := Count(fixed(unix.EIO)), Count(fixed(unix.ENOSPC))
	a := AnyOf(Toggle(fixed(unix.EBADF), false), first, second)
	if f := a.Fault(rng, &c, nil); f.Errno != unix.EIO {
		t.Fatalf("fault %v, want the first enabled injector's EIO", f)
	}
	if first.Faults() != 1 || second.Faults() != 0 {
		t.Fatalf("consulted past the first fault: %d, %d", first.Faults(), second.Faults())
	}
	if got, want := a.String(), "any(toggle(bad file descriptor,off),count(input/output error),count(no space left on device))"; got != want {
		t.Fatalf("String %q, want %q", got, want)
	}
}

// TestComposedTearers: composers pass a TornWrite through to Crash, count
// what it tore, and tear nothing while switched off.
func TestComposedTearers(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	torn := Count(TornWrite{})
	tests := []struct {
		name string
		in   Injector
		tear bool
	}{
		{"torn-write", TornWrite{}, true},
		{"count", torn, true},
		{"any-of", AnyOf(&EIO{P: 0}, torn), true},
		{"toggle on", Toggle(TornWrite{}, true), true},
		{"toggle off", Toggle(TornWrite{}, false), false},
		{"count without a tearer", Count(&EIO{P: 0}), false},
	}
	for _, tc := range tests {
		tr, ok := tc.in.(Tearer)
		if !ok {
			t.Fatalf("%s: not a Tearer", tc.name)
		}
		tore := false
		for i := 0; i < 50; i++ {
			if tr.TornSectors(rng, 8) > 0 {
				tore = true
			}
		}
		if tore != tc.tear {
			t.Errorf("%s: tore %v, want %v", tc.name, tore, tc.tear)
		}
	}
	if torn.Torn() == 0 {
		t.Error("Count(TornWrite) counted no torn write")
	}
}
