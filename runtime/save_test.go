package runtime

import (
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/devprobe"
)

// TestSaveBudgetCut: a save larger than the scheduler's save budget is
// admitted in part: the run the budget cuts is reallocated for what was
// admitted, the rest is skipped (SkipBudget) and not served, and what was
// admitted restores bit-exact.
func TestSaveBudgetCut(t *testing.T) {
	g := tinyGeometry()
	rng := rand.New(rand.NewPCG(4, 4))
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	cfg.Dirs = cfg.Dirs[:1]                  // one device: one budget
	cfg.SaveBudgetBytes = 3 * g.ChunkBytes() // three blocks pending at most
	s, kv := openKV(t, cfg)
	c := chainOf(5<<32, 10)
	pages := pageTable(rng, g, cfg.NumPages, len(c))
	fill(kv, g, c, pages)
	sv := saveWait(t, s, c, pages)
	if sv.Saved() != 3 || sv.Skipped(SkipBudget) != 7 {
		t.Fatalf("saved %d, budget-skipped %d; want 3 and 7 (%v)", sv.Saved(), sv.Skipped(SkipBudget), s.Stats())
	}
	if n := s.Lookup(c); n != 3 {
		t.Fatalf("Lookup = %d, want 3", n)
	}
	p2 := pageTable(rng, g, cfg.NumPages, len(c))
	if l := loadWait(t, s, c, p2); l.Blocks() != 3 {
		t.Fatalf("restored %d, want 3", l.Blocks())
	} else if err := verify(kv, g, c, p2, 3); err != nil {
		t.Fatal(err)
	}
	// The rest can be saved once the budget drained.
	if sv := saveWait(t, s, c, pages); sv.Saved() != 3 || sv.Skipped(SkipCached) != 3 {
		t.Fatalf("second save saved %d (cached %d), want 3 (3)", sv.Saved(), sv.Skipped(SkipCached))
	}
	closeKV(t, s, kv)
}

// TestDefaultSaveBudget: a store that sets no save budget or device profile
// keeps every block of a save its device model writes within the save
// bound at the full write rate (nothing else runs on the device), and cuts a
// save larger than that to what fits, counted as SkipBound. Each save runs
// on a fresh store whose probe measures the seed profile's rates, so
// admission follows them, not what this machine's disk taught the model.
func TestDefaultSaveBudget(t *testing.T) {
	seedRates := fixedProbe(defaultDevice.WriteBytesPerSec, defaultDevice.ReadBytesPerSec)
	for _, tc := range []struct {
		name string
		frac float64
		all  bool
	}{
		{"0.8 of the bound", 0.8, true},
		{"2 bounds", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkFreshSave(t, tc.frac, tc.all, seedRates)
		})
	}
}

// saveBoundMs is the save bound of checkFreshSave's stores.
const saveBoundMs = 40

// checkFreshSave saves, on a fresh one-directory store with no save budget
// or device profile set and probe measuring its device, a chain whose
// writes take frac of the save bound at defaultDevice's write rate, and
// checks that all of it is saved (all) or that it is cut, counted as
// SkipBound. It returns the store's stats.
func checkFreshSave(t *testing.T, frac float64, all bool, probe devprobe.Prober) Stats {
	t.Helper()
	g := kvshape.Geometry{Layers: 4, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 16}
	n := int(frac * saveBoundMs / 1e3 * defaultDevice.WriteBytesPerSec / float64(g.ChunkBytes()))
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, n*g.ChunkPages)
	cfg.Dirs = cfg.Dirs[:1]
	cfg.CapacityBytes = 4 * int64(n) * g.ChunkBytes()
	cfg.StagingBytes, cfg.StagingSlotBytes = 16<<20, 4<<20
	cfg.SaveBoundMs = saveBoundMs // SaveBudgetBytes and Device left to their defaults
	cfg.probe = probe
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	c := chainOf(9<<32, n)
	pages := pageTable(rand.New(rand.NewPCG(9, 9)), g, cfg.NumPages, n)
	fill(kv, g, c, pages)
	sv := saveWait(t, s, c, pages)
	st := s.Stats()
	t.Logf("%d blocks of %d MiB: saved %d, skipped bound %d budget %d; %+v", n, g.ChunkBytes()>>20, sv.Saved(), sv.Skipped(SkipBound), sv.Skipped(SkipBudget), st.Devices.Probes)
	if all {
		if sv.Saved() != n {
			t.Fatalf("saved %d of %d blocks (%v): the device writes them within the bound", sv.Saved(), n, st)
		}
		return st
	}
	if sv.Saved() == 0 || sv.Saved() >= n || sv.Skipped(SkipBound) != n-sv.Saved() {
		t.Fatalf("saved %d of %d, %d skipped as %v: want a cut counted as bound (%v)", sv.Saved(), n, sv.Skipped(SkipBound), SkipBound, st)
	}
	if st.Saves.SkippedBlocks[SkipBound] != int64(n-sv.Saved()) {
		t.Fatalf("Stats.Saves.SkippedBlocks %v: want %d as %v", st.Saves.SkippedBlocks, n-sv.Saved(), SkipBound)
	}
	return st
}

// TestSaveReusesFreedSpace: a store sized for n blocks, full, saves n new
// blocks whole right after the old ones leave, whether the engine discarded
// them or the index evicted them for the new save: their space is
// quarantined until its free is durable, and the save makes it so instead
// of skipping what the pool could not take at once (SkipNoSpace).
func TestSaveReusesFreedSpace(t *testing.T) {
	g := kvshape.Geometry{Layers: 4, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 4}
	const n = 12
	for _, tc := range []struct {
		name    string
		discard bool
	}{{"after Discard", true}, {"after eviction", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, g, kvshape.LayoutPerLayer, 2*n*g.ChunkPages)
			cfg.CapacityBytes = CapacityForBlocks(g, n)
			s, kv := openKV(t, cfg)
			defer closeKV(t, s, kv)
			rng := rand.New(rand.NewPCG(6, 6))
			for round := range 4 {
				c := chainOf(uint64(round+1)<<32, n)
				pages := pageTable(rng, g, cfg.NumPages, n)
				fill(kv, g, c, pages)
				sv := saveWait(t, s, c, pages)
				if sv.Saved() != n {
					t.Fatalf("round %d: saved %d of %d (no space %d): %v; pool %+v", round, sv.Saved(), n, sv.Skipped(SkipNoSpace), s.Stats(), s.m.Stats())
				}
				p2 := pageTable(rng, g, cfg.NumPages, n)
				if l := loadWait(t, s, c, p2); l.Blocks() != n {
					t.Fatalf("round %d: restored %d of %d", round, l.Blocks(), n)
				} else if err := verify(kv, g, c, p2, n); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				if tc.discard {
					if _, err := s.Discard(c[0]); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}
