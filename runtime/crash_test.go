package runtime

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/internal/crashtest"
	"github.com/tutti-io/tutti/objmap"
)

// The crash test: a child process (this test binary, re-executed) saves
// chains in a loop and reports each save that returned success on a pipe;
// the parent kills it with SIGKILL at a seeded random moment, reopens the
// store, runs fsck (objmap's Check: every header and payload CRC), and checks
// that every reported save restores bit-exact and that whatever any load
// serves of the chains the child tried is bit-exact (nothing half-written is
// served).

const (
	crashEnvDirs = "TUTTI_CRASH_DIRS"
	crashEnvGen  = "TUTTI_CRASH_GEN"
)

func crashConfig(dirs []string) Config {
	return Config{Dirs: dirs, CapacityBytes: 128 << 20, Geometry: tinyGeometry(), Layout: objmap.LayoutPerLayer,
		NumPages: 64, StagingBytes: 64 << 10, StagingSlotBytes: 8 << 10, QueueDepth: 16}
}

// TestCrashChild is the child's body; it does nothing unless run by TestCrash.
func TestCrashChild(t *testing.T) {
	dirs := os.Getenv(crashEnvDirs)
	if dirs == "" {
		t.Skip("run by TestCrash only")
	}
	gen, _ := strconv.ParseUint(os.Getenv(crashEnvGen), 10, 64)
	rep := crashtest.NewReporter()
	say := rep.Say
	cfg := crashConfig(strings.Split(dirs, string(os.PathListSeparator)))
	s, err := Open(cfg)
	if err != nil {
		say("error open: %v", err)
		os.Exit(2)
	}
	kv, err := AllocHostKV(cfg.Geometry, cfg.Layout, cfg.NumPages)
	if err != nil {
		os.Exit(2)
	}
	if err := s.RegisterKV(kv.Memory()); err != nil {
		os.Exit(2)
	}
	rep.Ready()
	rng := rand.New(rand.NewPCG(gen, 99))
	var mine [][]uint64
	for i := uint64(0); ; i++ {
		var chain []uint64
		if len(mine) > 0 && rng.IntN(2) == 0 {
			base := mine[rng.IntN(len(mine))]
			chain = append(append([]uint64(nil), base...), chainOf(gen<<40|i<<16, 1+rng.IntN(3))...)
		} else {
			chain = chainOf(gen<<40|i<<16, 2+rng.IntN(4))
		}
		pages := pageTable(rng, cfg.Geometry, cfg.NumPages, len(chain))
		fill(kv, cfg.Geometry, chain, pages)
		rep.Try(chain)
		sv, err := s.Save(chain, pages)
		if err != nil {
			say("error save: %v", err)
			os.Exit(2)
		}
		sv.Wait()
		if sv.Saved()+sv.Skipped(SkipCached) == len(chain) {
			rep.OK(chain)
			mine = append(mine, chain)
		}
	}
}

func TestCrash(t *testing.T) {
	if os.Getenv(crashEnvDirs) != "" {
		t.Skip("in the child")
	}
	points := 100
	if testing.Short() {
		points = 10
	}
	const seed = 20261129
	rng := rand.New(rand.NewPCG(seed, 1))
	// A fresh store every pointsPerStore kills keeps fsck (which reads every
	// payload) from growing with the whole test.
	const pointsPerStore = 10
	var dirs []string
	var cfg Config
	var okAll [][]uint64
	triedN, okN := 0, 0
	defer func() {
		t.Logf("seed %d: %d kill points, %d saves tried, %d returned success", seed, points, triedN, okN)
	}()
	for p := 0; p < points; p++ {
		if p%pointsPerStore == 0 {
			dirs = []string{t.TempDir(), t.TempDir()}
			cfg = crashConfig(dirs)
			okAll = nil
		}
		delay := time.Duration(2+rng.IntN(120)) * time.Millisecond
		tried, ok := runCrashChild(t, dirs, uint64(p+1), delay)
		okAll = append(okAll, ok...)
		triedN += len(tried)
		okN += len(ok)

		t0 := time.Now()
		s, kv := openKV(t, cfg)
		t1 := time.Now()
		rep, err := s.Check()
		if os.Getenv("TUTTI_CRASH_TIMING") != "" {
			t.Logf("point %d: open %v check %v runs %d", p, t1.Sub(t0), time.Since(t1), rep.Recovered)
		}
		if err != nil || rep.Corrupt != 0 {
			t.Fatalf("seed %d point %d (kill after %v): fsck: %v; %v", seed, p, delay, err, rep)
		}
		check := append([][]uint64(nil), ok...)
		for i := 0; i < 10 && len(okAll) > 0; i++ {
			check = append(check, okAll[rng.IntN(len(okAll))])
		}
		for _, ch := range check {
			pages := pageTable(rng, cfg.Geometry, cfg.NumPages, len(ch))
			l, err := s.Load(ch, pages)
			if err != nil {
				t.Fatalf("seed %d point %d: Load: %v", seed, p, err)
			}
			l.Wait()
			if l.Blocks() != len(ch) {
				t.Fatalf("seed %d point %d (kill after %v): a save that returned success restores %d of %d blocks; recovery %+v",
					seed, p, delay, l.Blocks(), len(ch), s.Recovery())
			}
			if err := verify(kv, cfg.Geometry, ch, pages, len(ch)); err != nil {
				t.Fatalf("seed %d point %d: %v", seed, p, err)
			}
		}
		for _, ch := range tried {
			pages := pageTable(rng, cfg.Geometry, cfg.NumPages, len(ch))
			l, err := s.Load(ch, pages)
			if err != nil {
				t.Fatalf("seed %d point %d: Load: %v", seed, p, err)
			}
			l.Wait()
			if err := verify(kv, cfg.Geometry, ch, pages, l.Blocks()); err != nil {
				t.Fatalf("seed %d point %d (kill after %v): served half-written data: %v", seed, p, delay, err)
			}
		}
		closeKV(t, s, kv)
	}
}

// runCrashChild runs one child generation and kills it after delay (counted
// from its "ready"). It returns the chains the child tried and those it
// reported saved.
func runCrashChild(t *testing.T, dirs []string, gen uint64, delay time.Duration) (tried, ok [][]uint64) {
	t.Helper()
	return crashtest.RunChild(t, fmt.Sprintf("child generation %d", gen), "TestCrashChild",
		[]string{crashEnvDirs + "=" + strings.Join(dirs, string(os.PathListSeparator)), crashEnvGen + "=" + strconv.FormatUint(gen, 10)}, delay)
}
