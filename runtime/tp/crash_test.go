package tp

import (
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/internal/crashtest"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

// The group crash test: a child process (this test binary, re-executed)
// saves chains on a 2-rank group in a loop and reports each save it tried
// and each that returned complete success; the parent kills it with SIGKILL
// at a seeded random moment (possibly between the ranks' commits of one
// save), reopens the group, and checks: every rank agrees with the group on
// every chain the child tried (what some ranks had alone was discarded at
// Open), every successful save is a full hit, and whatever any load serves
// is bit-exact on every rank.

var tpCrashEnv = crashtest.Env{Parent: "TestGroupCrash", Child: "TestGroupCrashChild",
	DirsVar: "TUTTI_TP_CRASH_DIRS", GenVar: "TUTTI_TP_CRASH_GEN"}

func crashGroupConfig(dirs [][]string) Config {
	return Config{Ranks: len(dirs), Dirs: dirs, Store: runtime.Config{
		CapacityBytes: 64 << 20, Geometry: gqaGeometry(), Layout: kvshape.LayoutPerLayer, NumPages: 64,
		StagingBytes: 64 << 10, StagingSlotBytes: 8 << 10, QueueDepth: 16,
	}}
}

func encodeDirs(dirs [][]string) string {
	var ranks []string
	for _, ds := range dirs {
		ranks = append(ranks, strings.Join(ds, string(os.PathListSeparator)))
	}
	return strings.Join(ranks, ";")
}

func decodeDirs(s string) [][]string {
	var dirs [][]string
	for _, r := range strings.Split(s, ";") {
		dirs = append(dirs, strings.Split(r, string(os.PathListSeparator)))
	}
	return dirs
}

// TestGroupCrashChild is the child's body; it does nothing unless run by
// TestGroupCrash.
func TestGroupCrashChild(t *testing.T) {
	env, gen := tpCrashEnv.ChildArgs(t)
	rep := crashtest.NewReporter()
	cfg := crashGroupConfig(decodeDirs(env))
	tg := openGroup(t, cfg)
	rep.SaveLoop(gen, 98, func(rng *rand.Rand, chain []uint64) []int32 {
		pages := pageTable(rng, tg.full, cfg.Store.NumPages, len(chain))
		tg.fill(chain, pages)
		return pages
	}, func(chain []uint64, pages []int32) (bool, error) {
		sv, err := tg.Save(chain, pages)
		if err != nil {
			return false, err
		}
		sv.Wait()
		return sv.Failed() == nil && sv.Resident() == len(chain), nil
	})
}

func TestGroupCrash(t *testing.T) {
	var cfg Config
	discarded := 0
	defer func() {
		t.Logf("%d blocks found on some ranks only and discarded at reopen", discarded)
	}()
	crashtest.Plan{Env: tpCrashEnv, Seed: 20261129, Stream: 2, Points: 16, ShortPoints: 4, PerStore: 8, MaxDelayMs: 100}.Run(t,
		func() string {
			cfg = crashGroupConfig([][]string{{t.TempDir()}, {t.TempDir()}})
			return encodeDirs(cfg.Dirs)
		},
		func(pt *crashtest.Point) {
			tg := openGroup(t, cfg)
			rep := tg.Recovery()
			for _, d := range rep.DiscardedBlocks {
				discarded += d
			}
			for r := 0; r < tg.Ranks(); r++ {
				if crep, err := tg.Rank(r).Check(); err != nil || crep.Corrupt != 0 {
					pt.Fatalf(t, "rank %d fsck: %v; %v", r, err, crep)
				}
			}
			// All or nothing after the restart: every rank holds exactly what
			// the group serves, for every chain the child touched.
			for _, ch := range append(pt.Tried, pt.OKAll...) {
				n := tg.Lookup(ch)
				for r := 0; r < tg.Ranks(); r++ {
					if got := tg.Rank(r).Resident(ch); got != n {
						pt.Fatalf(t, "rank %d has %d blocks of %x, the group serves %d; recovery %+v", r, got, ch, n, rep)
					}
				}
			}
			restore := func(rng *rand.Rand, ch []uint64) (int, func(int) error, error) {
				pages := pageTable(rng, tg.full, cfg.Store.NumPages, len(ch))
				tg.scramble()
				l := loadWait(t, tg, ch, pages)
				return l.Blocks(), func(n int) error { return tg.verify(ch, pages, n) }, nil
			}
			pt.CheckSaved(t, pt.OKAll, restore, rep)
			pt.CheckTried(t, restore)
			tg.close(t)
		})
}
