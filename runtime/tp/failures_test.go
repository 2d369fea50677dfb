package tp

// A rank that fails or refuses: saves, loads and recovery across ranks.

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
	"github.com/tutti-io/tutti/uring"
	"github.com/tutti-io/tutti/uring/uringsim"
)

// simEngines gives every rank a seeded Sim; rank victim also gets inj.
// The Sims are returned through sims for their recipes.
func simEngines(seed uint64, victim int, sims []*uringsim.Sim, inj func() []uringsim.Injector) func(int) (uring.Engine, error) {
	return func(r int) (uring.Engine, error) {
		var in []uringsim.Injector
		if r == victim {
			in = inj()
		}
		s := uringsim.New(uringsim.Config{Seed: seed*100 + uint64(r), Injectors: in})
		sims[r] = s
		return s, nil
	}
}

// TestSaveFailsOnOneRank: one rank's writes fail (EIO always, EIO at
// random, ENOSPC after some bytes; seeded); the others succeed. Whatever the
// failing rank did not commit is a miss on the whole group, is discarded on
// the ranks that committed it, and is counted; what the group serves
// restores bit-exact on every rank, before and after a reopen with healthy
// engines.
func TestSaveFailsOnOneRank(t *testing.T) {
	g := gqaGeometry()
	for _, tc := range []struct {
		name   string
		inj    func(seed uint64) []uringsim.Injector
		cause  runtime.SkipCause
		always bool // every save fails
	}{
		{"eio-always", func(uint64) []uringsim.Injector {
			return []uringsim.Injector{&uringsim.EIO{P: 1, Ops: uringsim.WriteOps}}
		}, runtime.SkipIOError, true},
		{"eio-random", func(uint64) []uringsim.Injector {
			return []uringsim.Injector{&uringsim.EIO{P: 0.3, Ops: uringsim.WriteOps}}
		}, runtime.SkipIOError, false},
		{"eio-nth", func(seed uint64) []uringsim.Injector {
			return []uringsim.Injector{&uringsim.EIO{Nth: seed + 1, Ops: uringsim.WriteOps}}
		}, runtime.SkipIOError, false},
		{"enospc", func(seed uint64) []uringsim.Injector {
			return []uringsim.Injector{&uringsim.ENOSPC{AfterBytes: int64(seed) * 20000}}
		}, runtime.SkipENOSPC, false},
	} {
		for _, n := range []int{2, 4} {
			for seed := uint64(1); seed <= 3; seed++ {
				t.Run(fmt.Sprintf("%s/ranks=%d/seed=%d", tc.name, n, seed), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, 9))
					cfg := groupConfig(t, n, g, kvshape.LayoutPerLayer, 64)
					victim := int(seed) % n
					sims := make([]*uringsim.Sim, n)
					fcfg := cfg
					fcfg.NewEngine = simEngines(seed, victim, sims, func() []uringsim.Injector { return tc.inj(seed) })
					tg := openGroup(t, fcfg)
					recipe := func() string { return fmt.Sprintf("seed %d victim %d recipe %s", seed, victim, sims[victim].Recipe()) }
					type saved struct {
						chain []uint64
						n     int
					}
					var kept []saved
					failed, discarded := 0, 0
					const chains = 8
					for c := 0; c < chains; c++ {
						ch := chainOf(uint64(c+1)<<40, 4)
						pages := pageTable(rng, g, cfg.Store.NumPages, len(ch))
						tg.fill(ch, pages)
						sv := saveWait(t, tg, ch, pages)
						vs := sv.Rank(victim)
						victimFailed := vs.Skipped(tc.cause) > 0
						if (sv.Failed() != nil) != victimFailed {
							t.Fatalf("%s: chain %d: Failed() = %v, victim skipped %d for %v", recipe(), c, sv.Failed(), vs.Skipped(tc.cause), tc.cause)
						}
						if victimFailed && !strings.Contains(sv.Failed().Error(), fmt.Sprintf("rank %d", victim)) {
							t.Fatalf("%s: failure does not name the rank: %v", recipe(), sv.Failed())
						}
						if sv.Resident() != vs.Saved() || sv.Saved() != vs.Saved() {
							t.Fatalf("%s: chain %d: group resident %d saved %d, victim saved %d", recipe(), c, sv.Resident(), sv.Saved(), vs.Saved())
						}
						// All or nothing: the group and every rank agree.
						if got := tg.Lookup(ch); got != vs.Saved() {
							t.Fatalf("%s: chain %d: Lookup %d, victim committed %d", recipe(), c, got, vs.Saved())
						}
						for r := 0; r < n; r++ {
							if got := tg.Rank(r).Resident(ch); got != vs.Saved() {
								t.Fatalf("%s: chain %d: rank %d still has %d blocks, the group %d", recipe(), c, r, got, vs.Saved())
							}
						}
						if victimFailed {
							failed++
							discarded += (n - 1) * (len(ch) - vs.Saved())
						}
						kept = append(kept, saved{ch, vs.Saved()})
					}
					if tc.always && failed != chains {
						t.Fatalf("%s: %d of %d saves failed with EIO on every write", recipe(), failed, chains)
					}
					if failed == 0 {
						t.Fatalf("%s: no save failed; the fault did not bite", recipe())
					}
					st := tg.Stats()
					if st.FailedSaves != int64(failed) || st.FailedRankSaves[tc.cause] != int64(failed) || st.DiscardedBlocks != int64(discarded) {
						t.Fatalf("%s: stats failed %d (by cause %v) discarded %d, want %d and %d", recipe(), st.FailedSaves, st.FailedRankSaves, st.DiscardedBlocks, failed, discarded)
					}
					if vskip := st.Rank[victim].Saves.SkippedBlocks[tc.cause]; vskip == 0 {
						t.Fatalf("%s: the victim's own store counted no %v skip", recipe(), tc.cause)
					}
					tg.close(t)

					// Healthy engines: the same answers, and the data is right.
					tg = openGroup(t, cfg)
					defer tg.close(t)
					if rep := tg.Recovery(); rep.DiscardedBlocks[victim] != 0 {
						t.Fatalf("%s: recovery discarded %v", recipe(), rep.DiscardedBlocks)
					}
					for _, k := range kept {
						if got := tg.Lookup(k.chain); got != k.n {
							t.Fatalf("%s: after reopen Lookup %d, want %d (recovery %+v)", recipe(), got, k.n, tg.Recovery())
						}
						if k.n == 0 {
							continue
						}
						tg.scramble()
						pages := pageTable(rng, g, cfg.Store.NumPages, len(k.chain))
						if l := loadWait(t, tg, k.chain, pages); l.Blocks() != k.n {
							t.Fatalf("%s: restored %d of %d", recipe(), l.Blocks(), k.n)
						}
						if err := tg.verify(k.chain, pages, k.n); err != nil {
							t.Fatalf("%s: %v", recipe(), err)
						}
					}
				})
			}
		}
	}
}

// TestRecoveryIntersection: blocks committed on some ranks only when the
// group went down (a crash between the ranks' commits, simulated by saving
// on one rank's store alone) are not hits after a restart: the group index
// is the intersection of the ranks' chains, and the rest is discarded on the
// ranks that have it (and stays gone after another restart).
func TestRecoveryIntersection(t *testing.T) {
	g := gqaGeometry()
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(4, uint64(n)))
			cfg := groupConfig(t, n, g, kvshape.LayoutCrossLayer, 64)
			tg := openGroup(t, cfg)
			a := chainOf(100, 3)
			pa := pageTable(rng, g, cfg.Store.NumPages, len(a))
			tg.fill(a, pa)
			if sv := saveWait(t, tg, a, pa); sv.Saved() != 3 {
				t.Fatalf("saved %d of 3", sv.Saved())
			}
			shard := tg.ShardGeometry()
			tg.close(t)

			// Rank n-1 alone commits an extension of a and a new chain;
			// rank 0 alone commits another new chain.
			ac := append(append([]uint64(nil), a...), chainOf(200, 2)...)
			b := chainOf(300, 2)
			d := chainOf(400, 3)
			alone := func(r int, chains ...[]uint64) {
				s, err := runtime.Open(cfg.rankConfig(r, shard, 0))
				if err != nil {
					t.Fatal(err)
				}
				kv, err := runtime.AllocHostKV(shard, cfg.Store.Layout, cfg.Store.NumPages)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.RegisterKV(kv.Memory()); err != nil {
					t.Fatal(err)
				}
				for _, ch := range chains {
					sv, err := s.Save(ch, pageTable(rng, g, cfg.Store.NumPages, len(ch)))
					if err != nil {
						t.Fatal(err)
					}
					sv.Wait()
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				kv.Free()
			}
			alone(n-1, ac, b)
			alone(0, d)

			tg = openGroup(t, cfg)
			rep := tg.Recovery()
			want := make([]int, n)
			want[n-1], want[0] = 2+2, 3
			if rep.GroupBlocks != 3 || fmt.Sprint(rep.DiscardedBlocks) != fmt.Sprint(want) {
				t.Fatalf("recovery: group %d discarded %v, want 3 and %v", rep.GroupBlocks, rep.DiscardedBlocks, want)
			}
			for _, c := range []struct {
				chain []uint64
				want  int
			}{{a, 3}, {ac, 3}, {b, 0}, {d, 0}} {
				if got := tg.Lookup(c.chain); got != c.want {
					t.Fatalf("Lookup(%x) = %d, want %d", c.chain, got, c.want)
				}
				for r := 0; r < n; r++ {
					if got := tg.Rank(r).Resident(c.chain); got != c.want {
						t.Fatalf("rank %d keeps %d blocks of %x, want %d", r, got, c.chain, c.want)
					}
				}
			}
			pages := pageTable(rng, g, cfg.Store.NumPages, len(ac))
			tg.scramble()
			if l := loadWait(t, tg, ac, pages); l.Blocks() != 3 {
				t.Fatalf("restored %d of 3", l.Blocks())
			}
			if err := tg.verify(ac, pages, 3); err != nil {
				t.Fatal(err)
			}
			if st := tg.Stats(); st.DiscardedBlocks != 7 || st.IndexBlocks != 3 {
				t.Fatalf("stats: discarded %d index %d", st.DiscardedBlocks, st.IndexBlocks)
			}
			tg.close(t)

			// The discarded runs were whole runs: freed, not back again.
			tg = openGroup(t, cfg)
			defer tg.close(t)
			if rep := tg.Recovery(); rep.GroupBlocks != 3 || fmt.Sprint(rep.DiscardedBlocks) != fmt.Sprint(make([]int, n)) {
				t.Fatalf("second recovery: %+v", rep)
			}
		})
	}
}

// TestSaveRefusedByOneRank: a rank that refuses a save outright (here: no
// KV memory registered) fails the group save; Save returns the error naming
// the rank only after the other ranks' saves ended, and what they committed
// is discarded.
func TestSaveRefusedByOneRank(t *testing.T) {
	g := gqaGeometry()
	cfg := groupConfig(t, 2, g, kvshape.LayoutPerLayer, 32)
	grp, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer grp.Close()
	kv, err := runtime.AllocHostKV(grp.ShardGeometry(), cfg.Store.Layout, cfg.Store.NumPages)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Free()
	if err := grp.RegisterKV(0, kv.Memory()); err != nil {
		t.Fatal(err)
	}
	if err := grp.RegisterKV(2, kv.Memory()); err == nil || !strings.Contains(err.Error(), "rank 2 out of range") {
		t.Fatalf("RegisterKV(2): %v", err)
	}
	ch := chainOf(42, 3)
	_, err = grp.Save(ch, []int32{0, 1, 2, 3, 4, 5})
	if !errors.Is(err, runtime.ErrNoKV) || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("Save: %v, want rank 1's ErrNoKV", err)
	}
	if n := grp.Rank(0).Resident(ch); n != 0 {
		t.Fatalf("rank 0 kept %d blocks of a save rank 1 refused", n)
	}
	st := grp.Stats()
	if st.FailedSaves != 1 || st.DiscardedBlocks != 3 || st.Rank[0].Saves.SavedBlocks != 3 {
		t.Fatalf("stats: failed %d discarded %d rank 0 saved %d", st.FailedSaves, st.DiscardedBlocks, st.Rank[0].Saves.SavedBlocks)
	}
	if n := grp.Lookup(ch); n != 0 {
		t.Fatalf("Lookup = %d", n)
	}
}

// TestLoadFailsOnOneRank: one rank's reads fail (EIO on every read): a group
// load restores nothing on every rank's behalf (Blocks is the smallest
// rank's), what other ranks restored is not counted, the data of the
// healthy ranks is still right, and the blocks stay cached (an I/O error is
// a miss for that load only). Corruption found by a rank's CRC check, by
// contrast, takes the block out of that rank's index, and so out of the
// group's.
func TestLoadFailsOnOneRank(t *testing.T) {
	g := gqaGeometry()
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(12, uint64(n)))
			cfg := groupConfig(t, n, g, kvshape.LayoutPerLayer, 64)
			tg := openGroup(t, cfg)
			// Two runs: blocks 0-1, then 2-3.
			ch := chainOf(700, 4)
			pages := pageTable(rng, g, cfg.Store.NumPages, len(ch))
			tg.fill(ch, pages)
			if sv := saveWait(t, tg, ch[:2], pages[:2*g.ChunkPages]); sv.Saved() != 2 {
				t.Fatalf("saved %d", sv.Saved())
			}
			if sv := saveWait(t, tg, ch, pages); sv.Saved() != 2 {
				t.Fatalf("saved %d", sv.Saved())
			}
			tg.close(t)

			victim := n - 1
			sims := make([]*uringsim.Sim, n)
			fcfg := cfg
			fcfg.NewEngine = simEngines(12, victim, sims, func() []uringsim.Injector {
				return []uringsim.Injector{&uringsim.EIO{P: 1, Ops: uringsim.ReadOps}}
			})
			tg = openGroup(t, fcfg)
			tg.scramble()
			l := loadWait(t, tg, ch, pages)
			if l.Blocks() != 0 || l.Cached() != 4 || l.Rank(0).Blocks() != 4 || l.Rank(victim).Blocks() != 0 {
				t.Fatalf("recipe %s: group %d cached %d, rank 0 %d, victim %d", sims[victim].Recipe(), l.Blocks(), l.Cached(), l.Rank(0).Blocks(), l.Rank(victim).Blocks())
			}
			for r := 0; r < victim; r++ {
				if err := tg.verifyRank(r, ch, pages, 4); err != nil {
					t.Fatalf("a healthy rank's restore: %v", err)
				}
			}
			if got := tg.Lookup(ch); got != 4 {
				t.Fatalf("Lookup after read errors = %d, want 4 (an I/O error is not a removal)", got)
			}
			if st := tg.Stats(); st.RestoredBlocks != 0 || st.Rank[victim].Loads.MissBlocks[runtime.MissIOError] != 4 {
				t.Fatalf("stats: restored %d, victim io-error misses %d", st.RestoredBlocks, st.Rank[victim].Loads.MissBlocks[runtime.MissIOError])
			}
			tg.close(t)

			// Corrupt one payload byte of block 2 on the victim's disk: its
			// CRC check drops that run there, so the group serves less.
			shard := tg.ShardGeometry()
			want := make([]byte, shard.PageBytesPerPlane())
			whole := wholePage(g, kvdata.Key{Block: ch[2], Layer: 0, Plane: 0, Page: 0})
			if err := CopyShard(g, n, victim, whole, want, true); err != nil {
				t.Fatal(err)
			}
			if !corruptFirst(t, cfg.Dirs[victim], want) {
				t.Fatal("the victim's copy of block 2 was not found on its disk")
			}
			tg = openGroup(t, cfg)
			defer tg.close(t)
			tg.scramble()
			l = loadWait(t, tg, ch, pages)
			if l.Blocks() != 2 {
				t.Fatalf("restored %d after corrupting block 2 on rank %d, want 2", l.Blocks(), victim)
			}
			if err := tg.verify(ch, pages, 2); err != nil {
				t.Fatal(err)
			}
			if got := tg.Lookup(ch); got != 2 {
				t.Fatalf("Lookup after the CRC miss = %d, want 2", got)
			}
			if st := tg.Stats(); st.Rank[victim].Loads.MissBlocks[runtime.MissCRC] == 0 || st.ClippedBlocks != 2 {
				t.Fatalf("stats: victim crc misses %d, clipped %d", st.Rank[victim].Loads.MissBlocks[runtime.MissCRC], st.ClippedBlocks)
			}
		})
	}
}

// corruptFirst flips one byte of the first occurrence of want in the files
// of dirs (the store's pool files) and reports whether it found one.
func corruptFirst(t *testing.T, dirs []string, want []byte) bool {
	t.Helper()
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if !e.Type().IsRegular() {
				continue
			}
			p := filepath.Join(d, e.Name())
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			i := bytes.Index(b, want)
			if i < 0 {
				continue
			}
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte{b[i+3] ^ 0xFF}, int64(i+3)); err != nil {
				t.Fatal(err)
			}
			return true
		}
	}
	return false
}
