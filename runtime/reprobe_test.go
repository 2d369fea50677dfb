package runtime

import (
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/devprobe"
	"github.com/tutti-io/tutti/sched"
)

// reprobeCall is what a re-probe was asked to read.
type reprobeCall struct {
	fd            int
	off, n, opBps int64
}

// fakeReprobe measures rate (or fails with err) and records its calls.
type fakeReprobe struct {
	mu    sync.Mutex
	calls []reprobeCall
	rate  float64
	err   error
}

func (f *fakeReprobe) probe(fd int, off, n, op int64, _ time.Duration) (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, reprobeCall{fd, off, n, op})
	return f.rate, f.err
}

// waitStats polls s.Stats until ok or 5 s pass.
func waitStats(t *testing.T, s *Store, ok func(Stats) bool) Stats {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		st := s.Stats()
		if ok(st) || time.Now().After(deadline) {
			return st
		}
	}
}

// TestReprobeRecoversLowModel: a store whose Open probe measured its reads
// far too slow recomputes cached blocks, and would for good (no read ever
// corrects the model). A plan that recomputes cached blocks of a device
// whose model saw no reads for the interval re-probes it: the next plan
// loads, bit-exact. Not stale, no re-probe; a failed re-probe is counted,
// names the device and leaves the model as it was; a run too short to
// measure bandwidth on is counted as a skip.
func TestReprobeRecoversLowModel(t *testing.T) {
	// 256 KiB per layer and block: a run of 8 blocks is 8 MiB, 1 MiB ops.
	g := kvshape.Geometry{Layers: 4, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 4}
	for _, tc := range []struct {
		name   string
		blocks int
		every  time.Duration
		err    error
		loads  bool // the second plan loads
		done   int64
		failed int64
		skips  int64
	}{
		{name: "stale model", blocks: 8, every: time.Millisecond, loads: true, done: 1},
		{name: "fresh model", blocks: 8, every: time.Hour},
		{name: "re-probe fails", blocks: 8, every: time.Millisecond, err: errors.New("injected"), failed: 1},
		{name: "run too short", blocks: 1, every: time.Millisecond, skips: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakeReprobe{rate: 5e9, err: tc.err}
			cfg := testConfig(t, g, kvshape.LayoutPerLayer, 2*tc.blocks*g.ChunkPages)
			cfg.Dirs = cfg.Dirs[:1]
			cfg.StagingBytes, cfg.StagingSlotBytes = 16<<20, 4<<20
			cfg.probe = fixedProbe(1e9, 1e3) // reads at 1 kB/s: every load loses
			cfg.reprobe, cfg.reprobeEvery = fake.probe, tc.every
			cfg.Compute = sched.ComputeModel{PerTokenNs: 1e4} // 10 µs per token and layer
			s, kv := openKV(t, cfg)
			defer closeKV(t, s, kv)
			rng := rand.New(rand.NewPCG(8, 8))
			c := chainOf(7<<32, tc.blocks)
			pages := pageTable(rng, g, cfg.NumPages, tc.blocks)
			fill(kv, g, c, pages)
			if sv := saveWait(t, s, c, pages); sv.Saved() != tc.blocks {
				t.Fatalf("saved %d of %d", sv.Saved(), tc.blocks)
			}
			time.Sleep(2 * time.Millisecond)
			if l := loadWait(t, s, c, pages); l.Planned() != 0 {
				t.Fatalf("first load planned %d blocks at 1 kB/s", l.Planned())
			}
			st := waitStats(t, s, func(st Stats) bool {
				return st.Devices.Reprobes+st.Devices.ReprobeFailures+st.Devices.ReprobeSkips > 0 || tc.every == time.Hour
			})
			if st.Devices.Reprobes != tc.done || st.Devices.ReprobeFailures != tc.failed || st.Devices.ReprobeSkips != tc.skips {
				t.Fatalf("re-probes %d, failed %d, skipped %d; want %d, %d, %d", st.Devices.Reprobes, st.Devices.ReprobeFailures,
					st.Devices.ReprobeSkips, tc.done, tc.failed, tc.skips)
			}
			if tc.failed > 0 && !strings.Contains(st.Devices.ReprobeError, "device 0") {
				t.Fatalf("re-probe error %q does not name the device", st.Devices.ReprobeError)
			}
			fake.mu.Lock()
			calls := fake.calls
			fake.mu.Unlock()
			if want := int(tc.done + tc.failed); len(calls) != want {
				t.Fatalf("%d re-probe reads, want %d", len(calls), want)
			}
			for _, c := range calls {
				if c.opBps != devprobe.IOBytes || c.n%c.opBps != 0 || c.n < devprobe.MinOps*c.opBps || c.off%objmap.BlockBytes != 0 {
					t.Fatalf("re-probe read %+v: want whole 1 MiB ops, at least %d, block-aligned", c, devprobe.MinOps)
				}
			}
			scramble(kv, g, cfg.NumPages)
			l := loadWait(t, s, c, pages)
			if loaded := l.Planned() == tc.blocks; loaded != tc.loads {
				t.Fatalf("second load planned %d of %d blocks (read model %.3g B/s)", l.Planned(), tc.blocks, s.sched.Device(0).Profile().ReadBytesPerSec)
			}
			if tc.loads {
				if err := verify(kv, g, c, pages, tc.blocks); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
