package runtime

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvshape"
)

// engineView applies what an engine takes from a store (TakeKVEvents):
// AllBlocksCleared replaces this store's blocks with the listing after it.
type engineView struct {
	held  map[uint64]bool
	takes int
}

// take drains the store's queue as an engine does each step (until no more
// wait), with a small buffer so listings span several takes.
func (v *engineView) take(t *testing.T, s *Store) {
	t.Helper()
	for more := true; more; {
		var out []byte
		var err error
		out, _, more, err = s.TakeKVEvents(nil, 512)
		var small *kvevents.TooSmallError
		if errors.As(err, &small) {
			out, _, more, err = s.TakeKVEvents(nil, small.Need)
		}
		if err != nil {
			t.Fatal(err)
		}
		evs, _, err := kvevents.DecodeEvents(out)
		if err != nil {
			t.Fatal(err)
		}
		v.takes++
		for _, e := range evs {
			switch e.Kind {
			case kvevents.AllBlocksCleared:
				clear(v.held)
			case kvevents.BlockStored:
				if e.Medium != kvevents.MediumFS || e.Locality != kvevents.LocalityLocal {
					t.Fatalf("stored as %q %q", e.Medium, e.Locality)
				}
				if e.HasParent && !v.held[e.Parent.Uint()] {
					t.Fatalf("%v stored before its parent %v", e.Hashes[0], e.Parent)
				}
				for _, h := range e.Hashes {
					v.held[h.Uint()] = true
				}
			case kvevents.BlockRemoved:
				for _, h := range e.Hashes {
					if !v.held[h.Uint()] {
						t.Fatalf("%v removed, not held", h)
					}
					delete(v.held, h.Uint())
				}
			}
		}
	}
}

func (v *engineView) match(t *testing.T, s *Store, step string) {
	t.Helper()
	v.take(t, s)
	res := s.ResidentBlocks()
	for _, b := range res {
		if !v.held[b.ID] {
			t.Fatalf("%s: block %#x served, the engine does not hold it", step, b.ID)
		}
	}
	if len(v.held) != len(res) {
		t.Fatalf("%s: the engine holds %d blocks, the store serves %d", step, len(v.held), len(res))
	}
}

// TestKVEventsEngineTake: a store whose engine takes its events (no
// sockets): through saves that evict, discards, a queue that overflows,
// and a restart, what the engine took says exactly what the store serves.
func TestKVEventsEngineTake(t *testing.T) {
	g := tinyGeometry()
	rng := rand.New(rand.NewPCG(26, 1))
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 256)
	cfg.KVEvents = &kvevents.Config{Engine: true, MaxQueueEvents: 2}
	s, kv := openKV(t, cfg)
	limitBlocks(t, s, 20)
	v := &engineView{held: map[uint64]bool{}}
	v.match(t, s, "opened")
	var chains [][]uint64
	for step := range 40 {
		var name string
		if rng.IntN(5) > 0 || len(chains) == 0 {
			var ch []uint64
			if len(chains) > 0 && rng.IntN(2) == 0 {
				base := chains[rng.IntN(len(chains))]
				ch = append(ch, base[:1+rng.IntN(len(base))]...)
			}
			ch = append(ch, chainOf(uint64(step+1)<<32, 1+rng.IntN(5))...)
			pages := pageTable(rng, g, cfg.NumPages, len(ch))
			fill(kv, g, ch, pages)
			sv, err := s.SaveWithMeta(ch, pages, metaOf(g, ch))
			if err != nil {
				t.Fatal(err)
			}
			sv.Wait()
			chains = append(chains, ch)
			name = fmt.Sprintf("step %d: save %d", step, len(ch))
		} else {
			ch := chains[rng.IntN(len(chains))]
			n, err := s.Discard(ch[rng.IntN(len(ch))])
			name = fmt.Sprintf("step %d: discard (%d, %v)", step, n, err)
		}
		if step%3 != 2 { // some steps' events wait for the next take, as a busy engine's do
			v.match(t, s, name)
		}
	}
	st := s.Stats().Events
	if st.Gaps == 0 || st.DroppedEvents == 0 {
		t.Fatalf("the queue of 2 never overflowed: %+v", st.Stats)
	}
	if st.Endpoint != "" {
		t.Fatalf("an engine store bound %q", st.Endpoint)
	}
	closeKV(t, s, kv)
	s, kv = openKV(t, cfg)
	defer closeKV(t, s, kv)
	v.match(t, s, "reopened") // the recovered index, listed by the first take
	if len(v.held) == 0 {
		t.Fatal("nothing recovered")
	}
}

func TestKVEventsTakeNeedsEngine(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 16)
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	if _, _, _, err := s.TakeKVEvents(nil, 1<<20); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("no KVEvents: %v", err)
	}
	cfg2 := testConfig(t, g, kvshape.LayoutPerLayer, 16)
	cfg2.KVEvents = evConfig()
	s2, kv2 := openKV(t, cfg2)
	defer closeKV(t, s2, kv2)
	if _, _, _, err := s2.TakeKVEvents(nil, 1<<20); !errors.Is(err, kvevents.ErrNotEngine) {
		t.Fatalf("a socket publisher: %v", err)
	}
}
