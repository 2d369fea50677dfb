package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestReplayGPUs: `tutti replay --gpus 2` runs tutti-cpu over 2 ranks next
// to the other backends, every restored byte verified; a degree the model's
// heads do not split over is refused before anything runs.
func TestReplayGPUs(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"replay", "--gpus", "2", "--requests", "20", "--json", "--no-ceiling", "--no-ebpf", "--dir", t.TempDir(),
		"--out", t.TempDir(), "--backends", "tutti-cpu,dram"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rows []struct {
		Backend          string `json:"backend"`
		Requests         int    `json:"requests"`
		VerifyMismatches int64  `json:"verify_mismatches"`
		Skipped          string `json:"skipped"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if len(rows) != 2 || rows[0].Backend != "tutti-cpu-tp2" || rows[1].Backend != "dram" {
		t.Fatalf("rows %+v", rows)
	}
	for _, r := range rows {
		if r.Skipped != "" || r.Requests != 20 || r.VerifyMismatches != 0 {
			t.Fatalf("%+v", r)
		}
	}
	stderr.Reset()
	if code := run([]string{"replay", "--gpus", "4", "--requests", "5", "--backends", "tutti-cpu"}, &stdout, &stderr); code == 0 ||
		!strings.Contains(stderr.String(), "2 KV heads cannot be split evenly over 4 ranks") {
		t.Fatalf("--gpus 4 with the tiny model: exit %d, %s", code, stderr.String())
	}
}

// TestGPUBenchGPUs: `tutti gpubench --gpus N` refuses a degree the model's
// heads do not split over, and without the GPU path says so and fails.
func TestGPUBenchGPUs(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"gpubench", "--gpus", "3", "--dir", t.TempDir()}, &stdout, &stderr); code == 0 ||
		!strings.Contains(stderr.String(), "8 KV heads cannot be split evenly over 3 ranks") {
		t.Fatalf("--gpus 3: exit %d, %s", code, stderr.String())
	}
	stderr.Reset()
	stdout.Reset()
	code := run([]string{"gpubench", "--gpus", "2", "--tokens", "256", "--dir", t.TempDir()}, &stdout, &stderr)
	if code == 0 {
		t.Skipf("the GPU path ran here: %s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "GPU path unavailable") {
		t.Fatalf("--gpus 2 without a GPU: exit %d, %s %s", code, stdout.String(), stderr.String())
	}
}
