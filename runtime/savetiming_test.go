package runtime

import (
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

// TestSaveTiming checks a save's phases are ordered, that each device that
// wrote has a span within the writes phase, and that a save with nothing to
// write has no write phase.
func TestSaveTiming(t *testing.T) {
	g := tinyGeometry()
	numPages := 40 * g.ChunkPages
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, numPages)
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	rng := rand.New(rand.NewPCG(7, 0))
	chain := chainOf(500, 8)
	pages := pageTable(rng, g, numPages, len(chain))
	fill(kv, g, chain, pages)

	sv, err := s.Save(chain, pages)
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	if got := sv.Timing(); got.DoneNs != 0 || got.DeviceWritesNs != nil {
		select {
		case <-sv.Done():
		default:
			t.Fatalf("Timing before Done = %+v, want the zero value", got)
		}
	}
	sv.Wait()
	if sv.Saved() != len(chain) {
		t.Fatalf("saved %d of %d", sv.Saved(), len(chain))
	}
	tm := sv.Timing()
	if !(tm.AdmittedNs > 0 && tm.AdmittedNs <= tm.FirstWriteNs && tm.FirstWriteNs <= tm.WritesNs && tm.WritesNs <= tm.DoneNs) {
		t.Fatalf("phases out of order: %+v", tm)
	}
	if len(tm.DeviceWritesNs) != len(cfg.Dirs) {
		t.Fatalf("%d device spans for %d directories: %+v", len(tm.DeviceWritesNs), len(cfg.Dirs), tm)
	}
	wrote := 0
	for dev, ns := range tm.DeviceWritesNs {
		if ns == 0 {
			continue
		}
		wrote++
		if ns < 0 || ns > tm.WritesNs-tm.FirstWriteNs {
			t.Fatalf("device %d wrote for %d ns, outside the writes phase %d-%d ns", dev, ns, tm.FirstWriteNs, tm.WritesNs)
		}
	}
	if wrote == 0 {
		t.Fatalf("no device has a write span: %+v", tm)
	}

	again := saveWait(t, s, chain, pages) // every block cached: nothing written
	if tm := again.Timing(); tm.FirstWriteNs != 0 || tm.WritesNs != 0 || tm.DoneNs < tm.AdmittedNs || tm.AdmittedNs <= 0 {
		t.Fatalf("cached save's timing %+v: want admission and end only", tm)
	}
}
