package runtime

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu/gputest"
	"github.com/tutti-io/tutti/sched"
)

// cpuGPU binds a gputest.Restorer (Config.gpuBind); each bound one is
// sent on bound when it is not nil.
func cpuGPU(gate chan struct{}, bound chan<- *gputest.Restorer) func(Config, []mover.Region) (gpu.Restorer, error) {
	return func(cfg Config, kv []mover.Region) (gpu.Restorer, error) {
		c := gputest.New(gpuConfig(cfg, nil, nil, nil), kv, gate)
		if bound != nil {
			bound <- c
		}
		return c, nil
	}
}

// gpuStoreOnCPU opens a PathGPU store whose restorer is the CPU one (gate:
// see gputest.Restorer) and registers host KV memory with it; tune, if given,
// changes the config last.
func gpuStoreOnCPU(t *testing.T, numPages int, gate chan struct{}, tune ...func(*Config)) (*Store, *HostKV, *gputest.Restorer) {
	t.Helper()
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, numPages)
	cfg.Dirs = cfg.Dirs[:1] // one device: the save is written where the restore reads
	bound := make(chan *gputest.Restorer, 1)
	cfg.Path, cfg.gpuBind = PathGPU, cpuGPU(gate, bound)
	cfg.SaveBoundMs = 600000 // no write is promoted while the test holds a restore
	// Recomputing costs far more than reading, so every cached block is
	// loaded; a fully cached chain then leaves no compute after the reads,
	// and its last layer's reads have no slack.
	cm, err := sched.NewComputeModel(0, 100e3, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Compute = cm
	for _, f := range tune {
		f(&cfg)
	}
	s, kv := openKV(t, cfg)
	return s, kv, <-bound
}

// dispatchRound runs one round of the scheduler now, as its goroutine does
// after every request and completion.
func dispatchRound(s *Store) { s.sched.DispatchNow() }

// TestGPUSavesWaitBehindRestore: on PathGPU a restore is a job of the
// scheduler from dispatch until the GPU reports its layers, so a save
// enqueued while a restore is in flight is not written beside it (the
// restore's reads have no slack to spare) and is written, not promoted,
// once the restore's layers are retired. The restore is dispatched once,
// nothing is cancelled, and the restored bytes are the saved ones.
func TestGPUSavesWaitBehindRestore(t *testing.T) {
	const numPages = 64
	gate := make(chan struct{})
	s, kv, gpu := gpuStoreOnCPU(t, numPages, gate)
	defer closeKV(t, s, kv)
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	defer release() // before closeKV: a failed test must not leave the restore held
	g := s.Geometry()
	rng := rand.New(rand.NewPCG(21, 1))
	a := chainOf(9000, 6)
	pa := pageTable(rng, g, numPages, len(a))
	fill(kv, g, a, pa)
	if sv := saveWait(t, s, a, pa); sv.Saved() != len(a) {
		t.Fatalf("saved %d of %d: %+v", sv.Saved(), len(a), s.Stats())
	}
	written := s.Stats().Sched.WritesDispatched
	scramble(kv, g, numPages)
	pl := pageTable(rng, g, numPages, len(a))
	l, err := s.Load(a, pl) // held in flight at its first layer by the gate
	if err != nil {
		t.Fatal(err)
	}
	if l.Planned() != len(a) {
		t.Fatalf("planned %d of %d blocks: the test needs all loaded", l.Planned(), len(a))
	}
	b := chainOf(9100, 3)
	pb := pageTable(rng, g, numPages, len(b))
	fill(kv, g, b, pb)
	sv, err := s.Save(b, pb)
	if err != nil {
		t.Fatal(err)
	}
	dispatchRound(s)
	if st := s.Stats().Sched; st.WritesDispatched != written || st.RestoresDispatched != 1 {
		t.Fatalf("with the restore in flight: %d writes dispatched (%d before), %d restores: want the save deferred behind the restore",
			st.WritesDispatched, written, st.RestoresDispatched)
	}
	select {
	case <-sv.Done():
		t.Fatal("the save ended while the restore it waits behind was held")
	default:
	}
	release()
	if err := l.Wait(); err != nil || l.Blocks() != len(a) {
		t.Fatalf("restore: %d of %d blocks, %v (%v)", l.Blocks(), len(a), err, l.Failure())
	}
	sv.Wait()
	if sv.Saved() != len(b) {
		t.Fatalf("saved %d of %d behind the restore: %+v", sv.Saved(), len(b), s.Stats())
	}
	if err := verify(kv, g, a, pl, len(a)); err != nil {
		t.Fatalf("GPU path restore: %v", err)
	}
	st := s.Stats().Sched
	if st.WritesDispatched == written || st.WritesPromoted != 0 || st.Cancelled != 0 || gpu.Calls() != 1 {
		t.Errorf("after the restore: %+v, %d GPU restores: want the save's writes dispatched, none promoted, nothing cancelled, one restore", st, gpu.Calls())
	}
}

// TestGPUFailedEntryMapsToRun: a failed entry of the GPU restore makes the
// run of its extent and every later run a miss (MissIOError); the runs
// before it are restored.
func TestGPUFailedEntryMapsToRun(t *testing.T) {
	const numPages = 64
	s, kv, gpu := gpuStoreOnCPU(t, numPages, nil)
	defer closeKV(t, s, kv)
	g := s.Geometry()
	rng := rand.New(rand.NewPCG(21, 2))
	a := chainOf(9200, 2)
	b := append(append([]uint64(nil), a...), chainOf(9300, 2)...) // a second run under the first
	pb := pageTable(rng, g, numPages, len(b))
	fill(kv, g, b, pb)
	saveWait(t, s, a, pb[:len(a)*g.ChunkPages])
	saveWait(t, s, b, pb)
	gpu.FailEntry = func(layer, extent int) bool { return layer == 1 && extent == 1 }
	scramble(kv, g, numPages)
	l, err := s.Load(b, pb)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Wait(); err != nil {
		t.Fatal(err)
	}
	if l.Blocks() != len(a) || s.Stats().Loads.MissBlocks[MissIOError] != int64(len(b)-len(a)) {
		t.Fatalf("restored %d blocks (want the first run's %d), misses %v", l.Blocks(), len(a), s.Stats().Loads.MissBlocks)
	}
	if err := verify(kv, g, b, pb, len(a)); err != nil {
		t.Fatal(err)
	}
}

// TestGPULoadsBeyondRestoreSlots: the GPU takes kernels.Config.MaxRequests
// (4) restores live at once; more loads of one store in flight (vLLM's
// step of 5 restored requests, every group's store a load per request)
// wait for a restore to be released, each then restored whole: none fails
// (the first hybrid run in vLLM saw the fifth load's Wait return the
// kernels' ErrBusy).
func TestGPULoadsBeyondRestoreSlots(t *testing.T) {
	const numPages, loads, blocks = 64, 6, 2
	gate := make(chan struct{})
	s, kv, gpu := gpuStoreOnCPU(t, numPages, gate)
	defer closeKV(t, s, kv)
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	defer release() // before closeKV: a failed test must not leave the restores held
	g := s.Geometry()
	chains, tables := disjointLoads(rand.New(rand.NewPCG(21, 3)), g, numPages, loads, blocks, 9400)
	for i := range chains {
		fill(kv, g, chains[i], tables[i])
		if sv := saveWait(t, s, chains[i], tables[i]); sv.Saved() != blocks {
			t.Fatalf("chain %d: saved %d of %d", i, sv.Saved(), blocks)
		}
	}
	scramble(kv, g, numPages)
	ls := make([]*Load, loads)
	for i := range ls { // every restore held at its first layer: all live at once
		l, err := s.Load(chains[i], tables[i])
		if err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
		ls[i] = l
	}
	release()
	for i, l := range ls {
		if err := l.Wait(); err != nil || l.Blocks() != blocks {
			t.Fatalf("load %d of %d in flight: %d of %d blocks, %v (%v)", i, loads, l.Blocks(), blocks, err, l.Failure())
		}
		if err := verify(kv, g, chains[i], tables[i], blocks); err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
	}
	if w := s.Stats().Loads.GPUSlotWaits; gpu.Calls() != loads || gpu.MaxLive() != 4 || w != loads-4 {
		t.Errorf("%d GPU restores, at most %d live at once, %d waited for a slot: want %d, 4, %d", gpu.Calls(), gpu.MaxLive(),
			w, loads, loads-4)
	}
}
