package runtime

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

// TestRunsSpreadOverDevices: a store over four directories spreads every
// run's layers over all four devices, so a restore of one block (one run)
// reads the same bytes from each device and its save writes the same;
// Stats says so per directory.
func TestRunsSpreadOverDevices(t *testing.T) {
	g := kvshape.Geometry{Layers: 8, KVHeads: 2, HeadDim: 16, DType: kvshape.BF16, Planes: 2, PageTokens: 4, ChunkPages: 64} // 16 KiB per block and layer
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 4*g.ChunkPages)
	cfg.Dirs = []string{t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()}
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	if w := s.m.Layout().Width(); w != 4 {
		t.Fatalf("run width %d over 4 directories of 8 layers", w)
	}
	rng := rand.New(rand.NewPCG(8, 1))
	chain := chainOf(77, 1)
	pages := pageTable(rng, g, cfg.NumPages, 1)
	fill(kv, g, chain, pages)
	if sv := saveWait(t, s, chain, pages); sv.Saved() != 1 {
		t.Fatalf("saved %d", sv.Saved())
	}
	scramble(kv, g, cfg.NumPages)
	l := loadWait(t, s, chain, pages)
	if l.Blocks() != 1 {
		t.Fatalf("restored %d: %v", l.Blocks(), l.Failure())
	}
	if err := verify(kv, g, chain, pages, 1); err != nil {
		t.Fatal(err)
	}
	st := s.Stats().Devices
	perDev := 2 * g.ChunkBytesPerLayer() // 8 layers over 4 devices
	for i := range cfg.Dirs {
		if st.ReadBytes[i] != perDev || st.WriteBytes[i] != perDev {
			t.Fatalf("device %d (%s): read %d, wrote %d bytes, want %d each (read %v, wrote %v)", i, st.Dirs[i], st.ReadBytes[i], st.WriteBytes[i],
				perDev, st.ReadBytes, st.WriteBytes)
		}
	}
}

// TestOneDeviceRunsStillRead: a store whose runs each lie on one device
// (made with RunWidth 1, as every store before objmap's manifest version 3
// was) is read as such by a default Open, which keeps its width (and says
// what it costs in the recovery report); asking for another width is
// refused.
func TestOneDeviceRunsStillRead(t *testing.T) {
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, 64)
	cfg.RunWidth = 1
	rng := rand.New(rand.NewPCG(9, 9))
	chain := chainOf(900, 6)
	pages := pageTable(rng, g, cfg.NumPages, len(chain))
	s, kv := openKV(t, cfg)
	fill(kv, g, chain, pages)
	if sv := saveWait(t, s, chain, pages); sv.Saved() != len(chain) {
		t.Fatalf("saved %d", sv.Saved())
	}
	closeKV(t, s, kv)

	cfg.RunWidth = 2
	if _, err := Open(cfg); !errors.Is(err, ErrSettingsMismatch) {
		t.Fatalf("reopening a width-1 store asking for width 2: %v", err)
	}
	cfg.RunWidth = 0
	s, kv = openKV(t, cfg)
	defer closeKV(t, s, kv)
	if w := s.m.Layout().Width(); w != 1 {
		t.Fatalf("reopened with width %d", w)
	}
	if note := s.Recovery().Map.LayoutNote(); !strings.Contains(note, "one of the 2 devices") {
		t.Fatalf("layout note %q", note)
	}
	scramble(kv, g, cfg.NumPages)
	l := loadWait(t, s, chain, pages)
	if l.Blocks() != len(chain) {
		t.Fatalf("restored %d of %d: %v", l.Blocks(), len(chain), l.Failure())
	}
	if err := verify(kv, g, chain, pages, len(chain)); err != nil {
		t.Fatal(err)
	}
}
