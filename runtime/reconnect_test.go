package runtime

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
)

// serveAt serves cfg's store on socket (a restarted service reuses its path).
func serveAt(t *testing.T, cfg Config, socket string) *Service {
	t.Helper()
	v, err := Serve(cfg, socket)
	if err != nil {
		t.Fatalf("Serve: %v", err)
	}
	return v
}

// servedEngine is an engine connected to a service whose socket path a
// restarted service can take again; the engine closes with the test.
func servedEngine(t *testing.T) (Config, string, *Service, *Store, *HostKV) {
	t.Helper()
	cfg := testConfig(t, tinyGeometry(), kvshape.LayoutPerLayer, 64)
	socket := filepath.Join(t.TempDir(), "tutti.sock")
	v := serveAt(t, cfg, socket)
	a, kv := connectKV(t, v, cfg)
	t.Cleanup(func() { closeKV(t, a, kv) })
	return cfg, socket, v, a, kv
}

// waitLink polls s's link to its service until ok holds (10 s at most).
func waitLink(t *testing.T, s *Store, what string, ok func(ServiceLink) bool) ServiceLink {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l := s.Stats().Service
		if ok(l) {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: link %+v", what, l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConnectedStoreReconnects: the service restarts on its store; the
// engine, failing closed meanwhile, connects again by itself and hits what
// it saved before, byte for byte, and saves again. A hold of the lost
// connection is released without a word to the new one (its id would
// name another pin there: the service would refuse the call and drop the
// connection).
func TestConnectedStoreReconnects(t *testing.T) {
	cfg, socket, v, a, kv := servedEngine(t)
	rng := rand.New(rand.NewPCG(3, 4))
	chain := chainOf(0x21, 8)
	if n := saveFresh(t, a, kv, rng, chain).Saved(); n != len(chain) {
		t.Fatalf("saved %d of %d", n, len(chain))
	}
	h, err := a.Match(chain, 0, 1<<40)
	if err != nil || h.Blocks() != len(chain) {
		t.Fatalf("match: %d, %v", h.Blocks(), err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if n := a.Lookup(chain); n != 0 {
		t.Errorf("lookup with the service down: %d blocks", n)
	}
	if l := a.Stats().Service; l.Connected || l.Reconnects != 0 {
		t.Errorf("link with the service down: %+v", l)
	}
	// It dials, finds no service, and counts each attempt.
	waitLink(t, a, "a failed redial", func(l ServiceLink) bool { return l.DialFailures > 0 && l.LastDialError != "" })
	v2 := serveAt(t, cfg, socket)
	defer v2.Close()
	waitLink(t, a, "reconnect", func(l ServiceLink) bool { return l.Reconnects == 1 && l.Connected })
	h.Release() // the lost connection's pin: not sent to v2
	if n := a.Lookup(chain); n != len(chain) {
		t.Fatalf("lookup after the reconnect: %d of %d", n, len(chain))
	}
	loadExact(t, a, kv, rng, chain, len(chain))
	more := chainOf(0x900, 4)
	if n := saveFresh(t, a, kv, rng, more).Saved(); n != len(more) || v2.Store().Lookup(more) != len(more) {
		t.Errorf("save after the reconnect: %d of %d, the service finds %d", n, len(more), v2.Store().Lookup(more))
	}
	if st := v2.Stats(); st.Refused != 0 || st.Live != 1 {
		t.Errorf("service after the reconnect: %+v", st)
	}
}

// TestReconnectWaitsForTheLostSessionsIO: while a load or save of the lost
// connection may still read or write the pool, no new connection is made
// (a restarted service could hand that space out again).
func TestReconnectWaitsForTheLostSessionsIO(t *testing.T) {
	cfg, socket, v, a, _ := servedEngine(t)
	old := a.remote.session()
	old.io.Add(1) // as a load whose reads are in flight
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	v2 := serveAt(t, cfg, socket)
	defer v2.Close()
	time.Sleep(8 * ReconnectMinDelay) // several tries' worth
	if l := a.Stats().Service; l.Reconnects != 0 || l.Connected || v2.Stats().Connections != 0 {
		t.Fatalf("dialed with the lost session's I/O in flight: %+v, service %+v", l, v2.Stats())
	}
	old.io.Add(-1)
	waitLink(t, a, "reconnect once the I/O ended", func(l ServiceLink) bool { return l.Reconnects == 1 && l.Connected })
}

// TestReconnectRefusesAnotherStore: a service back on other directories,
// or on pool files made anew at the same paths, is not the store this
// engine placed its bytes by: it stops dialing, says why, and fails closed.
func TestReconnectRefusesAnotherStore(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restart func(t *testing.T, cfg Config) Config
	}{
		{"other directories", func(t *testing.T, cfg Config) Config {
			cfg.Dirs = []string{t.TempDir(), t.TempDir()}
			return cfg
		}},
		{"pool files made anew", func(t *testing.T, cfg Config) Config {
			for _, d := range cfg.Dirs {
				ents, err := os.ReadDir(d)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range ents {
					if err := os.RemoveAll(filepath.Join(d, e.Name())); err != nil {
						t.Fatal(err)
					}
				}
			}
			return cfg
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, socket, v, a, _ := servedEngine(t)
			if err := v.Close(); err != nil {
				t.Fatal(err)
			}
			v2 := serveAt(t, tc.restart(t, cfg), socket)
			defer v2.Close()
			l := waitLink(t, a, "refusal", func(l ServiceLink) bool { return l.ReconnectError != "" })
			if l.Connected || l.Reconnects != 0 {
				t.Errorf("link after the refusal: %+v", l)
			}
			if n := a.Lookup(chainOf(1, 2)); n != 0 {
				t.Errorf("lookup after the refusal: %d", n)
			}
			waitLive(t, v2, 0) // the refused connection was closed, and no other is made
		})
	}
}

// TestCloseAfterACallClosedTheConnection: a call whose write or response
// fails closes the connection itself (the reader then fails every waiter);
// the store's Close afterwards is not an error.
func TestCloseAfterACallClosedTheConnection(t *testing.T) {
	_, _, _, a, _ := servedEngine(t)
	if err := a.remote.session().conn.Close(); err != nil { // as call does on a failed write
		t.Fatal(err)
	}
	if n := a.Lookup(chainOf(0x31, 2)); n != 0 {
		t.Errorf("lookup on a closed connection: %d blocks", n)
	}
	// servedEngine's cleanup closes the store and fails the test on an error.
}
