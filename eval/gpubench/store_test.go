package gpubench

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	evalmodel "github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
)

// TestRunStoreCPU saves and restores a prefix through runtime.Store on
// PathCPU over two directories in two rounds and checks the rows: every
// block saved and restored (twice: the warm restore), saved again after a
// discard and restored once more, no mismatched word in any round, the
// ceilings sampled around every operation, per-round values for both
// rounds, a restore's time split in order and its CPU by thread, nothing
// left behind.
func TestRunStoreCPU(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir()}
	cfg := StoreConfig{Model: "tiny", Tokens: 4096, Dirs: dirs, Label: "test", Seed: 3, Paths: []string{PathStoreCPU}, Rounds: 2,
		CeilingMemBytes: 64 << 20}
	var log strings.Builder
	rows, ceil, err := RunStore(context.Background(), cfg, &log)
	if err != nil {
		t.Fatal(err)
	}
	if ceil.WriteBytesPS <= 0 || ceil.ReadBytesPS <= 0 || ceil.FileBytes != minCeilingFile {
		t.Fatalf("ceilings %+v", ceil)
	}
	if len(rows) != 4 || rows[0].Op != "save" || rows[1].Op != "restore" || rows[2].Op != "restore-warm" || rows[3].Op != "save-again" {
		t.Fatalf("rows %+v", rows)
	}
	const blocks = 4096 / (16 * 32)
	for _, r := range rows {
		pr := r.PerRound
		if r.Blocks != blocks || r.Mismatches != 0 || r.Bytes <= 0 || r.BytesPerS <= 0 || r.CeilingFraction <= 0 || len(r.Skipped) != 0 ||
			r.CeilingBeforeBytesPS <= 0 || r.CeilingAfterBytesPS <= 0 || r.HostCPUs <= 0 ||
			(isSave(r.Op) && (r.CopyS+r.ChecksumS <= 0 || r.DirectWrites == 0 || r.StagedWrites != 0)) ||
			(isSave(r.Op) && !(0 < r.AdmittedS && r.AdmittedS <= r.FirstWriteS && r.FirstWriteS <= r.WritesS && r.WritesS <= r.Seconds &&
				0 < r.DeviceWritesMin && r.DeviceWritesMin <= r.DeviceWritesMax && r.DeviceWritesMax <= r.WritesS)) ||
			(!isSave(r.Op) && (r.Threads == "" || !(0 < r.SubmittedS && r.SubmittedS <= r.FirstLayerS && r.FirstLayerS <= r.LastLayerS && r.LastLayerS <= r.Seconds))) {
			t.Errorf("%s %s: %s", r.Path, r.Op, Summary(r))
		}
		if r.Rounds != 2 || len(pr.BytesPerS) != 2 || len(pr.CeilingFraction) != 2 || len(pr.CeilingBytesPS) != 2 || len(pr.CPUSPerGiB) != 2 ||
			len(pr.Position) != 2 || slices.Min(pr.CeilingFraction) <= 0 {
			t.Errorf("%s %s: %d rounds, per round %+v", r.Path, r.Op, r.Rounds, pr)
		}
	}
	if !strings.Contains(log.String(), "written from 64 MiB and read into 64 MiB per dir") {
		t.Errorf("the log does not say the memory the ceilings used:\n%s", log.String())
	}
	if n := strings.Count(log.String(), "round 2/2 store-cpu"); n != 4 {
		t.Errorf("%d round 2 rows logged, want 4:\n%s", n, log.String())
	}
	for _, d := range dirs {
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Errorf("%s left %d entries behind", d, len(ents))
		}
	}
}

// TestVerifyCountsCorruption: a word changed after the restore is counted.
func TestVerifyCountsCorruption(t *testing.T) {
	k, err := NewKV(mustGeometry(t, "tiny"), 10, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Free()
	dst := []int32{7, 2, 5}
	if err := k.fill(5, dst); err != nil {
		t.Fatal(err)
	}
	if bad, err := k.verify(5, dst); err != nil || bad != 0 {
		t.Fatalf("clean: %d, %v", bad, err)
	}
	k.Host.Page(1, 1, 2)[17] ^= 1
	k.Host.Page(0, 0, 7)[0] ^= 1
	if bad, err := k.verify(5, dst); err != nil || bad != 2 {
		t.Fatalf("two flipped words: counted %d, %v", bad, err)
	}
	if bad, _ := k.verify(6, dst); bad == 0 {
		t.Fatal("another seed verified")
	}
}

// TestRunStoreGPUSkips: without a GPU, store-gpu fails with the kernels
// error a caller can branch on, not a silent CPU run.
func TestRunStoreGPUSkips(t *testing.T) {
	if kernels.Init(0) == nil {
		t.Skip("a GPU is here: the device test runs store-gpu")
	}
	cfg := StoreConfig{Model: "tiny", Tokens: 1024, Dirs: []string{t.TempDir()}, Seed: 1, Paths: []string{PathStoreGPU}, NoCeiling: true}
	_, _, err := RunStore(context.Background(), cfg, io.Discard)
	if !errors.Is(err, kernels.ErrNotLoaded) && !errors.Is(err, kernels.ErrNoGPU) {
		t.Fatalf("store-gpu without a GPU: %v", err)
	}
}

func TestRunStoreRefuses(t *testing.T) {
	for _, c := range []StoreConfig{
		{Model: "tiny", Tokens: 0, Dirs: []string{"x"}, Paths: []string{PathStoreCPU}},
		{Model: "tiny", Tokens: 10, Paths: []string{PathStoreCPU}},
		{Model: "tiny", Tokens: 10, Dirs: []string{"x"}, Paths: []string{"gpu"}},
		{Model: "nope", Tokens: 10, Dirs: []string{"x"}, Paths: []string{PathStoreCPU}},
	} {
		if _, _, err := RunStore(context.Background(), c, io.Discard); err == nil || strings.Contains(err.Error(), "panic") {
			t.Errorf("%+v: %v", c, err)
		}
	}
	for _, mem := range []int64{-1, maxCeilingMem + 1} {
		c := StoreConfig{Model: "tiny", Tokens: 10, Dirs: []string{t.TempDir()}, Paths: []string{PathStoreCPU}, CeilingMemBytes: mem}
		if _, _, err := RunStore(context.Background(), c, io.Discard); err == nil || !strings.Contains(err.Error(), "ceiling memory") {
			t.Errorf("ceiling memory %d: %v", mem, err)
		}
	}
}

func mustGeometry(t *testing.T, model string) kvshape.Geometry {
	t.Helper()
	p, err := evalmodel.Lookup(model)
	if err != nil {
		t.Fatal(err)
	}
	return p.MustGeometry()
}
