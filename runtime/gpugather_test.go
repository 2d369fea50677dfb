package runtime

import (
	"errors"
	"math/rand/v2"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
)

// TestGPUSaveGathersConcurrently: on PathGPU the stage workers' gathers of
// one save run at once, each on its own lane (no lock over them: that
// serialized every save behind every other). Each gather of the CPU
// restorer waits until want of them are in flight; if they never are (the
// gathers are serialized), the wait gives up after a deadline and the test
// fails. The saved bytes then restore bit-exact into other pages.
func TestGPUSaveGathersConcurrently(t *testing.T) {
	const want, numPages = 4, 128
	// The stage pool has min(GOMAXPROCS, workpool.MaxWorkers) workers, made at Open.
	if goruntime.GOMAXPROCS(0) < want {
		defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(want))
	}
	s, kv, gpu := gpuStoreOnCPU(t, numPages, nil, func(c *Config) {
		// Room for want 8 KiB writes in flight on the one device (a quarter
		// of the staging bytes).
		c.StagingBytes = 256 << 10
	})
	defer closeKV(t, s, kv)
	var (
		inFlight, peak atomic.Int32
		reached        = make(chan struct{})
		reachedOnce    sync.Once
		gaveUp         = make(chan struct{})
	)
	timer := time.AfterFunc(10*time.Second, func() { close(gaveUp) })
	defer timer.Stop()
	gpu.OnGather = func(int) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if n >= want {
			reachedOnce.Do(func() { close(reached) })
		}
		select {
		case <-reached:
		case <-gaveUp:
		}
	}
	g := s.Geometry()
	rng := rand.New(rand.NewPCG(21, 3))
	a := chainOf(9400, 24) // 24 KiB per layer: many 8 KiB writes
	pa := pageTable(rng, g, numPages, len(a))
	fill(kv, g, a, pa)
	sv := saveWait(t, s, a, pa)
	select {
	case <-reached:
	default:
		t.Fatalf("at most %d gathers of the save in flight at once, want %d (they waited %v for each other)", peak.Load(), want, 10*time.Second)
	}
	if sv.Saved() != len(a) {
		t.Fatalf("saved %d of %d blocks: %+v", sv.Saved(), len(a), s.Stats())
	}
	// The chunk CRCs committed come from the restorer's plane CRCs
	// (the GPU mover folds them): fsck reads every payload back against them.
	if err := s.WaitSaves(); err != nil {
		t.Fatal(err)
	}
	if rep, err := s.Check(); err != nil || rep.Corrupt != 0 || s.Stats().Map.LiveRuns == 0 {
		t.Fatalf("fsck of the GPU path's save: %v %+v", err, rep)
	}
	scramble(kv, g, numPages)
	pl := pageTable(rng, g, numPages, len(a))
	if l := loadWait(t, s, a, pl); l.Blocks() != len(a) {
		t.Fatalf("restored %d of %d blocks (%v)", l.Blocks(), len(a), l.Failure())
	}
	if err := verify(kv, g, a, pl, len(a)); err != nil {
		t.Fatalf("restore of the concurrently gathered save: %v", err)
	}
}

// TestGPUSaveAfterEvent: a save given the engine's event
// (SaveOptions.AfterEvent) gathers what the engine wrote before the event,
// not what the pages held at the call: here the engine writes the KV only
// after Save returned, then completes the event; until then nothing is
// gathered. The save restores bit-exact. On PathCPU the option is ErrNotGPU.
func TestGPUSaveAfterEvent(t *testing.T) {
	const numPages = 64
	s, kv, gpu := gpuStoreOnCPU(t, numPages, nil)
	defer closeKV(t, s, kv)
	g := s.Geometry()
	rng := rand.New(rand.NewPCG(5, 8))
	a := chainOf(9700, 6)
	pa := pageTable(rng, g, numPages, len(a))
	scramble(kv, g, numPages) // the pages before the engine's writes
	ev := gpu.NewEvent()
	sv, err := s.SaveWith(a, pa, SaveOptions{AfterEvent: ev})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sv.Gathered():
		t.Fatal("the save was gathered before the engine's event completed")
	case <-time.After(50 * time.Millisecond):
	}
	fill(kv, g, a, pa) // the engine's step, then its event
	gpu.Complete(ev)
	select {
	case <-sv.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the save did not end 10 s after the engine's event")
	}
	if sv.Saved() != len(a) {
		t.Fatalf("saved %d of %d blocks: %+v", sv.Saved(), len(a), s.Stats())
	}
	scramble(kv, g, numPages)
	pl := pageTable(rng, g, numPages, len(a))
	if l := loadWait(t, s, a, pl); l.Blocks() != len(a) {
		t.Fatalf("restored %d of %d blocks (%v)", l.Blocks(), len(a), l.Failure())
	}
	if err := verify(kv, g, a, pl, len(a)); err != nil {
		t.Fatalf("the save gathered the pages before the engine's writes: %v", err)
	}
	// An event of no engine's: the gathers fail, the save skips its blocks.
	b := chainOf(9800, 2)
	pb := pageTable(rng, g, numPages, len(b))
	sv, err = s.SaveWith(b, pb, SaveOptions{AfterEvent: 0xBAD0})
	if err != nil {
		t.Fatal(err)
	}
	sv.Wait()
	if sv.Saved() != 0 || sv.Skipped(SkipIOError) != len(b) {
		t.Fatalf("a save after an unknown event: saved %d, skipped %d as io-error, want 0 and %d", sv.Saved(), sv.Skipped(SkipIOError), len(b))
	}

	cs, ckv := openKV(t, testConfig(t, g, kvshape.LayoutPerLayer, numPages))
	defer closeKV(t, cs, ckv)
	if _, err := cs.SaveWith(a, pa, SaveOptions{AfterEvent: 1}); !errors.Is(err, ErrNotGPU) {
		t.Fatalf("PathCPU save after an event: %v, want ErrNotGPU", err)
	}
}
