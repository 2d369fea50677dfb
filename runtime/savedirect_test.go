package runtime

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/mover/cpu"
	"github.com/tutti-io/tutti/uring"
	"github.com/tutti-io/tutti/uring/uringsim"
)

// shiftedKV is host KV memory whose tensors start shiftBytes past a page
// boundary (a CPU allocator's alignment, not mmap's).
type shiftedKV struct {
	bufs  []*uring.Buffer
	mem   KVMemory
	views *cpu.Views
}

func allocShiftedKV(t *testing.T, g kvshape.Geometry, layout kvshape.Layout, numPages int, shiftBytes int64) *shiftedKV {
	t.Helper()
	per, err := g.TensorBytes(layout, numPages)
	if err != nil {
		t.Fatal(err)
	}
	k := &shiftedKV{}
	region := func() Region {
		b, err := uring.AllocBuffer(int(per + shiftBytes))
		if err != nil {
			t.Fatal(err)
		}
		k.bufs = append(k.bufs, b)
		return Region{Addr: b.Addr() + uintptr(shiftBytes), LenBytes: per}
	}
	if layout == kvshape.LayoutPerLayer {
		for range g.Layers {
			k.mem.Layers = append(k.mem.Layers, region())
		}
	} else {
		k.mem.Cross = region()
	}
	regions, err := kvRegions(g, layout, numPages, k.mem)
	if err != nil {
		t.Fatal(err)
	}
	k.views = cpu.NewViews(g, layout, numPages, moverRegions(regions))
	t.Cleanup(func() {
		for _, b := range k.bufs {
			_ = b.Free()
		}
	})
	return k
}

func (k *shiftedKV) Page(layer, plane int, page int32) []byte {
	return k.views.Plane(layer, plane, page)
}

// TestSaveDirectWrites: PathCPU's save writes go from the engine's pages,
// and its load reads into them, when every page plane meets the pool file's
// O_DIRECT alignment, and are staged through a copy otherwise, counted with
// the reason; either way the blocks restore bit-exact and fsck finds every
// run whole.
func TestSaveDirectWrites(t *testing.T) {
	aligned := kvshape.Geometry{Layers: 4, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 4}
	mla := kvshape.Geometry{Layers: 2, KVHeads: 1, HeadDim: 72, DType: kvshape.FP16, Planes: 1, PageTokens: 16, ChunkPages: 1}
	for _, tc := range []struct {
		name       string
		g          kvshape.Geometry
		layout     kvshape.Layout
		shiftBytes int64
		slotBytes  int64 // staging slot: the write size
	}{
		{"aligned/per-layer", aligned, kvshape.LayoutPerLayer, 0, 0},
		{"aligned/cross-layer", aligned, kvshape.LayoutCrossLayer, 0, 0},
		{"aligned/cut planes", aligned, kvshape.LayoutPerLayer, 0, 12 << 10},
		{"shifted 64 bytes", aligned, kvshape.LayoutPerLayer, 64, 0},
		{"mla planes of 2304 bytes", mla, kvshape.LayoutPerLayer, 0, 0},
		{"tiny planes", tinyGeometry(), kvshape.LayoutPerLayer, 0, 0},
		{"tiny planes, a page's two merged", tinyGeometry(), kvshape.LayoutCrossLayer, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.g
			numPages := 40 * g.ChunkPages
			cfg := testConfig(t, g, tc.layout, numPages)
			if tc.slotBytes > 0 {
				cfg.StagingSlotBytes, cfg.StagingBytes = tc.slotBytes, 8*tc.slotBytes
			}
			s, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			kv := allocShiftedKV(t, g, tc.layout, numPages, tc.shiftBytes)
			if err := s.RegisterKV(kv.mem); err != nil {
				t.Fatal(err)
			}
			// An entry is a page plane, or on the cross-layer layout a page's
			// planes of one layer (adjacent in memory).
			align, entry := int64(s.m.Files()[0].DirectAlign), g.PageBytesPerPlane()
			if tc.layout == kvshape.LayoutCrossLayer {
				entry = g.PageBytesPerLayer()
			}
			direct := align == 0 || (tc.shiftBytes%align == 0 && entry%align == 0)

			rng := rand.New(rand.NewPCG(7, 0))
			chain := chainOf(3000, 6)
			pages := pageTable(rng, g, numPages, len(chain))
			fill(kv, g, chain, pages)
			if sv := saveWait(t, s, chain, pages); sv.Saved() != len(chain) {
				t.Fatalf("saved %d of %d (skipped %v)", sv.Saved(), len(chain), s.Stats().Saves.SkippedBlocks)
			}
			st := s.Stats()
			if st.Saves.DirectWrites+st.Saves.StagedWrites != st.Saves.WriteIOs || st.Saves.WriteIOs == 0 {
				t.Fatalf("%d direct + %d staged writes of %d", st.Saves.DirectWrites, st.Saves.StagedWrites, st.Saves.WriteIOs)
			}
			if direct {
				if st.Saves.StagedWrites != 0 || st.Saves.StagedCause != StageNone || st.Saves.StagedReason != "" || st.Saves.CopyNs != 0 {
					t.Errorf("aligned pages (file alignment %d): %d writes staged (%q), copies %d ns", align, st.Saves.StagedWrites, st.Saves.StagedReason, st.Saves.CopyNs)
				}
			} else if st.Saves.DirectWrites != 0 || st.Saves.StagedCause != StageUnaligned || !strings.Contains(st.Saves.StagedReason, "O_DIRECT needs address and length in multiples of") {
				t.Errorf("misaligned pages (file alignment %d): %d writes direct, %v: %q", align, st.Saves.DirectWrites, st.Saves.StagedCause, st.Saves.StagedReason)
			}

			scramble(kv, g, numPages)
			other := pageTable(rng, g, numPages, len(chain))
			if l := loadWait(t, s, chain, other); l.Blocks() != len(chain) {
				t.Fatalf("restored %d of %d; stats %v", l.Blocks(), len(chain), s.Stats())
			}
			if err := verify(kv, g, chain, other, len(chain)); err != nil {
				t.Fatal(err)
			}
			st = s.Stats()
			if st.Loads.DirectReads+st.Loads.StagedReads == 0 || st.Loads.DirectReads+st.Loads.StagedReads > st.Loads.ReadIOs {
				t.Fatalf("%d direct + %d staged reads of %d", st.Loads.DirectReads, st.Loads.StagedReads, st.Loads.ReadIOs)
			}
			if direct {
				if st.Loads.StagedReads != 0 || st.Loads.StagedCause != StageNone || st.Loads.StagedReason != "" {
					t.Errorf("aligned pages (file alignment %d): %d reads staged (%q)", align, st.Loads.StagedReads, st.Loads.StagedReason)
				}
			} else if st.Loads.DirectReads != 0 || st.Loads.StagedCause != StageUnaligned || !strings.Contains(st.Loads.StagedReason, "O_DIRECT needs address and length in multiples of") {
				t.Errorf("misaligned pages (file alignment %d): %d reads direct, %v: %q", align, st.Loads.DirectReads, st.Loads.StagedCause, st.Loads.StagedReason)
			}
			if rep, err := s.Check(); err != nil || rep.Corrupt != 0 || !rep.PayloadChecked {
				t.Fatalf("fsck: %v %+v", err, rep)
			}
		})
	}
}

// holdWrite blocks the Sim's goroutine (the store's I/O worker) before the
// first write attempt until release is closed.
type holdWrite struct {
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (h *holdWrite) Fault(_ *rand.Rand, c *uring.Completion, _ *uringsim.Sim) uringsim.Fault {
	if c.Op().IsWrite() && c.Op() != uring.OpFdatasync && c.Op() != uring.OpFsync {
		h.once.Do(func() {
			close(h.held)
			<-h.release
		})
	}
	return uringsim.Fault{}
}

func (h *holdWrite) String() string { return "hold-first-write" }

// TestSaveDirectGathered: a save written from the engine's pages reads them
// until its writes complete, so Gathered stays open while one is held in
// the device, and pages changed right after Gathered do not reach the disk.
func TestSaveDirectGathered(t *testing.T) {
	g := kvshape.Geometry{Layers: 4, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 4}
	numPages := 40 * g.ChunkPages
	h := &holdWrite{held: make(chan struct{}), release: make(chan struct{})}
	var sim *uringsim.Sim
	cfg := simConfig(testConfig(t, g, kvshape.LayoutPerLayer, numPages), 5, &sim, h)
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	rng := rand.New(rand.NewPCG(9, 0))
	chain := chainOf(4000, 6)
	pages := pageTable(rng, g, numPages, len(chain))
	fill(kv, g, chain, pages)
	sv, err := s.Save(chain, pages)
	if err != nil {
		t.Fatal(err)
	}
	<-h.held
	select {
	case <-sv.Gathered():
		t.Fatal("Gathered closed while a write from the engine's pages was held in the device")
	case <-time.After(100 * time.Millisecond):
	}
	close(h.release)
	<-sv.Gathered()
	scramble(kv, g, numPages) // the engine reuses the pages
	sv.Wait()
	if sv.Saved() != len(chain) {
		t.Fatalf("saved %d of %d (skipped %v)", sv.Saved(), len(chain), s.Stats().Saves.SkippedBlocks)
	}
	if st := s.Stats(); st.Saves.DirectWrites != st.Saves.WriteIOs {
		t.Fatalf("%d of %d writes direct (%q): the test needs writes from the pages", st.Saves.DirectWrites, st.Saves.WriteIOs, st.Saves.StagedReason)
	}
	other := pageTable(rng, g, numPages, len(chain))
	if l := loadWait(t, s, chain, other); l.Blocks() != len(chain) {
		t.Fatalf("restored %d of %d after reusing the pages at Gathered; stats %v", l.Blocks(), len(chain), s.Stats())
	}
	if err := verify(kv, g, chain, other, len(chain)); err != nil {
		t.Fatal(err)
	}
}
