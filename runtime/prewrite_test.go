package runtime

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tutti-io/tutti/runtime/internal/prewrite"
)

// By default a fresh (fallocated) store prewrites its pool in the
// background while saves and loads come and go: the data round-trips, the
// prewrite ends with nothing unwritten left and counts what it wrote; with
// NoPrewrite it writes nothing. Skipped where the file system does not
// report extents (the prewrite is then off, and says why).
func TestPrewriteBackground(t *testing.T) {
	g := tinyGeometry()
	numPages := 64 * g.ChunkPages
	cfg := testConfig(t, g, 0, numPages)
	cfg.CapacityBytes, cfg.NoPrewrite = 16<<20, false
	s, kv := openKV(t, cfg)
	defer closeKV(t, s, kv)
	if st := s.Stats().Prewrite; st.State == PrewriteOff {
		t.Skipf("prewrite %v: %s", st.State, st.Reason)
	} else if st.State != PrewriteRunning || st.LeftBytes == 0 {
		t.Fatalf("a fresh fallocated store: prewrite %+v with nothing left", st)
	}
	rng := rand.New(rand.NewPCG(7, 0))
	for i := 0; i < 20; i++ {
		c := chainOf(uint64(1000*(i+1)), 1+i%3)
		p := pageTable(rng, g, numPages, len(c))
		fill(kv, g, c, p)
		if sv := saveWait(t, s, c, p); sv.Saved() != len(c) {
			t.Fatalf("save %d: saved %d of %d", i, sv.Saved(), len(c))
		}
		scramble(kv, g, numPages)
		p2 := pageTable(rng, g, numPages, len(c))
		if l := loadWait(t, s, c, p2); l.Blocks() != len(c) {
			t.Fatalf("load %d: %d of %d blocks", i, l.Blocks(), len(c))
		}
		if err := verify(kv, g, c, p2, len(c)); err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
	}
	if !s.WaitPrewrite(30 * time.Second) {
		t.Fatalf("prewrite still %+v after 30 s: %+v", s.Stats().Prewrite, s.Stats())
	}
	st := s.Stats()
	if p := st.Prewrite; p.State != PrewriteDone || p.Reason != "" || p.LeftBytes != 0 || p.WrittenBytes <= 0 || p.Errors != 0 {
		t.Errorf("after the prewrite: %+v", p)
	}
	if free := s.Stats().Map.FreeBytes; st.Prewrite.WrittenBytes > cfg.CapacityBytes || st.Prewrite.WrittenBytes < free/2 {
		t.Errorf("prewrote %d bytes of a %d-byte pool with %d free", st.Prewrite.WrittenBytes, cfg.CapacityBytes, free)
	}

	off := testConfig(t, g, 0, numPages)
	s2, kv2 := openKV(t, off)
	defer closeKV(t, s2, kv2)
	time.Sleep(3 * prewrite.Idle)
	if p := s2.Stats().Prewrite; p.State != PrewriteOff || p.Reason != "Config.NoPrewrite" || p.WrittenBytes != 0 {
		t.Errorf("NoPrewrite: %+v", p)
	}
}
