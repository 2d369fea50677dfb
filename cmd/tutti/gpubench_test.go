package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/gpubench"
	"github.com/tutti-io/tutti/eval/gpubench/pool"
	"github.com/tutti-io/tutti/kernels"
)

// Without the kernels library or a GPU, gpubench refuses with the reason and
// writes nothing; bad arguments are refused before the GPU is touched.
func TestGPUBenchRefusals(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"gpubench", "--model", "gpt-9"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "unknown model") {
		t.Fatalf("unknown model: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"gpubench"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "--dir or --devices") {
		t.Fatalf("no storage: exit %d, stderr %q", code, errb.String())
	}
	if kernels.Init(0) == nil {
		t.Skip("GPU and library present: gpubench itself runs in kernels/device-test.sh")
	}
	errb.Reset()
	dir := t.TempDir()
	if code := run([]string{"gpubench", "--dir", dir, "--tokens", "16"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "needs the GPU") {
		t.Fatalf("no GPU: exit %d, stderr %q", code, errb.String())
	}
}

// Bad --stripe and --run-pages are refused naming the flag, before the GPU
// is asked for.
func TestGPUBenchStripeRefusals(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"gpubench", "--dir", t.TempDir(), "--tokens", "4096", "--run-pages", "48"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "--run-pages 48") {
		t.Fatalf("--run-pages 48: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"gpubench", "--dir", t.TempDir(), "--gpus", "2", "--stripe", "layers"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "--stripe and --run-pages apply to one GPU") {
		t.Fatalf("--gpus 2 --stripe layers: exit %d, stderr %q", code, errb.String())
	}
}

// TestGPUBenchStoreCPU runs `gpubench --paths store-cpu --rounds 2` as a
// user does on a machine without a GPU: rows for the save, the restore, the
// warm restore and the save again, the median of two rounds, in the table
// and in the JSON with both rounds' values.
func TestGPUBenchStoreCPU(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "rows.json")
	var out, errb bytes.Buffer
	err := runGPUBench([]string{"--paths", "store-cpu", "--dir", dir, "--model", "tiny", "--tokens", "2048", "--no-ceiling", "--rounds", "2", "--json", js}, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "median of 2 rounds") || !strings.Contains(out.String(), "  store-cpu save-again") {
		t.Errorf("no table of the rounds:\n%s", out.String())
	}
	if !strings.Contains(errb.String(), "gpubench store paths: 2/2") {
		t.Errorf("no progress line without a terminal:\n%s", errb.String())
	}
	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d JSON rows:\n%s", len(lines), data)
	}
	for i, op := range []string{"save", "restore", "restore-warm", "save-again"} {
		var r struct {
			Path, Op   string
			Blocks     int
			Mismatches uint64
			Rounds     int
			PerRound   gpubench.RoundStats `json:"per_round"`
		}
		if err := json.Unmarshal([]byte(lines[i]), &r); err != nil {
			t.Fatal(err)
		}
		if r.Path != "store-cpu" || r.Op != op || r.Blocks != 4 || r.Mismatches != 0 || r.Rounds != 2 || len(r.PerRound.BytesPerS) != 2 {
			t.Errorf("row %d: %+v", i, r)
		}
	}
	if _, err := runGPUBenchQuiet("--paths", "store-cpu", "--model", "tiny"); err == nil {
		t.Fatal("store-cpu without a directory ran")
	}
}

func runGPUBenchQuiet(args ...string) (string, error) {
	var out bytes.Buffer
	err := runGPUBench(args, &out, &out)
	return out.String(), err
}

// poolLine is one gpubench --json line with per-round values.
func poolLine(t *testing.T, model, path string, bps, frac, cpu []float64) string {
	t.Helper()
	r := gpubench.Row{Path: path, Storage: "loops", Model: model, Rounds: len(bps),
		PerRound: gpubench.RoundStats{BytesPerS: bps, CeilingFraction: frac, CPUSPerGiB: cpu}}
	r.BytesPerS, r.CeilingFraction, r.CPUSPerGiB = gpubench.Median(bps), gpubench.Median(frac), gpubench.Median(cpu)
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestGPUBenchPoolCommand(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "g1.json")
	in := poolLine(t, "70b", "gpu-driven (kick, no SQPOLL)", []float64{12e9, 11e9}, []float64{.97, .96}, []float64{.004, .004}) + "\n" +
		poolLine(t, "70b", "(a) uring -> staging -> scatter", []float64{10e9, 12e9}, []float64{.90, .91}, []float64{.02, .02}) + "\n"
	if err := os.WriteFile(p, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if err := runGPUBenchPool([]string{p}, &out, &errb); err != nil {
		t.Fatalf("%v: %s", err, errb.String())
	}
	for _, want := range []string{"gpu-driven ", "1 of 2", "0.917-1.200", "Compared paths: (a) uring -> staging -> scatter"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runGPUBenchPool([]string{"--json", p}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	var rows []pool.Pooled
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil || len(rows) != 2 || rows[0].VsRounds != 2 {
		t.Errorf("--json: %v %+v", err, rows)
	}
	if err := runGPUBenchPool(nil, &out, &errb); err == nil {
		t.Error("no files: no error")
	}
	if err := runGPUBenchPool([]string{filepath.Join(dir, "missing.json")}, &out, &errb); err == nil {
		t.Error("a missing file: no error")
	}
}
