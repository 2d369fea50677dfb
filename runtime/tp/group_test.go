package tp

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

// TestShardGeometry: heads split evenly, MLA replicated, bad degrees refused
// with the reason.
func TestShardGeometry(t *testing.T) {
	llama := kvshape.Geometry{Layers: 80, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 32}
	mla := kvshape.Geometry{Layers: 61, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16, Planes: 1, PageTokens: 16, ChunkPages: 32}
	for _, tc := range []struct {
		name  string
		g     kvshape.Geometry
		ranks int
		heads int    // KV heads per rank
		err   string // substring of the error, "" for none
	}{
		{"llama/1", llama, 1, 8, ""},
		{"llama/2", llama, 2, 4, ""},
		{"llama/8", llama, 8, 1, ""},
		{"llama/3", llama, 3, 0, "8 KV heads cannot be split evenly over 3 ranks"},
		{"llama/16", llama, 16, 0, "8 KV heads cannot be split evenly over 16 ranks"},
		{"llama/0", llama, 0, 0, "Ranks: must be in [1, 64], got 0"},
		{"llama/-1", llama, -1, 0, "Ranks"},
		{"llama/65", llama, 65, 0, "Ranks"},
		{"mla/4", mla, 4, 1, ""},
		{"mla/3", mla, 3, 1, ""},
		{"bad geometry", kvshape.Geometry{Layers: 1}, 2, 0, "Store.Geometry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ShardGeometry(tc.g, tc.ranks)
			if tc.err != "" {
				if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want ErrConfig containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.KVHeads != tc.heads {
				t.Fatalf("KV heads per rank %d, want %d", s.KVHeads, tc.heads)
			}
			want := tc.g
			want.KVHeads = tc.heads
			if s != want {
				t.Fatalf("shard %v, want %v", s, want)
			}
			if !Replicated(tc.g) && s.ChunkBytes()*int64(tc.ranks) != tc.g.ChunkBytes() {
				t.Fatalf("shards of %d bytes x %d ranks != %d", s.ChunkBytes(), tc.ranks, tc.g.ChunkBytes())
			}
		})
	}
}

// TestConfigErrors: every bad config is refused by Open with the field (and
// rank) named, before anything is created.
func TestConfigErrors(t *testing.T) {
	base := func() Config { return groupConfig(t, 2, gqaGeometry(), kvshape.LayoutPerLayer, 32) }
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		err  string
	}{
		{"zero ranks", func(c *Config) { c.Ranks = 0; c.Dirs = nil }, "Ranks: must be in [1, 64], got 0"},
		{"heads not divisible", func(c *Config) { c.Ranks = 3; c.Dirs = append(c.Dirs, []string{t.TempDir()}) },
			"4 KV heads cannot be split evenly over 3 ranks"},
		{"dirs count", func(c *Config) { c.Dirs = c.Dirs[:1] }, "Dirs: 2 ranks need 2 directory lists, got 1"},
		{"no dir", func(c *Config) { c.Dirs[1] = nil }, "Dirs[1]: rank 1 has no directory"},
		{"shared dir", func(c *Config) { c.Dirs[1] = []string{c.Dirs[0][1]} }, "is rank 0's too"},
		{"devices count", func(c *Config) { c.Devices = []int{0} }, "Devices: 2 ranks need 2 devices"},
		{"negative device", func(c *Config) { c.Devices = []int{0, -1} }, "Devices[1]"},
		{"rank store", func(c *Config) { c.Store.NumPages = 0 }, "rank 0: runtime: invalid config: NumPages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.mod(&cfg)
			g, err := Open(cfg)
			if err == nil {
				g.Close()
				t.Fatalf("Open accepted it")
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want ErrConfig containing %q", err, tc.err)
			}
		})
	}
}

// TestRoundTrip: for 1, 2 and 4 ranks, both layouts, split heads and a
// replicated latent: every rank restores exactly its shard of what was
// saved (bit for bit, into other pages), before and after a reopen; a chain
// extended by a second save and a chain diverging inside a run are hits
// for the right lengths.
func TestRoundTrip(t *testing.T) {
	for _, geo := range []struct {
		name string
		g    kvshape.Geometry
	}{{"gqa", gqaGeometry()}, {"mla", mlaGeometry()}} {
		for _, n := range []int{1, 2, 4} {
			for _, layout := range []kvshape.Layout{kvshape.LayoutPerLayer, kvshape.LayoutCrossLayer} {
				t.Run(fmt.Sprintf("%s/ranks=%d/%v", geo.name, n, layout), func(t *testing.T) {
					g := geo.g
					const seed = 1
					rng := rand.New(rand.NewPCG(seed, uint64(n)))
					numPages := 24 * g.ChunkPages
					cfg := groupConfig(t, n, g, layout, numPages)
					tg := openGroup(t, cfg)
					if sg := tg.ShardGeometry(); !Replicated(g) && sg.KVHeads != g.KVHeads/n {
						t.Fatalf("shard has %d heads", sg.KVHeads)
					}

					a := chainOf(1000, 4)
					pa := pageTable(rng, g, numPages, len(a))
					tg.fill(a, pa)
					sv := saveWait(t, tg, a, pa)
					if sv.Saved() != 4 || sv.Resident() != 4 || sv.Failed() != nil || sv.Discarded() != 0 {
						t.Fatalf("save: saved %d resident %d failed %v discarded %d", sv.Saved(), sv.Resident(), sv.Failed(), sv.Discarded())
					}
					for r := 0; r < n; r++ {
						if got := sv.Rank(r).Saved(); got != 4 {
							t.Fatalf("rank %d saved %d of 4", r, got)
						}
					}
					if got := tg.Lookup(a); got != 4 {
						t.Fatalf("Lookup = %d, want 4", got)
					}
					tg.scramble()
					pa2 := pageTable(rng, g, numPages, len(a))
					l := loadWait(t, tg, a, pa2)
					if l.Blocks() != 4 || l.Cached() != 4 || l.Planned() != 4 {
						t.Fatalf("load: blocks %d cached %d planned %d", l.Blocks(), l.Cached(), l.Planned())
					}
					if err := tg.verify(a, pa2, 4); err != nil {
						t.Fatal(err)
					}
					// Extend: 4 cached on every rank, 3 more.
					b := append(append([]uint64(nil), a...), chainOf(2000, 3)...)
					pb := pageTable(rng, g, numPages, len(b))
					tg.fill(b, pb)
					if sv := saveWait(t, tg, b, pb); sv.Saved() != 3 || sv.Resident() != 7 {
						t.Fatalf("extension: saved %d resident %d, want 3 and 7", sv.Saved(), sv.Resident())
					}
					st := tg.Stats()
					if st.Saves != 2 || st.CommittedBlocks != 7 || st.FailedSaves != 0 || st.DiscardedBlocks != 0 || st.IndexBlocks != 7 {
						t.Fatalf("stats %+v", st)
					}
					for r, rs := range st.Rank {
						if rs.Saves.SavedBlocks != 7 || rs.Saves.SavedBytes != 7*tg.ShardGeometry().ChunkBytes() {
							t.Fatalf("rank %d saved %d blocks / %d bytes", r, rs.Saves.SavedBlocks, rs.Saves.SavedBytes)
						}
					}
					tg.close(t)

					tg = openGroup(t, cfg)
					defer tg.close(t)
					rep := tg.Recovery()
					if rep.GroupBlocks != 7 || len(rep.Rank) != n {
						t.Fatalf("recovery: %+v", rep)
					}
					for r := 0; r < n; r++ {
						if rep.DiscardedBlocks[r] != 0 || rep.Rank[r].IndexedBlocks != 7 {
							t.Fatalf("recovery rank %d: discarded %d indexed %d", r, rep.DiscardedBlocks[r], rep.Rank[r].IndexedBlocks)
						}
					}
					tg.scramble()
					pb2 := pageTable(rng, g, numPages, len(b))
					if l := loadWait(t, tg, b, pb2); l.Blocks() != 7 {
						t.Fatalf("after reopen restored %d of 7", l.Blocks())
					}
					if err := tg.verify(b, pb2, 7); err != nil {
						t.Fatal(err)
					}
					// Diverge inside the first run.
					c := append(append([]uint64(nil), a[:2]...), chainOf(3000, 2)...)
					pc := pageTable(rng, g, numPages, len(c))
					tg.scramble()
					if l := loadWait(t, tg, c, pc); l.Blocks() != 2 || l.Cached() != 2 {
						t.Fatalf("diverging chain: blocks %d cached %d, want 2", l.Blocks(), l.Cached())
					}
					if err := tg.verify(c, pc, 2); err != nil {
						t.Fatal(err)
					}
					// A miss reads nothing on any rank.
					before := tg.Stats()
					if l := loadWait(t, tg, chainOf(9000, 2), pc); l.Blocks() != 0 || l.Rank(0) != nil {
						t.Fatalf("miss: blocks %d", l.Blocks())
					}
					for r, rs := range tg.Stats().Rank {
						if rs.Loads.ReadIOs != before.Rank[r].Loads.ReadIOs {
							t.Fatalf("rank %d read on a group miss", r)
						}
					}
				})
			}
		}
	}
}

// TestLookupClips: a block one rank lost after the group committed it
// (evicted or dropped as corrupt there; here discarded on that rank alone)
// is a miss for the group at once and is pruned from the group index; the
// next save of the chain stores it on that rank only and the group serves
// it again.
func TestLookupClips(t *testing.T) {
	g := gqaGeometry()
	rng := rand.New(rand.NewPCG(6, 6))
	cfg := groupConfig(t, 2, g, kvshape.LayoutPerLayer, 64)
	tg := openGroup(t, cfg)
	defer tg.close(t)
	ch := chainOf(500, 5)
	pages := pageTable(rng, g, cfg.Store.NumPages, len(ch))
	tg.fill(ch, pages)
	saveWait(t, tg, ch, pages)
	if _, err := tg.Rank(1).Discard(ch[2]); err != nil {
		t.Fatal(err)
	}
	if got := tg.Lookup(ch); got != 2 {
		t.Fatalf("Lookup = %d after rank 1 lost block 2, want 2", got)
	}
	st := tg.Stats()
	if st.ClippedBlocks != 3 || st.IndexBlocks != 2 {
		t.Fatalf("clipped %d index %d, want 3 and 2", st.ClippedBlocks, st.IndexBlocks)
	}
	sv := saveWait(t, tg, ch, pages)
	if sv.Rank(0).Saved() != 0 || sv.Rank(1).Saved() != 3 || sv.Saved() != 3 || sv.Failed() != nil {
		t.Fatalf("re-save: rank 0 %d rank 1 %d group %d failed %v", sv.Rank(0).Saved(), sv.Rank(1).Saved(), sv.Saved(), sv.Failed())
	}
	tg.scramble()
	if l := loadWait(t, tg, ch, pages); l.Blocks() != 5 {
		t.Fatalf("restored %d of 5", l.Blocks())
	}
	if err := tg.verify(ch, pages, 5); err != nil {
		t.Fatal(err)
	}
}

// TestClosed: calls after Close say so.
func TestClosed(t *testing.T) {
	cfg := groupConfig(t, 2, gqaGeometry(), kvshape.LayoutPerLayer, 16)
	tg := openGroup(t, cfg)
	tg.close(t)
	if _, err := tg.Load(chainOf(1, 1), []int32{0, 1}); !errors.Is(err, runtime.ErrClosed) {
		t.Fatalf("Load after Close: %v", err)
	}
	if _, err := tg.Save(chainOf(1, 1), []int32{0, 1}); !errors.Is(err, runtime.ErrClosed) {
		t.Fatalf("Save after Close: %v", err)
	}
	if err := tg.Close(); !errors.Is(err, runtime.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

// TestConcurrent: workers save and load overlapping chains on a group of 2
// ranks small enough to evict all the time, with WaitSaves racing them.
// Whatever a group load reports restored is bit-exact on every rank; the
// group never serves a block some rank lacks; nothing races (-race).
func TestConcurrent(t *testing.T) {
	g := gqaGeometry()
	const workers, ops, pagesPer = 3, 25, 24
	cfg := groupConfig(t, 2, g, kvshape.LayoutCrossLayer, workers*pagesPer)
	cfg.Store.CapacityBytes = 256 << 10
	tg := openGroup(t, cfg)
	defer tg.close(t)
	errs := make(chan error, workers+1)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			seed := uint64(200 + w)
			rng := rand.New(rand.NewPCG(seed, 2))
			pick := func(n int) []int32 {
				perm := rng.Perm(pagesPer)
				p := make([]int32, n*g.ChunkPages)
				for i := range p {
					p[i] = int32(w*pagesPer + perm[i])
				}
				return p
			}
			for op := 0; op < ops; op++ {
				// Chains share roots across workers: saves race on the
				// same blocks on both ranks.
				root := uint64(rng.IntN(4)+1) << 32
				k := 1 + rng.IntN(3)
				ch := append(chainOf(root, k), chainOf(root|uint64(k)<<24|uint64(rng.IntN(3)+1)<<16, rng.IntN(4))...)
				pages := pick(len(ch))
				if rng.IntN(2) == 0 {
					tg.fill(ch, pages)
					sv, err := tg.Save(ch, pages)
					if err != nil {
						errs <- fmt.Errorf("worker %d seed %d: Save: %v", w, seed, err)
						return
					}
					<-sv.Gathered()
					continue
				}
				l, err := tg.Load(ch, pages)
				if err != nil {
					errs <- fmt.Errorf("worker %d seed %d: Load: %v", w, seed, err)
					return
				}
				if err := l.Wait(); err != nil {
					errs <- fmt.Errorf("worker %d seed %d: Wait: %v", w, seed, err)
					return
				}
				if err := tg.verify(ch, pages, l.Blocks()); err != nil {
					errs <- fmt.Errorf("worker %d seed %d op %d: served wrong data: %v", w, seed, op, err)
					return
				}
			}
		}(w)
	}
	go func() {
		defer close(done)
		for i := 0; i < 5; i++ {
			if err := tg.WaitSaves(); err != nil {
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	<-done
	if err := tg.WaitSaves(); err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := tg.Stats()
	t.Logf("stats: saves %d committed %d failed %d discarded %d loads %d hits %d restored %d clipped %d; rank skips %v",
		st.Saves, st.CommittedBlocks, st.FailedSaves, st.DiscardedBlocks, st.Loads, st.LoadHitBlocks, st.RestoredBlocks, st.ClippedBlocks, st.Rank[0].Saves.SkippedBlocks)
	if st.Saves == 0 || st.Loads == 0 || st.IndexBlocks == 0 {
		t.Fatalf("stats: %+v", st)
	}
	// Quiescent (every save ended and was reconciled): for every chain the
	// workers can form, every rank has at least what the group serves, and
	// what it serves restores bit-exact.
	rng := rand.New(rand.NewPCG(299, 2))
	hits := 0
	for root := uint64(1); root <= 4; root++ {
		for k := uint64(1); k <= 3; k++ {
			for b := uint64(1); b <= 3; b++ {
				ch := append(chainOf(root<<32, int(k)), chainOf(root<<32|k<<24|b<<16, 3)...)
				n := tg.Lookup(ch)
				for r := 0; r < 2; r++ {
					if got := tg.Rank(r).Resident(ch); got < n {
						t.Fatalf("group serves %d blocks, rank %d has %d", n, r, got)
					}
				}
				if n == 0 {
					continue
				}
				hits++
				pages := pageTable(rng, g, cfg.Store.NumPages, len(ch))
				tg.scramble()
				l := loadWait(t, tg, ch, pages)
				if l.Blocks() != n {
					t.Fatalf("quiescent load of %x restored %d of %d", ch, l.Blocks(), n)
				}
				if err := tg.verify(ch, pages, n); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if hits == 0 {
		t.Fatalf("no chain is cached after %d saves: %+v", st.Saves, st)
	}
}
