package report

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/harness"
	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/trace"
)

func TestWriteReportAndPlots(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, err := harness.NewCompute(p, harness.DefaultGPUFLOPs, harness.DefaultLayerFixedNs)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("../testdata/window.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reqs, _, err := trace.ReadAll(f, trace.Options{}, trace.Window{First: 40})
	if err != nil {
		t.Fatal(err)
	}
	trace.Rebase(reqs)
	trace.Spread(reqs, 0)
	res, err := harness.Run(context.Background(), harness.Config{
		Requests: reqs, Profile: p, Dir: t.TempDir(), Compute: comp, CeilingBytes: -1,
		Backends: []harness.Backend{harness.NewTuttiCPU(&comp), harness.NewDRAM(), harness.Recompute{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	path, err := Write(out, res, Meta{Command: "tutti replay --requests 40", TracePath: "embedded", TimeScale: 1})
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# tutti replay report", "| dram |", "| recompute |", "simulated", TTFTPlot,
		// What tutti gained comes first in the results; each backend is said.
		"## Results\n\n**What tutti-cpu gained on this machine", "- against `recompute`: p50 TTFT", "- against `dram`:",
		"### Backends\n\n- `tutti-cpu`: " + harness.BackendSummary("tutti-cpu"), "- `dram`: " + harness.BackendSummary("dram")} {
		if !strings.Contains(string(md), want) {
			t.Fatalf("report lacks %q", want)
		}
	}
	for _, name := range []string{TTFTPlot, SLOPlot, BandwidthPlot} {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if img.Bounds().Dx() < 300 {
			t.Fatalf("%s: %v", name, img.Bounds())
		}
	}
	var rows []map[string]any
	b, _ := os.ReadFile(filepath.Join(out, JSONFile))
	if err := json.Unmarshal(b, &rows); err != nil || len(rows) != 3 {
		t.Fatalf("json: %v (%d rows)", err, len(rows))
	}
	for _, k := range []string{"backend", "ttft_ms_p50", "ttft_ms_p99", "max_rate_at_slo", "bytes_per_s", "ceiling_fraction", "ceiling_sum_fraction",
		"cpu_s_per_gib", "device_read_bytes", "verify_mismatches", "requests", "hit_blocks", "restored_bytes",
		"ios_per_layer_request_mean", "runs_per_request_mean", "blocks_per_request_mean"} {
		if _, ok := rows[0][k]; !ok {
			t.Fatalf("json lacks %s", k)
		}
	}
	if os.Getenv("TUTTI_KEEP_REPORT") != "" {
		t.Logf("report in %s", out)
	}
}

func TestProgressSilentOffTerminal(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf)
	p.Update("x", 1, 2)
	p.Update("x", 2, 2)
	if p.Enabled() || buf.Len() != 0 {
		t.Fatalf("progress wrote %q to a non-terminal", buf.String())
	}
}
