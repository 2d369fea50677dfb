package runtime

import (
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu/gputest"
)

// TestIOCreditsEachDevice: a save whose runs lie on both directories, and
// then the load of it, report each device's writes and reads to that
// device's model, not every byte to the first run's device, on either path
// (PathGPU with the CPU restorer). On PathGPU the load is one restore the
// scheduler dispatched, with no read planned and cancelled.
func TestIOCreditsEachDevice(t *testing.T) {
	for _, path := range []Path{PathCPU, PathGPU} {
		t.Run(path.String(), func(t *testing.T) { testIOCreditsEachDevice(t, path) })
	}
}

func testIOCreditsEachDevice(t *testing.T, path Path) {
	g := tinyGeometry()
	blocks := 2*objmap.MaxRunChunks(g) + 3 // at least three runs: both devices
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, blocks*g.ChunkPages+8)
	cfg.CapacityBytes = 256 << 20
	cfg.SaveBoundMs, cfg.SaveBudgetBytes = 600000, 1<<30
	var bound chan *gputest.Restorer
	if path == PathGPU {
		bound = make(chan *gputest.Restorer, 1)
		cfg.Path, cfg.gpuBind = PathGPU, cpuGPU(nil, bound)
		cfg.GPU.MaxPages = blocks * g.ChunkPages
	}
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	seed := s.sched.Device(0).Profile()
	if s.sched.Device(1).Profile() != seed {
		t.Fatal("the two devices start from different profiles")
	}
	chain := chainOf(77, blocks)
	pages := pageTable(rand.New(rand.NewPCG(1, 2)), g, cfg.NumPages, blocks)
	fill(kv, g, chain, pages)
	sv, err := s.Save(chain, pages)
	if err != nil {
		t.Fatal(err)
	}
	sv.Wait()
	if sv.Saved() != blocks {
		t.Fatalf("saved %d of %d blocks: %+v", sv.Saved(), blocks, s.Stats())
	}
	devs := map[int]bool{}
	s.m.Runs(func(r objmap.RunInfo) bool {
		devs[s.cat.DeviceOf(r.File)] = true
		return true
	})
	if len(devs) != 2 {
		t.Fatalf("runs on devices %v: the test needs both", devs)
	}
	for d := 0; d < 2; d++ {
		// Small writes correct the IOPS, large ones the bandwidth: either way
		// the model moves off its seed once it is fed.
		if got := s.sched.Device(d).Profile(); got == seed {
			t.Errorf("device %d: model still the seed %+v: its writes were credited elsewhere", d, got)
		}
	}
	if path == PathGPU {
		scramble(kv, g, cfg.NumPages) // the restore must bring the bytes back
	}
	l, err := s.Load(chain, pages)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Wait(); err != nil || l.Blocks() != blocks {
		t.Fatalf("loaded %d of %d blocks: %v", l.Blocks(), blocks, err)
	}
	for d := 0; d < 2; d++ {
		got := s.sched.Device(d).Profile()
		if got.ReadBytesPerSec == seed.ReadBytesPerSec && got.ReadIOPS == seed.ReadIOPS && got.ReadLatencyNs == seed.ReadLatencyNs {
			t.Errorf("device %d: read model still the seed's %+v: its reads were credited elsewhere", d, got)
		}
	}
	if path != PathGPU {
		return
	}
	if err := verify(kv, g, chain, pages, blocks); err != nil {
		t.Errorf("GPU path restore: %v", err)
	}
	st := s.Stats().Sched
	if c := <-bound; c.Calls() != 1 || st.RestoresDispatched != 1 || st.Cancelled != 0 {
		t.Errorf("%d GPU restores, scheduler %+v: want one restore dispatched, nothing cancelled", c.Calls(), st)
	}
}
