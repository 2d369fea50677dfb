package kvevents_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/kvevents"
)

// ordered is a store whose contents list in id order (parents first here).
type ordered struct{ ids []uint64 }

func (o *ordered) list(emit func(kvevents.Event)) {
	for _, id := range o.ids {
		emit(stored(id))
	}
}

func (o *ordered) do(p *kvevents.Publisher, add []uint64, del []uint64) {
	p.Do(func(emit func(kvevents.Event)) {
		for _, id := range add {
			o.ids = append(o.ids, id)
			emit(stored(id))
		}
		for _, id := range del {
			o.ids = slices.DeleteFunc(o.ids, func(x uint64) bool { return x == id })
			emit(removed(id))
		}
	})
}

// brief renders events as "S1 R2 C" (stored, removed, cleared).
func brief(t *testing.T, p []byte, f kvevents.Format) string {
	t.Helper()
	evs, got, err := kvevents.DecodeEvents(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) > 0 && got != f {
		t.Fatalf("events in %v, want %v", got, f)
	}
	var out []string
	for _, e := range evs {
		switch e.Kind {
		case kvevents.AllBlocksCleared:
			out = append(out, "C")
		case kvevents.BlockStored:
			out = append(out, fmt.Sprintf("S%d", e.Hashes[0].Uint()))
		case kvevents.BlockRemoved:
			out = append(out, fmt.Sprintf("R%d", e.Hashes[0].Uint()))
		}
	}
	return strings.Join(out, " ")
}

func newEngine(t *testing.T, cfg kvevents.Config, o *ordered) *kvevents.Publisher {
	t.Helper()
	cfg.Engine = true
	p, err := kvevents.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	p.SetContents(o.list)
	return p
}

func TestTakeEngine(t *testing.T) {
	for _, f := range []kvevents.Format{kvevents.FormatVLLM026, kvevents.FormatVLLM011} {
		t.Run(f.String(), func(t *testing.T) {
			o := &ordered{}
			p := newEngine(t, kvevents.Config{Format: f}, o)
			if p.Endpoint() != "" || p.ReplayEndpoint() != "" {
				t.Fatalf("an engine publisher bound %q %q", p.Endpoint(), p.ReplayEndpoint())
			}
			// Changes before the first Take are in its listing, not repeated.
			o.do(p, []uint64{1, 2, 3}, []uint64{3})
			steps := []struct {
				add, del []uint64
				want     string
			}{
				{nil, nil, "C S1 S2"},
				{[]uint64{4}, []uint64{1}, "S4 R1"},
				{nil, nil, ""},
			}
			for i, s := range steps {
				o.do(p, s.add, s.del)
				out, n, more, err := p.Take(nil, 1<<20)
				if err != nil || more {
					t.Fatalf("step %d: %v, more %v", i, err, more)
				}
				if got := brief(t, out, f); got != s.want || n != strings.Count(s.want, " ")+min(1, len(s.want)) {
					t.Fatalf("step %d: took %q (%d), want %q", i, got, n, s.want)
				}
			}
			if st := p.Stats(); st.Batches != 2 || st.Events != 5 || st.DroppedEvents != 0 {
				t.Fatalf("%+v", st)
			}
		})
	}
}

func TestTakeBounds(t *testing.T) {
	o := &ordered{}
	p := newEngine(t, kvevents.Config{MaxBatchEvents: 3}, o)
	o.do(p, []uint64{1, 2, 3, 4, 5}, nil)
	one := len(kvevents.AppendEvents(nil, []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}, kvevents.FormatVLLM026))
	if _, _, _, err := p.Take(nil, one-1); !errors.As(err, new(*kvevents.TooSmallError)) {
		t.Fatalf("a buffer smaller than one event: %v", err)
	}
	var got []string
	for _, max := range []int{one + 4, 1 << 20, 1 << 20} { // one event fits, then MaxBatchEvents bounds
		out, _, more, err := p.Take(nil, max)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, brief(t, out, kvevents.FormatVLLM026))
		if more != (len(got) < 3) {
			t.Fatalf("take %d: more %v", len(got), more)
		}
	}
	if want := []string{"C", "S1 S2 S3", "S4 S5"}; !slices.Equal(got, want) {
		t.Fatalf("took %q, want %q", got, want)
	}
}

// Past MaxQueueEvents the queue is dropped, counted, and the next Take
// lists the contents, which hold every dropped change.
func TestTakeOverflowLists(t *testing.T) {
	o := &ordered{}
	p := newEngine(t, kvevents.Config{MaxQueueEvents: 4}, o)
	if out, _, _, _ := p.Take(nil, 1<<20); brief(t, out, 0) != "C" {
		t.Fatal("first take is not an empty listing")
	}
	o.do(p, []uint64{1, 2, 3, 4}, nil)
	o.do(p, []uint64{5}, []uint64{2})
	st := p.Stats()
	if st.DroppedEvents != 5 || st.Gaps != 1 || st.QueuedEvents != 0 {
		t.Fatalf("%+v", st)
	}
	out, _, _, err := p.Take(nil, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got := brief(t, out, 0); got != "C S1 S3 S4 S5" {
		t.Fatalf("after the overflow took %q", got)
	}
}

func TestTakeNeedsEngine(t *testing.T) {
	p := newPub(t, kvevents.Config{})
	if _, _, _, err := p.Take(nil, 1<<20); !errors.Is(err, kvevents.ErrNotEngine) {
		t.Fatalf("Take on a socket publisher: %v", err)
	}
	o := &ordered{}
	e := newEngine(t, kvevents.Config{}, o)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	o.do(e, []uint64{1}, nil)
	if out, n, _, err := e.Take(nil, 1<<20); err != nil || n != 0 || brief(t, out, 0) != "" || e.Stats().DroppedEvents != 1 {
		t.Fatalf("after Close: %d events, %v, %+v", n, err, e.Stats())
	}
}
