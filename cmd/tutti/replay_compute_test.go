package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/kernels"
)

// replayCompute runs a 5-request replay with --compute mode and returns the
// exit code, the compute label of the JSON rows and stderr.
func replayCompute(t *testing.T, mode string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run([]string{"replay", "--workload", "conversation", "--requests", "5", "--json", "--no-ceiling", "--no-ebpf", "--dir", t.TempDir(),
		"--out", t.TempDir(), "--backends", "dram,recompute", "--compute", mode}, &stdout, &stderr)
	if code != 0 {
		return code, "", stderr.String()
	}
	var rows []struct {
		Compute   string  `json:"compute"`
		TTFTmsP50 float64 `json:"ttft_ms_p50"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	for _, r := range rows {
		if r.Compute != rows[0].Compute || r.TTFTmsP50 <= 0 {
			t.Fatalf("rows %+v", rows)
		}
	}
	return code, rows[0].Compute, stderr.String()
}

// TestReplayComputeFlag: sim is today's simulated model; auto says in the
// label when it fell back; gpu fails without a GPU instead of falling back.
func TestReplayComputeFlag(t *testing.T) {
	if code, _, stderr := replayCompute(t, "fast"); code == 0 || !strings.Contains(stderr, `--compute "fast"`) {
		t.Errorf("--compute fast: exit %d: %s", code, stderr)
	}
	code, label, stderr := replayCompute(t, "sim")
	if code != 0 || !strings.HasPrefix(label, "simulated") || strings.Contains(label, "fell back") {
		t.Fatalf("--compute sim: exit %d, label %q: %s", code, label, stderr)
	}
	err := kernels.Init(0)
	gpu := err == nil
	if !gpu && kernels.Explicit() {
		t.Fatalf("TUTTI_KERNELS_LIB is set but: %v", err)
	}
	if !gpu && !(errors.Is(err, kernels.ErrNotLoaded) || errors.Is(err, kernels.ErrNoGPU)) {
		t.Fatalf("kernels: %v", err)
	}
	code, label, stderr = replayCompute(t, "auto")
	switch {
	case code != 0:
		t.Fatalf("--compute auto: exit %d: %s", code, stderr)
	case gpu && !strings.HasPrefix(label, "measured on GPU"):
		t.Errorf("--compute auto with a GPU: label %q", label)
	case !gpu && (!strings.HasPrefix(label, "simulated") || !strings.Contains(label, "--compute auto fell back")):
		t.Errorf("--compute auto without a GPU: label %q does not report the fallback", label)
	}
	code, label, stderr = replayCompute(t, "gpu")
	if gpu && (code != 0 || !strings.HasPrefix(label, "measured on GPU")) {
		t.Errorf("--compute gpu: exit %d, label %q: %s", code, label, stderr)
	}
	if !gpu && (code == 0 || !strings.Contains(stderr, "--compute gpu")) {
		t.Errorf("--compute gpu without a GPU: exit %d: %s", code, stderr)
	}
}
