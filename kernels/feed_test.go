package kernels

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// simGPU is feedOps over a simulated GPU: enqueued layers join one stream
// and complete in enqueue order, one every few microseconds. It checks what
// the library and the GPU's command queue require of the feeder: a restore
// is submitted only when no earlier one has layers left to enqueue, layers
// are enqueued in order, waits only name enqueued layers, and no restore
// has more than ahead layers on the stream beyond its last completed one.
type simGPU struct {
	ahead int
	rng   *rand.Rand // guarded by mu
	// failAt: the enqueue call with this count fails (0: none)
	failAt, enqueues int

	mu      sync.Mutex
	cond    sync.Cond
	stream  []simLayer // enqueued, not completed
	items   map[*feedItem]*simItem
	nextID  uint32
	stopped bool
	errs    []string
}

type simLayer struct {
	it    *feedItem
	layer int
}

type simItem struct {
	enqueued, completed int
}

func newSimGPU(seed uint64, ahead int) *simGPU {
	g := &simGPU{ahead: ahead, rng: rand.New(rand.NewPCG(seed, 3)), items: map[*feedItem]*simItem{}}
	g.cond.L = &g.mu
	go g.run()
	return g
}

// run completes the stream's head layer after a random few microseconds.
func (g *simGPU) run() {
	for {
		g.mu.Lock()
		for len(g.stream) == 0 && !g.stopped {
			g.cond.Wait()
		}
		if g.stopped {
			g.mu.Unlock()
			return
		}
		d := time.Duration(g.rng.IntN(40)) * time.Microsecond
		g.mu.Unlock()
		time.Sleep(d)
		g.mu.Lock()
		h := g.stream[0]
		g.stream = g.stream[1:]
		g.items[h.it].completed = h.layer + 1
		g.cond.Broadcast()
		g.mu.Unlock()
	}
}

func (g *simGPU) stop() {
	g.mu.Lock()
	g.stopped = true
	g.cond.Broadcast()
	g.mu.Unlock()
}

func (g *simGPU) failf(format string, a ...any) { g.errs = append(g.errs, fmt.Sprintf(format, a...)) }

func (g *simGPU) push(it *feedItem, s *simItem, upto int) {
	for l := s.enqueued; l < upto; l++ {
		if l-s.completed >= g.ahead {
			g.failf("layer %d enqueued with only %d of the restore's layers completed (ahead %d)", l, s.completed, g.ahead)
		}
		g.stream = append(g.stream, simLayer{it, l})
	}
	s.enqueued = upto
	g.cond.Broadcast()
}

func (g *simGPU) submit(it *feedItem, layers int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for o, s := range g.items {
		if s.enqueued < o.layers && s.completed < o.layers {
			g.failf("submit while a restore has %d of %d layers enqueued", s.enqueued, o.layers)
		}
	}
	if layers > g.ahead || layers > it.layers {
		g.failf("submit enqueues %d of %d layers (ahead %d)", layers, it.layers, g.ahead)
	}
	s := &simItem{}
	g.items[it] = s
	it.id = g.nextID
	g.nextID++
	g.push(it, s, layers)
	return nil
}

func (g *simGPU) enqueue(it *feedItem, upto int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.enqueues++
	if g.enqueues == g.failAt {
		return fmt.Errorf("simulated launch failure: %w", ErrCUDA)
	}
	s := g.items[it]
	if s == nil || upto <= s.enqueued || upto > it.layers {
		g.failf("enqueue up to %d: not past the %d layers enqueued", upto, s.enqueued)
		return ErrInvalid
	}
	g.push(it, s, upto)
	return nil
}

func (g *simGPU) waitLayer(it *feedItem, layer int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.items[it]
	if s == nil || layer < 0 || layer >= s.enqueued {
		g.failf("wait on layer %d, not enqueued", layer)
		return ErrInvalid
	}
	for s.completed <= layer {
		g.cond.Wait()
	}
	return nil
}

// TestFeeder: clients restore requests of 1 to 100 layers through the
// feeder, several at once, each waiting for every layer the way the
// runtime's loads do, then releasing (waitDone). Seeded; the simulated
// GPU's checks hold. With a failing enqueue (armed after a first restore
// completed), its restore and every later one fail with the error, and
// nothing hangs.
func TestFeeder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ahead   int
		chunk   int
		clients int
		failAt  int
	}{
		{"ahead 1", 1, 1, 3, 0},
		{"ahead 3", 3, 1, 4, 0},
		{"ahead 16", 16, 1, 2, 0},
		{"ahead 16 chunk 4", 16, 4, 3, 0},
		{"ahead 5 chunk 5", 5, 5, 3, 0},
		{"enqueue fails", 4, 1, 3, 30},
		{"enqueue fails chunk 2", 4, 2, 3, 12},
	} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", tc.name, seed), func(t *testing.T) {
				g := newSimGPU(seed, tc.ahead)
				defer g.stop()
				var lib sync.Mutex
				f := newFeeder(g, &lib, tc.ahead, tc.chunk)
				rng := rand.New(rand.NewPCG(seed, 7))
				var wg sync.WaitGroup
				var mu sync.Mutex
				var failed, ok int
				// One restore alone first; the fault is armed after it.
				first := &feedItem{layers: 10}
				lib.Lock()
				err := f.start(first)
				lib.Unlock()
				if err != nil {
					t.Fatal(err)
				}
				if err := f.waitFed(first, 10); err != nil {
					t.Fatal(err)
				}
				f.waitDone(first)
				g.mu.Lock()
				if tc.failAt > 0 {
					g.failAt = g.enqueues + tc.failAt
				}
				g.mu.Unlock()
				for c := 0; c < tc.clients; c++ {
					sizes := []int{}
					for range 6 {
						sizes = append(sizes, 1+rng.IntN(100))
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						for _, n := range sizes {
							it := &feedItem{layers: n}
							lib.Lock()
							werr := f.start(it) // a restore after the failure fails here
							lib.Unlock()
							for l := 0; l < n && werr == nil; l++ {
								if werr = f.waitFed(it, l+1); werr == nil {
									werr = g.waitLayer(it, l)
								}
							}
							f.waitDone(it)
							mu.Lock()
							if werr != nil {
								failed++
								if !errors.Is(werr, ErrCUDA) {
									t.Errorf("%d-layer restore: %v, want the simulated launch failure", n, werr)
								}
							} else {
								ok++
							}
							mu.Unlock()
						}
					}()
				}
				done := make(chan struct{})
				go func() { wg.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(60 * time.Second):
					t.Fatal("clients still waiting after 60 s: the feeder hangs")
				}
				f.stop()
				g.mu.Lock()
				defer g.mu.Unlock()
				for _, e := range g.errs {
					t.Error(e)
				}
				if tc.failAt == 0 && failed > 0 {
					t.Fatalf("%d restores failed without a fault", failed)
				}
				if tc.failAt > 0 && failed == 0 {
					t.Fatalf("enqueue %d fails: no restore failed (%d completed)", tc.failAt, ok)
				}
				if tc.failAt == 0 {
					// stopped: a restore started now fails at once instead of waiting forever
					it := &feedItem{layers: 3}
					if err := f.start(it); !errors.Is(err, ErrInvalid) || !it.done || !errors.Is(it.err, ErrInvalid) {
						t.Fatalf("restore after stop: done %v, err %v", it.done, it.err)
					}
				}
				if tc.failAt > 0 {
					// fail closed: a restore started now fails at once
					it := &feedItem{layers: 3}
					if err := f.start(it); !errors.Is(err, ErrCUDA) || !it.done || !errors.Is(it.err, ErrCUDA) {
						t.Fatalf("restore after the failure: done %v, err %v", it.done, it.err)
					}
				}
			})
		}
	}
}

// TestCheckFeed: the feeder's settings are refused by name, after defaults.
func TestCheckFeed(t *testing.T) {
	for _, tc := range []struct {
		layers, chunk int
		ok            bool
	}{
		{0, 0, true}, {0, 16, true}, {0, 17, false}, {8, 8, true}, {8, 9, false}, {-1, 0, false}, {4, -1, false},
	} {
		c := Config{EnqueueLayers: tc.layers, EnqueueChunk: tc.chunk}
		c.defaults()
		err := c.checkFeed()
		if (err == nil) != tc.ok || (err != nil && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "EnqueueChunk"))) {
			t.Errorf("EnqueueLayers %d, EnqueueChunk %d: %v", tc.layers, tc.chunk, err)
		}
	}
}

// TestFeedDefaults: the feeder's defaults follow the lookahead, and the
// chunk is half the layers enqueued ahead, 1..8.
func TestFeedDefaults(t *testing.T) {
	for _, tc := range []struct {
		lookahead, layers, chunk int // in: Lookahead, EnqueueLayers (0: default)
		wantLayers, wantChunk    int
	}{
		{1, 0, 0, 16, 8},  // 2×(1+3) = 8 → at least 16
		{11, 0, 0, 28, 8}, // 2×(11+3)
		{30, 0, 0, 48, 8}, // capped at 48
		{1, 6, 0, 6, 3},   // half of an explicit EnqueueLayers
		{1, 1, 0, 1, 1},   // at least 1
		{4, 0, 2, 16, 2},  // an explicit chunk is kept
	} {
		c := Config{Lookahead: tc.lookahead, EnqueueLayers: tc.layers, EnqueueChunk: tc.chunk}
		c.defaults()
		if c.EnqueueLayers != tc.wantLayers || c.EnqueueChunk != tc.wantChunk {
			t.Errorf("Lookahead %d, EnqueueLayers %d, EnqueueChunk %d: defaults %d/%d, want %d/%d",
				tc.lookahead, tc.layers, tc.chunk, c.EnqueueLayers, c.EnqueueChunk, tc.wantLayers, tc.wantChunk)
		}
		if err := c.checkFeed(); err != nil {
			t.Errorf("defaults refused: %v", err)
		}
	}
}
