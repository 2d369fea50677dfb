package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/harness"
)

// TestReplayInvariants is CI's check of the harness: a short window through
// the CPU backends; every backend served the same requests, every restored
// byte verified, and O_DIRECT backends read at least what they restored from
// the device.
func TestReplayInvariants(t *testing.T) {
	var stdout, stderr bytes.Buffer
	out := t.TempDir()
	code := run([]string{"replay", "--workload", "conversation", "--requests", "30", "--json", "--no-ceiling", "--dir", t.TempDir(), "--out", out,
		"--backends", "tutti-cpu,lmcache-gds,lmcache-disk,vllm-fs,dram,recompute"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rows []struct {
		Backend          string  `json:"backend"`
		Requests         int     `json:"requests"`
		VerifyMismatches int64   `json:"verify_mismatches"`
		RestoredBytes    int64   `json:"restored_bytes"`
		DeviceReadBytes  uint64  `json:"device_read_bytes"`
		DirectIO         bool    `json:"direct_io"`
		TTFTmsP50        float64 `json:"ttft_ms_p50"`
		IOsPerLayerReq   float64 `json:"ios_per_layer_request_mean"`
		RunsPerReq       float64 `json:"runs_per_request_mean"`
		MaxRate          float64 `json:"max_rate_at_slo"`
		Skipped          string  `json:"skipped"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if len(rows) != 6 {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		if r.Skipped != "" {
			t.Fatalf("%s skipped: %s", r.Backend, r.Skipped)
		}
		if r.Requests != 30 || r.VerifyMismatches != 0 || r.TTFTmsP50 <= 0 {
			t.Fatalf("%+v", r)
		}
		if r.DirectIO && r.DeviceReadBytes < uint64(r.RestoredBytes) {
			t.Fatalf("%s: device read %d < restored %d", r.Backend, r.DeviceReadBytes, r.RestoredBytes)
		}
		if r.Backend == "tutti-cpu" && r.IOsPerLayerReq > r.RunsPerReq+1e-9 {
			t.Fatalf("tutti-cpu: %.2f I/Os per layer and request > %.2f runs per request", r.IOsPerLayerReq, r.RunsPerReq)
		}
	}
	for _, f := range []string{"report.md", "results.json", "services.json", "ttft_cdf.png", "slo_vs_rate.png", "bandwidth.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatal(err)
		}
	}
	// tutti resweep replays the report's services.json: the same timeline
	// and default SLO give the replay's own figures back.
	var rs bytes.Buffer
	if code := run([]string{"resweep", "--json", out}, &rs, &stderr); code != 0 {
		t.Fatalf("resweep: exit %d: %s", code, stderr.String())
	}
	var again []harness.ResweepRow
	if err := json.Unmarshal(rs.Bytes(), &again); err != nil || len(again) != len(rows) {
		t.Fatalf("resweep rows %d (%v): %s", len(again), err, rs.String())
	}
	for i, r := range again {
		if r.Backend != rows[i].Backend || r.TTFTmsP50 != rows[i].TTFTmsP50 || r.MaxRateAtSLO != rows[i].MaxRate {
			t.Fatalf("resweep %+v, replay %+v", r, rows[i])
		}
	}
	if !strings.Contains(stderr.String(), "report: "+filepath.Join(out, "report.md")) {
		t.Fatalf("report path not printed: %s", stderr.String())
	}
}

func TestReplayMalformedTrace(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "t.jsonl")
	lines := `{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 10, "input_length": 600, "output_length": 1, "hash_ids": [1]}
{"timestamp": 20, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]}
`
	if err := os.WriteFile(tr, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"replay", "--trace", tr, "--backends", "dram", "--no-ceiling", "--out", dir}, &stdout, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "line 2") || !strings.Contains(stderr.String(), "hash_ids") {
		t.Fatalf("exit %d, stderr %q: want an error naming line 2 and hash_ids", code, stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	code = run([]string{"replay", "--trace", tr, "--backends", "dram,recompute", "--skip-bad", "--json", "--no-ceiling",
		"--out", dir, "--no-ebpf"}, &stdout, &stderr)
	if code != 0 || !strings.Contains(stderr.String(), "skipped 1 malformed") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), `"requests": 2`) {
		t.Fatalf("stdout %s", stdout.String())
	}
}

// A trace hashed at 16-token blocks (vLLM's granularity) replays with one
// page per chain block.
func TestReplayOtherBlockSize(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "t16.jsonl")
	lines := `{"timestamp": 0, "input_length": 40, "output_length": 1, "hash_ids": [1, 2, 3]}
{"timestamp": 5, "input_length": 33, "output_length": 1, "hash_ids": [1, 2, 4]}
{"timestamp": 9, "input_length": 48, "output_length": 1, "hash_ids": [1, 2, 4], "extra": "ignored"}
`
	if err := os.WriteFile(tr, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"replay", "--trace", tr, "--block-tokens", "16", "--backends", "per-block,tutti-cpu,dram",
		"--json", "--no-ceiling", "--tutti-planner=false", "--out", dir, "--dir", filepath.Join(dir, "store")}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rows []struct {
		Backend          string `json:"backend"`
		HitBlocks        int64  `json:"hit_blocks"`
		VerifyMismatches int64  `json:"verify_mismatches"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		// Request 2 hits [1 2], request 3 hits [1 2 4].
		if r.VerifyMismatches != 0 || r.HitBlocks != 5 {
			t.Fatalf("%+v", r)
		}
	}
	if code := run([]string{"replay", "--trace", tr, "--block-tokens", "20", "--no-ceiling", "--out", dir}, &stdout, &stderr); code == 0 {
		t.Fatal("--block-tokens 20 (not a multiple of 16-token pages) accepted")
	}
}

// A backend asked for by name that cannot run here is reported, the others
// still run, and the exit status says so.
func TestReplayUnavailableBackend(t *testing.T) {
	if harnessGPUAvailable() {
		t.Skip("a GPU is available: tutti-gpu can run")
	}
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run([]string{"replay", "--workload", "conversation", "--requests", "5", "--backends", "tutti-gpu,dram", "--no-ceiling", "--json", "--out", out},
		&stdout, &stderr)
	if code != 4 || !strings.Contains(stderr.String(), "tutti-gpu could not run") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), `"skipped"`) || !strings.Contains(stdout.String(), `"backend": "dram"`) {
		t.Fatalf("stdout %s", stdout.String())
	}
	if _, err := os.Stat(filepath.Join(out, "report.md")); err != nil {
		t.Fatal(err)
	}
}

func harnessGPUAvailable() bool {
	b, err := harness.NewBackend("tutti-gpu", nil)
	return err == nil && b.Available() == nil
}
