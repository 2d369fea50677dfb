package runtime

import (
	"math/rand/v2"
	"os"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring"
	"github.com/tutti-io/tutti/uring/uringsim"
)

// simConfig makes cfg run its I/O through a seeded Sim with injectors; the
// Sim is returned through *sim for its recipe.
func simConfig(cfg Config, seed uint64, sim **uringsim.Sim, inj ...uringsim.Injector) Config {
	cfg.NewEngine = func() (uring.Engine, error) {
		*sim = uringsim.New(uringsim.Config{Seed: seed, Injectors: inj})
		return *sim, nil
	}
	return cfg
}

// saveChains stores nChains chains of 2 runs each with a real engine and
// returns them with their pages.
func saveChains(t *testing.T, cfg Config, rng *rand.Rand, nChains int) [][]uint64 {
	t.Helper()
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	g := cfg.Geometry
	var chains [][]uint64
	for c := 0; c < nChains; c++ {
		head := chainOf(uint64(c+1)<<32, 3)
		full := append(append([]uint64(nil), head...), chainOf(uint64(c+1)<<32|1<<16, 3)...)
		for _, ch := range [][]uint64{head, full} {
			pages := pageTable(rng, g, cfg.NumPages, len(ch))
			fill(kv, g, ch, pages)
			if sv := saveWait(t, s, ch, pages); sv.Saved() != 3 {
				t.Fatalf("chain %d: saved %d of 3", c, sv.Saved())
			}
		}
		chains = append(chains, full)
	}
	return chains
}

// TestLoadFaults: EIO and short reads during loads. A failed read makes its
// run and every later run a miss (counted); what is reported restored is
// bit-exact; nothing panics.
func TestLoadFaults(t *testing.T) {
	// Whole reads (one slot each) and split ones (reads of four 12 KiB
	// slots, chunks straddling them, consumed in any order).
	for _, sh := range []struct {
		name        string
		g           kvshape.Geometry
		slot, total int64
	}{
		{"whole reads", tinyGeometry(), 0, 0},
		{"split reads", kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 2}, 12 << 10, 96 << 10},
	} {
		t.Run(sh.name, func(t *testing.T) { loadFaults(t, sh.g, sh.slot, sh.total) })
	}
}

func loadFaults(t *testing.T, g kvshape.Geometry, slotBytes, stagingBytes int64) {
	cases := []struct {
		name string
		inj  func() []uringsim.Injector
		miss bool // some misses expected
	}{
		{"eio", func() []uringsim.Injector { return []uringsim.Injector{&uringsim.EIO{P: 0.2, Ops: uringsim.ReadOps}} }, true},
		{"short-read", func() []uringsim.Injector { return []uringsim.Injector{&uringsim.ShortRead{P: 0.5}} }, false},
		{"eio+short", func() []uringsim.Injector {
			return []uringsim.Injector{&uringsim.EIO{P: 0.1, Ops: uringsim.ReadOps}, &uringsim.ShortRead{P: 0.3}}
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			injected := uint64(0)
			for seed := uint64(1); seed <= 4; seed++ {
				rng := rand.New(rand.NewPCG(seed, 7))
				cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
				if slotBytes > 0 {
					cfg.StagingBytes, cfg.StagingSlotBytes = stagingBytes, slotBytes
				}
				chains := saveChains(t, cfg, rng, 3)
				var sim *uringsim.Sim
				// Faults start after Open (its recovery reads go through the
				// Sim too) and are counted, so every injected EIO can be
				// traced to a miss the Store reports.
				inj := uringsim.Count(uringsim.AnyOf(tc.inj()...))
				sw := uringsim.Toggle(inj, false)
				s, kv := openKV(t, simConfig(cfg, seed, &sim, sw))
				sw.On()
				missed := int64(0)
				for _, ch := range chains {
					pages := pageTable(rng, g, cfg.NumPages, len(ch))
					scramble(kv, g, cfg.NumPages)
					l := loadWait(t, s, ch, pages)
					if l.Blocks() > len(ch) {
						t.Fatalf("seed %d recipe %s: restored %d blocks of %d", seed, sim.Recipe(), l.Blocks(), len(ch))
					}
					if err := verify(kv, g, ch, pages, l.Blocks()); err != nil {
						t.Fatalf("seed %d recipe %s: served wrong data: %v", seed, sim.Recipe(), err)
					}
					missed += int64(len(ch) - l.Blocks())
				}
				st := s.Stats()
				if slotBytes > 0 && st.Loads.SplitIOs == 0 {
					t.Fatalf("seed %d: no read was split", seed)
				}
				var counted int64
				for _, n := range st.Loads.MissBlocks {
					counted += n
				}
				if counted != missed {
					t.Fatalf("seed %d recipe %s: %d blocks missed, %d counted (%v)", seed, sim.Recipe(), missed, counted, st.Loads.MissBlocks)
				}
				if got, want := st.Loads.MissBlocks[MissIOError] > 0, inj.Errnos() > 0; got != want {
					t.Fatalf("seed %d recipe %s: %d EIOs injected, %d blocks counted missed for an I/O error",
						seed, sim.Recipe(), inj.Errnos(), st.Loads.MissBlocks[MissIOError])
				}
				injected += inj.Errnos()
				if !tc.miss && missed != 0 {
					t.Fatalf("seed %d recipe %s: short reads are continued, yet %d blocks missed", seed, sim.Recipe(), missed)
				}
				closeKV(t, s, kv)
			}
			if tc.miss && injected == 0 {
				t.Fatal("no EIO was injected in any seed")
			}
		})
	}
}

// TestLoadCorruptPayload flips one payload byte on disk: the CRC check makes
// that run a miss (counted), drops it from the index, and never serves it.
func TestLoadCorruptPayload(t *testing.T) {
	g := tinyGeometry()
	rng := rand.New(rand.NewPCG(3, 3))
	cfg := testConfig(t, g, kvshape.LayoutCrossLayer, 64)
	chains := saveChains(t, cfg, rng, 1)
	ch := chains[0]

	s, kv := openKV(t, cfg)
	// Find the second run (chain positions 3..5) and damage layer 1 of it.
	victim := runStartingAt(s, ch[3])
	if victim == nil {
		t.Fatal("second run not found")
	}
	path, off := objectAt(t, s, victim, 1)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{0}
	pos := off + 5
	if _, err := f.ReadAt(b, pos); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xFF
	if _, err := f.WriteAt(b, pos); err != nil {
		t.Fatal(err)
	}
	f.Close()

	pages := pageTable(rng, g, cfg.NumPages, len(ch))
	l := loadWait(t, s, ch, pages)
	if l.Blocks() != 3 {
		t.Fatalf("restored %d blocks, want 3 (the damaged run is a miss)", l.Blocks())
	}
	if err := verify(kv, g, ch, pages, 3); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Loads.MissBlocks[MissCRC] != 3 || st.Loads.CorruptDroppedRuns != 1 {
		t.Fatalf("stats: crc misses %d dropped %d, want 3 and 1", st.Loads.MissBlocks[MissCRC], st.Loads.CorruptDroppedRuns)
	}
	if n := s.Lookup(ch); n != 3 {
		t.Fatalf("Lookup after the CRC miss = %d, want 3 (the damaged run left the index)", n)
	}
	closeKV(t, s, kv)
}

// TestSaveFaults: ENOSPC and EIO during saves skip the save (counted), keep
// nothing half-written in the index, and leave the store usable.
func TestSaveFaults(t *testing.T) {
	g := tinyGeometry()
	for seed := uint64(1); seed <= 4; seed++ {
		for _, tc := range []struct {
			name  string
			inj   uringsim.Injector
			cause SkipCause
		}{
			{"enospc", &uringsim.ENOSPC{AfterBytes: int64(seed) * 10000}, SkipENOSPC},
			{"eio", &uringsim.EIO{P: 0.15, Ops: uringsim.WriteOps}, SkipIOError},
		} {
			rng := rand.New(rand.NewPCG(seed, 11))
			cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
			var sim *uringsim.Sim
			s, kv := openKV(t, simConfig(cfg, seed, &sim, tc.inj))
			var saved [][]uint64
			skipped := 0
			for c := 0; c < 6; c++ {
				ch := chainOf(uint64(c+1)<<40, 4)
				pages := pageTable(rng, g, cfg.NumPages, len(ch))
				fill(kv, g, ch, pages)
				sv := saveWait(t, s, ch, pages)
				skipped += sv.Skipped(tc.cause)
				if sv.Saved()+sv.Skipped(tc.cause) != len(ch) {
					t.Fatalf("%s seed %d recipe %s: saved %d + skipped %d != %d", tc.name, seed, sim.Recipe(), sv.Saved(), sv.Skipped(tc.cause), len(ch))
				}
				if n := s.Lookup(ch); n != sv.Saved() {
					t.Fatalf("%s seed %d recipe %s: Lookup %d after saving %d", tc.name, seed, sim.Recipe(), n, sv.Saved())
				}
				if sv.Saved() == len(ch) {
					saved = append(saved, ch)
				}
			}
			if skipped == 0 {
				t.Fatalf("%s seed %d recipe %s: no save was skipped; the fault did not bite", tc.name, seed, sim.Recipe())
			}
			if st := s.Stats(); st.Saves.SkippedBlocks[tc.cause] != int64(skipped) {
				t.Fatalf("%s seed %d: counted %d skipped, saw %d", tc.name, seed, st.Saves.SkippedBlocks[tc.cause], skipped)
			}
			closeKV(t, s, kv)
			// What was saved restores bit-exact with a healthy engine.
			s, kv = openKV(t, cfg)
			for _, ch := range saved {
				pages := pageTable(rng, g, cfg.NumPages, len(ch))
				if l := loadWait(t, s, ch, pages); l.Blocks() != len(ch) {
					t.Fatalf("%s seed %d recipe %s: restored %d of %d after reopen", tc.name, seed, sim.Recipe(), l.Blocks(), len(ch))
				} else if err := verify(kv, g, ch, pages, len(ch)); err != nil {
					t.Fatalf("%s seed %d recipe %s: %v", tc.name, seed, sim.Recipe(), err)
				}
			}
			closeKV(t, s, kv)
		}
	}
}
