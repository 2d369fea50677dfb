package runtime

import (
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/internal/crashtest"
	"github.com/tutti-io/tutti/kvshape"
)

// The crash test: a child process (this test binary, re-executed) saves
// chains in a loop and reports each save that returned success on a pipe;
// the parent kills it with SIGKILL at a seeded random moment, reopens the
// store, runs fsck (objmap's Check: every header and payload CRC), and checks
// that every reported save restores bit-exact and that whatever any load
// serves of the chains the child tried is bit-exact (nothing half-written is
// served). Package crashtest runs both sides.

var crashEnv = crashtest.Env{Parent: "TestCrash", Child: "TestCrashChild",
	DirsVar: "TUTTI_CRASH_DIRS", GenVar: "TUTTI_CRASH_GEN"}

func crashConfig(dirs []string) Config {
	return Config{Dirs: dirs, CapacityBytes: 128 << 20, Geometry: tinyGeometry(), Layout: kvshape.LayoutPerLayer,
		NumPages: 64, StagingBytes: 64 << 10, StagingSlotBytes: 8 << 10, QueueDepth: 16}
}

// TestCrashChild is the child's body; it does nothing unless run by TestCrash.
func TestCrashChild(t *testing.T) {
	dirs, gen := crashEnv.ChildArgs(t)
	rep := crashtest.NewReporter()
	cfg := crashConfig(strings.Split(dirs, string(os.PathListSeparator)))
	s, err := Open(cfg)
	if err != nil {
		rep.Fatalf("error open: %v", err)
	}
	kv, err := AllocHostKV(cfg.Geometry, cfg.Layout, cfg.NumPages)
	if err != nil {
		os.Exit(2)
	}
	if err := s.RegisterKV(kv.Memory()); err != nil {
		os.Exit(2)
	}
	rep.SaveLoop(gen, 99, func(rng *rand.Rand, chain []uint64) []int32 {
		pages := pageTable(rng, cfg.Geometry, cfg.NumPages, len(chain))
		fill(kv, cfg.Geometry, chain, pages)
		return pages
	}, func(chain []uint64, pages []int32) (bool, error) {
		sv, err := s.Save(chain, pages)
		if err != nil {
			return false, err
		}
		sv.Wait()
		return sv.Saved()+sv.Skipped(SkipCached) == len(chain), nil
	})
}

func TestCrash(t *testing.T) {
	var cfg Config
	crashtest.Plan{Env: crashEnv, Seed: 20261129, Stream: 1, Points: 100, ShortPoints: 10, PerStore: 10, MaxDelayMs: 120}.Run(t,
		func() string {
			cfg = crashConfig([]string{t.TempDir(), t.TempDir()})
			return strings.Join(cfg.Dirs, string(os.PathListSeparator))
		},
		func(pt *crashtest.Point) {
			t0 := time.Now()
			s, kv := openKV(t, cfg)
			t1 := time.Now()
			rep, err := s.Check()
			if os.Getenv("TUTTI_CRASH_TIMING") != "" {
				t.Logf("point %d: open %v check %v runs %d", pt.Index, t1.Sub(t0), time.Since(t1), rep.Recovered)
			}
			if err != nil || rep.Corrupt != 0 {
				pt.Fatalf(t, "fsck: %v; %v", err, rep)
			}
			restore := func(rng *rand.Rand, ch []uint64) (int, func(int) error, error) {
				pages := pageTable(rng, cfg.Geometry, cfg.NumPages, len(ch))
				l, err := s.Load(ch, pages)
				if err != nil {
					return 0, nil, err
				}
				l.Wait()
				return l.Blocks(), func(n int) error { return verify(kv, cfg.Geometry, ch, pages, n) }, nil
			}
			// This child's acknowledged saves and 10 drawn from all since
			// the store was fresh.
			check := append([][]uint64(nil), pt.OK...)
			for i := 0; i < 10 && len(pt.OKAll) > 0; i++ {
				check = append(check, pt.OKAll[pt.Rand.IntN(len(pt.OKAll))])
			}
			pt.CheckSaved(t, check, restore, s.Recovery())
			pt.CheckTried(t, restore)
			closeKV(t, s, kv)
		})
}
