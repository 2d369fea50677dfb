package tp

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

const (
	tpCrashEnvDirs = "TUTTI_TP_CRASH_DIRS"
	tpCrashEnvGen  = "TUTTI_TP_CRASH_GEN"
)

func crashGroupConfig(dirs [][]string) Config {
	return Config{Ranks: len(dirs), Dirs: dirs, Store: runtime.Config{
		CapacityBytes: 64 << 20, Geometry: gqaGeometry(), Layout: objmap.LayoutPerLayer, NumPages: 64,
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
	env := os.Getenv(tpCrashEnvDirs)
	if env == "" {
		t.Skip("run by TestGroupCrash only")
	}
	gen, _ := strconv.ParseUint(os.Getenv(tpCrashEnvGen), 10, 64)
	rep := crashtest.NewReporter()
	say := rep.Say
	cfg := crashGroupConfig(decodeDirs(env))
	tg := openGroup(t, cfg)
	rep.Ready()
	rng := rand.New(rand.NewPCG(gen, 98))
	var mine [][]uint64
	for i := uint64(0); ; i++ {
		var chain []uint64
		if len(mine) > 0 && rng.IntN(2) == 0 {
			base := mine[rng.IntN(len(mine))]
			chain = append(append([]uint64(nil), base...), chainOf(gen<<40|i<<16, 1+rng.IntN(3))...)
		} else {
			chain = chainOf(gen<<40|i<<16, 2+rng.IntN(4))
		}
		pages := pageTable(rng, tg.full, cfg.Store.NumPages, len(chain))
		tg.fill(chain, pages)
		rep.Try(chain)
		sv, err := tg.Save(chain, pages)
		if err != nil {
			say("error save: %v", err)
			os.Exit(2)
		}
		sv.Wait()
		if sv.Failed() == nil && sv.Resident() == len(chain) {
			rep.OK(chain)
			mine = append(mine, chain)
		}
	}
}

func TestGroupCrash(t *testing.T) {
	if os.Getenv(tpCrashEnvDirs) != "" {
		t.Skip("in the child")
	}
	points := 16
	if testing.Short() {
		points = 4
	}
	const seed = 20261129
	rng := rand.New(rand.NewPCG(seed, 2))
	const pointsPerGroup = 8
	var dirs [][]string
	var okAll [][]uint64
	triedN, okN, discarded := 0, 0, 0
	defer func() {
		t.Logf("seed %d: %d kill points, %d saves tried, %d returned success, %d blocks found on some ranks only and discarded at reopen",
			seed, points, triedN, okN, discarded)
	}()
	for p := 0; p < points; p++ {
		if p%pointsPerGroup == 0 {
			dirs = [][]string{{t.TempDir()}, {t.TempDir()}}
			okAll = nil
		}
		delay := time.Duration(2+rng.IntN(100)) * time.Millisecond
		tried, ok := runGroupCrashChild(t, dirs, uint64(p+1), delay)
		okAll = append(okAll, ok...)
		triedN += len(tried)
		okN += len(ok)

		cfg := crashGroupConfig(dirs)
		tg := openGroup(t, cfg)
		rep := tg.Recovery()
		for _, d := range rep.DiscardedBlocks {
			discarded += d
		}
		for r := 0; r < tg.Ranks(); r++ {
			if crep, err := tg.Rank(r).Check(); err != nil || crep.Corrupt != 0 {
				t.Fatalf("seed %d point %d (kill after %v): rank %d fsck: %v; %v", seed, p, delay, r, err, crep)
			}
		}
		// All or nothing after the restart: every rank holds exactly what
		// the group serves, for every chain the child touched.
		for _, ch := range append(tried, okAll...) {
			n := tg.Lookup(ch)
			for r := 0; r < tg.Ranks(); r++ {
				if got := tg.Rank(r).Resident(ch); got != n {
					t.Fatalf("seed %d point %d (kill after %v): rank %d has %d blocks of %x, the group serves %d; recovery %+v",
						seed, p, delay, r, got, ch, n, rep)
				}
			}
		}
		for _, ch := range okAll {
			pages := pageTable(rng, tg.full, cfg.Store.NumPages, len(ch))
			tg.scramble()
			if l := loadWait(t, tg, ch, pages); l.Blocks() != len(ch) {
				t.Fatalf("seed %d point %d (kill after %v): a save that returned success restores %d of %d blocks; recovery %+v",
					seed, p, delay, l.Blocks(), len(ch), rep)
			}
			if err := tg.verify(ch, pages, len(ch)); err != nil {
				t.Fatalf("seed %d point %d: %v", seed, p, err)
			}
		}
		for _, ch := range tried {
			pages := pageTable(rng, tg.full, cfg.Store.NumPages, len(ch))
			tg.scramble()
			l := loadWait(t, tg, ch, pages)
			if err := tg.verify(ch, pages, l.Blocks()); err != nil {
				t.Fatalf("seed %d point %d (kill after %v): served half-written data: %v", seed, p, delay, err)
			}
		}
		tg.close(t)
	}
}

// runGroupCrashChild runs one child generation and kills it after delay
// (counted from its "ready"). It returns the chains the child tried and
// those it reported saved.
func runGroupCrashChild(t *testing.T, dirs [][]string, gen uint64, delay time.Duration) (tried, ok [][]uint64) {
	t.Helper()
	return crashtest.RunChild(t, fmt.Sprintf("child generation %d", gen), "TestGroupCrashChild",
		[]string{tpCrashEnvDirs + "=" + encodeDirs(dirs), tpCrashEnvGen + "=" + strconv.FormatUint(gen, 10)}, delay)
}
