package runtime

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/sched"
	"github.com/tutti-io/tutti/uring"
	"github.com/tutti-io/tutti/uring/uringsim"
)

// submitLog is an engine that records where the reads submitted to it
// read, in order, and runs them on a Sim.
type submitLog struct {
	uring.Engine
	mu    sync.Mutex
	reads []readAt
}

// readAt is where one read read.
type readAt struct {
	path string
	off  int64
}

func (e *submitLog) Submit(c *uring.Completion) error {
	if c.Op().IsRead() {
		e.mu.Lock()
		e.reads = append(e.reads, readAt{c.File().Path, int64(c.Offset())})
		e.mu.Unlock()
	}
	return e.Engine.Submit(c)
}

// readsOf names each read by the (layer, run) it reads: the layer of the
// object of one of the store's runs that its offset lies in.
func readsOf(t *testing.T, s *Store, reads []readAt) []sched.IO {
	t.Helper()
	g := s.Geometry()
	runs := s.cat.Runs()
	out := make([]sched.IO, len(reads))
	for i, rd := range reads {
		found := false
		for ri, r := range runs {
			for l := 0; l < g.Layers && !found; l++ {
				path, off := objectAt(t, s, r, l)
				if path == rd.path && rd.off >= off && rd.off < off+objmap.ObjectStride(g, r.Chunks) {
					out[i], found = sched.IO{Kind: sched.IORead, Layer: l, Run: ri}, true
				}
			}
		}
		if !found {
			t.Fatalf("read %d at %s+%d is in no run's object", i, rd.path, rd.off)
		}
	}
	return out
}

// TestLoadSubmitsLayerMajor: a load whose runs lie on several devices
// submits its reads layer by layer across the devices (the scheduler hands
// them out one device after another), so every device reads layer 0 first
// and the layers become ready as early as the devices allow. The restore is
// bit-exact either way.
func TestLoadSubmitsLayerMajor(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			g := tinyGeometry()
			g.Layers = 6
			cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
			cfg.Dirs = append(cfg.Dirs, t.TempDir(), t.TempDir())
			log := &submitLog{}
			cfg.NewEngine = func() (uring.Engine, error) {
				log.Engine = uringsim.New(uringsim.Config{Seed: seed})
				return log, nil
			}
			s, kv := openKV(t, cfg)
			defer closeKV(t, s, kv)
			rng := rand.New(rand.NewPCG(seed, 7))
			chain := chainOf(1<<32, 4)
			pages := pageTable(rng, g, cfg.NumPages, len(chain))
			fill(kv, g, chain, pages)
			for n := 1; n <= len(chain); n++ { // one run per block
				if sv := saveWait(t, s, chain[:n], pages[:n*g.ChunkPages]); sv.Saved() != 1 {
					t.Fatalf("saving block %d: saved %d", n-1, sv.Saved())
				}
			}
			scramble(kv, g, cfg.NumPages)
			log.mu.Lock()
			log.reads = nil
			log.mu.Unlock()
			l := loadWait(t, s, chain, pages)
			if l.Blocks() != len(chain) {
				t.Fatalf("restored %d of %d blocks: %v", l.Blocks(), len(chain), l.Failure())
			}
			if err := verify(kv, g, chain, pages, len(chain)); err != nil {
				t.Fatal(err)
			}
			if devs := layerBlocks(s, l.runs); len(devs) < 2 {
				t.Fatalf("the runs lie on %d device(s); the test needs several", len(devs))
			}
			log.mu.Lock()
			reads := readsOf(t, s, log.reads)
			log.mu.Unlock()
			if want := g.Layers * len(l.runs); len(reads) < want {
				t.Fatalf("%d reads submitted, want at least %d", len(reads), want)
			}
			for i := 1; i < len(reads); i++ {
				if reads[i].Layer < reads[i-1].Layer {
					t.Fatalf("read %d (layer %d, run %d) submitted after read %d (layer %d, run %d): submission order %v",
						i, reads[i].Layer, reads[i].Run, i-1, reads[i-1].Layer, reads[i-1].Run, layersOf(reads))
				}
			}
		})
	}
}

func layersOf(ios []sched.IO) []string {
	out := make([]string, len(ios))
	for i, io := range ios {
		out[i] = fmt.Sprintf("L%d/r%d", io.Layer, io.Run)
	}
	return out
}

// gatedReads is an engine whose reads are submitted only once gate is
// closed (writes go at once).
type gatedReads struct {
	uring.Engine
	gate chan struct{}
}

func (e *gatedReads) Submit(c *uring.Completion) error {
	if c.Op().IsRead() {
		<-e.gate
	}
	return e.Engine.Submit(c)
}

// TestLoadDoneOnlyOnceEnded: Done never blocks, is false while a read of
// the load is held back, and true once the load ended, with every block
// restored (an engine polling it, as vLLM's asynchronous loads do, then
// finds the pages written).
func TestLoadDoneOnlyOnceEnded(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	eng := &gatedReads{gate: make(chan struct{})}
	cfg.NewEngine = func() (uring.Engine, error) {
		eng.Engine = uringsim.New(uringsim.Config{Seed: 3})
		return eng, nil
	}
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	rng := rand.New(rand.NewPCG(3, 9))
	chain := chainOf(1<<33, 3)
	pages := pageTable(rng, g, cfg.NumPages, len(chain))
	fill(kv, g, chain, pages)
	if sv := saveWait(t, s, chain, pages); sv.Saved() != len(chain) {
		t.Fatalf("saved %d of %d blocks", sv.Saved(), len(chain))
	}
	scramble(kv, g, cfg.NumPages)
	l, err := s.Load(chain, pages)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	for i := 0; i < 100; i++ {
		if l.Done() {
			close(eng.gate)
			t.Fatalf("Done while its reads are held back (poll %d)", i)
		}
	}
	close(eng.gate)
	if err := l.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if !l.Done() || l.Blocks() != len(chain) {
		t.Fatalf("after Wait: Done %v, %d of %d blocks", l.Done(), l.Blocks(), len(chain))
	}
	if err := verify(kv, g, chain, pages, len(chain)); err != nil {
		t.Fatal(err)
	}
}
