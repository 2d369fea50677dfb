package harness

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/model"
)

// TestStripedDirs runs every CPU backend over three store roots: each one
// that keeps files puts some in every root, restores still verify bit for
// bit, and the storage label reaches every row.
func TestStripedDirs(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, err := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := p.Geometry()
	const capBlocks = 14 // below the distinct blocks: eviction on the way
	for _, tc := range []struct {
		b     Backend
		files bool // keeps files (in every root)
	}{
		{NewTuttiCPU(&comp), true},
		{NewPerBlock(), true},
		{NewCuFileStandIn(), true},
		{NewPageCache(), true},
		{NewDRAM(), false},
		{Recompute{}, false},
	} {
		t.Run(tc.b.Name(), func(t *testing.T) {
			roots := []string{t.TempDir(), t.TempDir(), t.TempDir()}
			reqs := synthetic(24)
			const label = "three temp dirs"
			res, err := Run(context.Background(), Config{
				Requests: reqs, Profile: p, Dirs: roots, StorageLabel: label, CapacityBlocks: capBlocks,
				Backends: []Backend{tc.b}, Compute: comp, CeilingBytes: -1, KeepStores: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			b := res.Backends[0]
			if b.Skipped != "" {
				t.Fatalf("skipped: %s", b.Skipped)
			}
			if b.Requests != len(reqs) || b.VerifyMismatches != 0 || b.Fallbacks != 0 {
				t.Fatalf("%d requests, %d mismatches, %d fallbacks", b.Requests, b.VerifyMismatches, b.Fallbacks)
			}
			if b.Storage != label || res.Storage != label || len(res.Dirs) != len(roots) {
				t.Fatalf("storage %q / %q, dirs %q", b.Storage, res.Storage, res.Dirs)
			}
			if tc.b.Name() != "recompute" && b.HitBlocks == 0 {
				t.Fatal("nothing restored")
			}
			if b.DirectIO && b.DeviceReadBytes < uint64(b.RestoredBytes) {
				t.Fatalf("device read %d < restored %d (%s)", b.DeviceReadBytes, b.RestoredBytes, b.DeviceBytesSource)
			}
			var counts []int
			var slotBytes int64
			for _, r := range roots {
				ents, err := os.ReadDir(filepath.Join(r, tc.b.Name()))
				if err != nil {
					t.Fatal(err)
				}
				counts = append(counts, len(ents))
				var largest int64 // a data file (pool, slots, chunk), not only a lock or manifest
				for _, e := range ents {
					if fi, err := e.Info(); err == nil {
						largest = max(largest, fi.Size())
					}
				}
				if tc.files && largest < g.ChunkBytes() {
					t.Fatalf("no data file in %s (largest %d bytes)", r, largest)
				}
				if !tc.files && len(ents) != 0 {
					t.Fatalf("%d files in %s", len(ents), r)
				}
				if fi, err := os.Stat(filepath.Join(r, tc.b.Name(), "slots.dat")); err == nil {
					slotBytes += fi.Size()
				}
			}
			if tc.b.Name() == "per-block" {
				// capacity is the total over the roots, not per root
				stride := (g.PageBytesPerLayer() + 4095) &^ 4095
				if want := int64(capBlocks) * int64(g.Layers*g.ChunkPages) * stride; slotBytes != want {
					t.Fatalf("slot files hold %d bytes, want %d", slotBytes, want)
				}
			}
			t.Logf("files per root %v, %d hit blocks, device %d B (%s)", counts, b.HitBlocks, b.DeviceReadBytes, b.DeviceBytesSource)
		})
	}
}

// TestCeilingAcross measures the ceiling in several roots at once: the sum,
// with every root named in the note.
func TestCeilingAcross(t *testing.T) {
	roots := []string{t.TempDir(), t.TempDir()}
	bps, note, err := ceilingAcross(context.Background(), roots, 8<<20)
	if err != nil {
		t.Skipf("no ceiling here: %v", err)
	}
	if bps <= 0 {
		t.Fatalf("ceiling %v", bps)
	}
	for _, r := range roots {
		if !strings.Contains(note, r) {
			t.Fatalf("note %q does not name %s", note, r)
		}
	}
	if _, _, err := ceilingAcross(context.Background(), []string{roots[0], "/proc/self/no"}, 8<<20); err == nil {
		t.Fatal("a root that cannot be measured must fail the ceiling")
	}
}

func TestSpreadIndex(t *testing.T) {
	const n = 4
	var hist [n]int
	for id := uint64(0); id < 4000; id++ {
		i := spreadIndex(id, n)
		if i < 0 || i >= n {
			t.Fatalf("spreadIndex(%d) = %d", id, i)
		}
		hist[i]++
	}
	for i, c := range hist {
		if c < 800 || c > 1200 {
			t.Fatalf("dir %d holds %d of 4000 consecutive ids: %v", i, c, hist)
		}
	}
	if spreadIndex(12345, 1) != 0 {
		t.Fatal("one dir")
	}
}
