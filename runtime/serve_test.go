package runtime

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
)

// startService serves a test store on a socket in a temporary directory.
func startService(t *testing.T, cfg Config) *Service {
	t.Helper()
	v, err := Serve(cfg, filepath.Join(t.TempDir(), "tutti.sock"))
	if err != nil {
		t.Fatalf("Serve: %v", err)
	}
	return v
}

// connectKV connects an engine to v with fresh host KV memory.
func connectKV(t *testing.T, v *Service, cfg Config) (*Store, *HostKV) {
	t.Helper()
	cfg.Dirs, cfg.CapacityBytes = nil, 0 // the service's
	s, err := Connect(v.Socket(), cfg)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	kv, err := AllocHostKV(cfg.Geometry, cfg.Layout, cfg.NumPages)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterKV(kv.Memory()); err != nil {
		t.Fatal(err)
	}
	return s, kv
}

// TestServiceSharesPrefixes: a prefix one engine saved is a hit for
// another, loaded byte for byte into its own memory; a load pins what it
// reads; what a closed connection held is released.
func TestServiceSharesPrefixes(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	v := startService(t, cfg)
	a, kva := connectKV(t, v, cfg)
	b, kvb := connectKV(t, v, cfg)
	rng := rand.New(rand.NewPCG(1, 2))
	chain := chainOf(0x5e, 12)
	pa := pageTable(rng, g, cfg.NumPages, len(chain))
	fill(kva, g, chain, pa)
	sv, err := a.Save(chain, pa)
	if err != nil {
		t.Fatal(err)
	}
	sv.Wait()
	if err := a.WaitSaves(); err != nil || sv.Saved() != len(chain) {
		t.Fatalf("saved %d of %d: %v", sv.Saved(), len(chain), err)
	}
	if n := b.Lookup(chain); n != len(chain) {
		t.Fatalf("engine b finds %d of %d blocks", n, len(chain))
	}
	pb := pageTable(rng, g, cfg.NumPages, len(chain))
	scramble(kvb, g, cfg.NumPages)
	l, err := b.Load(chain, pb)
	if err != nil {
		t.Fatal(err)
	}
	// While b's load pins the prefix, a discard of it leaves it readable.
	if err := l.Wait(); err != nil || l.Blocks() != len(chain) {
		t.Fatalf("loaded %d of %d: %v (%v)", l.Blocks(), len(chain), err, l.Failure())
	}
	if err := verify(kvb, g, chain, pb, len(chain)); err != nil {
		t.Fatal(err)
	}
	// A second save of the same prefix by b is all cached.
	sv2, err := b.Save(chain, pb)
	if err != nil {
		t.Fatal(err)
	}
	sv2.Wait()
	if sv2.Skipped(SkipCached) != len(chain) {
		t.Fatalf("b's save of a's prefix: %d cached of %d", sv2.Skipped(SkipCached), len(chain))
	}
	if _, _, _, err := a.TakeKVEvents(nil, 1<<20); !errors.Is(err, ErrBadRequest) {
		t.Errorf("TakeKVEvents of a connected store: %v", err)
	}
	// A hold that is never released is released by closing the connection.
	h, err := b.Match(chain, 0, 1<<40)
	if err != nil || h.Blocks() != len(chain) {
		t.Fatalf("match: %v", err)
	}
	closeKV(t, b, kvb)
	waitLive(t, v, 1)
	if st := v.Stats(); st.ReleasedPins != 1 {
		t.Errorf("released pins %d, want 1 (the hold)", st.ReleasedPins)
	}
	if n, err := a.Discard(chain[0]); err != nil || n != len(chain) {
		t.Errorf("discard after b closed: %d blocks, %v", n, err)
	}
	closeKV(t, a, kva)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
}

// waitLive waits until the service has released closed connections down
// to live (it notices a close asynchronously).
func waitLive(t *testing.T, v *Service, live int) {
	t.Helper()
	for i := 0; v.Stats().Live != live; i++ {
		if i == 1000 {
			t.Fatalf("service has %d connections, want %d", v.Stats().Live, live)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
