package runtime

import (
	"errors"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/prefix"
)

// TestDiscard: discarding a block takes it and everything below it out of
// service (Lookup, Load, ResidentBlocks), frees runs that have nothing left
// indexed, leaves other chains alone, drains a block a load holds pinned,
// and after a reopen a run whose tail was discarded still serves only its
// head (the discard was journaled as a trim of the run).
func TestDiscard(t *testing.T) {
	g := tinyGeometry()
	rng := rand.New(rand.NewPCG(5, 5))
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	s, kv := openKV(t, cfg)

	a := chainOf(100, 3)                                              // run 1
	ab := append(append([]uint64(nil), a...), chainOf(200, 2)...)     // run 2 under a
	ac := append(append([]uint64(nil), a[:2]...), chainOf(300, 2)...) // run 3 under a[1]
	other := chainOf(900, 2)
	for _, ch := range [][]uint64{a, ab, ac, other} {
		pages := pageTable(rng, g, cfg.NumPages, len(ch))
		fill(kv, g, ch, pages)
		if sv := saveWait(t, s, ch, pages); sv.Saved() == 0 {
			t.Fatalf("chain %x: nothing saved", ch)
		}
	}
	if got := len(s.ResidentBlocks()); got != 3+2+2+2 {
		t.Fatalf("ResidentBlocks lists %d, want 9", got)
	}
	live := s.Stats().Map.LiveRuns
	statsBefore := s.Stats()

	// Discard a[2]: a's tail and all of run 2 go; run 3 (under a[1]) stays.
	if _, err := s.Discard(a[2]); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		chain []uint64
		want  int
	}{{a, 2}, {ab, 2}, {ac, 4}, {other, 2}} {
		if n := s.Resident(c.chain); n != c.want {
			t.Fatalf("Resident(%x) = %d after discarding %#x, want %d", c.chain, n, a[2], c.want)
		}
	}
	if st := s.Stats(); st.Lookups != statsBefore.Lookups {
		t.Fatalf("Resident counted as a lookup: %d -> %d", statsBefore.Lookups, st.Lookups)
	}
	if got := s.Stats().Map.LiveRuns; got != live-1 {
		t.Fatalf("live runs %d -> %d, want run 2 freed (run 1 keeps its head)", live, got)
	}
	rb := s.ResidentBlocks()
	sort.Slice(rb, func(i, j int) bool { return rb[i].ID < rb[j].ID })
	want := []ResidentBlock{{ID: 100}, {ID: 101, Parent: 100, HasParent: true}, {ID: 300, Parent: 101, HasParent: true},
		{ID: 301, Parent: 300, HasParent: true}, {ID: 900}, {ID: 901, Parent: 900, HasParent: true}}
	if len(rb) != len(want) {
		t.Fatalf("ResidentBlocks = %+v, want %+v", rb, want)
	}
	for i := range want {
		if rb[i] != want[i] {
			t.Fatalf("ResidentBlocks[%d] = %+v, want %+v", i, rb[i], want[i])
		}
	}
	if _, err := s.Discard(a[2]); !errors.Is(err, prefix.ErrNotFound) {
		t.Fatalf("second discard: %v, want prefix.ErrNotFound", err)
	}

	// A discarded block a load holds pinned drains: the load still ends
	// well, and nothing serves the block afterwards.
	pages := pageTable(rng, g, cfg.NumPages, len(other))
	l, err := s.Load(other, pages)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Discard(other[0]); err != nil {
		t.Fatal(err)
	}
	if err := l.Wait(); err != nil {
		t.Fatal(err)
	}
	if n := s.Resident(other); n != 0 {
		t.Fatalf("Resident(other) = %d after discarding its root under a load", n)
	}
	if err := verify(kv, g, other, pages, l.Blocks()); err != nil {
		t.Fatalf("the load that raced the discard served wrong data: %v", err)
	}
	closeKV(t, s, kv)

	// Reopen: what was served before Close, nothing more (run 1 keeps
	// its head only; run 2 and other's run were freed).
	s, kv = openKV(t, cfg)
	defer closeKV(t, s, kv)
	if rep := s.Recovery(); rep.TrimmedBlocks != 1 || rep.DroppedRuns != 0 {
		t.Fatalf("recovery: %d blocks trimmed (want a[2]), %d runs dropped %v", rep.TrimmedBlocks, rep.DroppedRuns, rep.DroppedReasons)
	}
	for _, c := range []struct {
		chain []uint64
		want  int
	}{{a, 2}, {ab, 2}, {ac, 4}, {other, 0}} {
		if n := s.Resident(c.chain); n != c.want {
			t.Fatalf("after reopen Resident(%x) = %d, want %d", c.chain, n, c.want)
		}
	}
	if _, err := s.Discard(12345); !errors.Is(err, prefix.ErrNotFound) {
		t.Fatalf("discarding an unknown block: %v", err)
	}
}

// TestDiscardClosed: Discard after Close says so.
func TestDiscardClosed(t *testing.T) {
	cfg := testConfig(t, tinyGeometry(), kvshape.LayoutPerLayer, 16)
	s, kv := openKV(t, cfg)
	closeKV(t, s, kv)
	if _, err := s.Discard(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Discard after Close: %v, want ErrClosed", err)
	}
}
