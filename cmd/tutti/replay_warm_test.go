package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/harness"
	"github.com/tutti-io/tutti/eval/report"
	"github.com/tutti-io/tutti/internal/trace"
)

type warmRow struct {
	Backend             string  `json:"backend"`
	Requests            int     `json:"requests"`
	VerifyMismatches    int64   `json:"verify_mismatches"`
	HitRatio            float64 `json:"hit_ratio"`
	RestoredBytes       int64   `json:"restored_bytes"`
	DeviceReadBytes     uint64  `json:"device_read_bytes"`
	DirectIO            bool    `json:"direct_io"`
	WarmMs              float64 `json:"warm_ms"`
	WarmHistoryRequests int     `json:"warm_history_requests"`
	WarmSavedBlocks     int64   `json:"warm_saved_blocks"`
	Skipped             string  `json:"skipped"`
}

// replayRows runs a replay and returns its --json rows, its report.md and
// its warm.json (nil when it wrote none).
func replayRows(t *testing.T, args ...string) ([]warmRow, string, *harness.WarmSummary) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	out := t.TempDir()
	args = append([]string{"replay", "--workload", "conversation", "--json", "--no-ceiling", "--dir", t.TempDir(), "--out", out}, args...)
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, stderr.String())
	}
	var rows []warmRow
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	var warm *harness.WarmSummary
	if b, err := os.ReadFile(filepath.Join(out, report.WarmFile)); err == nil {
		warm = new(harness.WarmSummary)
		if err := json.Unmarshal(b, warm); err != nil {
			t.Fatal(err)
		}
	}
	return rows, string(md), warm
}

// TestReplayWarm: --warm-ms on the embedded window, end to end. A window in
// the middle of it (its line 145) starts from the blocks of the 144 requests
// before it: more hits for
// every caching backend, none for recompute, every restored byte verified,
// and the report says the window started warm and from what. At the
// window's start there is no history: the flag is a no-op that says so.
func TestReplayWarm(t *testing.T) {
	// The planner off: its load-or-recompute choice follows the device
	// probe, which a loaded machine can put anywhere; this is the warm-up's test.
	common := []string{"--from-ms", "1716000", "--requests", "8", "--tutti-planner=false", "--backends", "tutti-cpu,per-block,pagecache,dram,recompute"}
	cold, _, none := replayRows(t, common...)
	warm, md, ws := replayRows(t, append(common, "--warm-ms", "1800000")...)
	if none != nil || ws == nil || ws.Blocks == 0 || ws.HistoryRequests == 0 || ws.FromMs != -84000 || ws.ToMs != 1716000 {
		t.Fatalf("warm.json: cold %+v, warm %+v", none, ws)
	}
	if len(warm) != 5 || len(cold) != 5 {
		t.Fatalf("%d and %d rows", len(warm), len(cold))
	}
	for i, w := range warm {
		c := cold[i]
		t.Logf("%s: hit ratio %.3f warm, %.3f cold; warm-up saved %d blocks", w.Backend, w.HitRatio, c.HitRatio, w.WarmSavedBlocks)
		if w.Skipped != "" || w.Requests != 8 || c.Requests != 8 || w.VerifyMismatches != 0 {
			t.Fatalf("%+v", w)
		}
		if w.WarmMs != 1800000 || w.WarmHistoryRequests == 0 {
			t.Fatalf("%s: row does not say the window started warm: %+v", w.Backend, w)
		}
		if w.DirectIO && w.DeviceReadBytes < uint64(w.RestoredBytes) {
			t.Fatalf("%s: device read %d < restored %d", w.Backend, w.DeviceReadBytes, w.RestoredBytes)
		}
		if w.Backend == "recompute" {
			if w.HitRatio != 0 || w.WarmSavedBlocks != 0 {
				t.Fatalf("recompute: %+v", w)
			}
			continue
		}
		if w.HitRatio <= c.HitRatio || w.WarmSavedBlocks == 0 {
			t.Fatalf("%s: hit ratio %.3f warm, %.3f cold, %d warm blocks", w.Backend, w.HitRatio, c.HitRatio, w.WarmSavedBlocks)
		}
	}
	for _, want := range []string{"| start | the window started WARM", "### Warm start", "[-84000, 1716000) ms"} {
		if !strings.Contains(md, want) {
			t.Fatalf("report.md lacks %q", want)
		}
	}

	rows, md, _ := replayRows(t, "--requests", "5", "--backends", "dram", "--warm-ms", "60000")
	if rows[0].WarmSavedBlocks != 0 || !strings.Contains(md, "started cold") {
		t.Fatalf("a window at the trace's start: %+v", rows[0])
	}
	var stderr bytes.Buffer
	if code := run([]string{"replay", "--warm-ms", "-1"}, &bytes.Buffer{}, &stderr); code == 0 || !strings.Contains(stderr.String(), "--warm-ms") {
		t.Fatalf("--warm-ms -1: exit %d: %s", code, stderr.String())
	}
}

// TestReplayWarmGroup: the warm-up goes through tutti-cpu over 2 ranks too
// (--gpus 2): every rank saves the warm set, the window hits it.
func TestReplayWarmGroup(t *testing.T) {
	rows, md, _ := replayRows(t, "--from-ms", "1716000", "--requests", "8", "--tutti-planner=false", "--backends", "tutti-cpu", "--gpus", "2", "--warm-ms", "1800000")
	w := rows[0]
	t.Logf("%s: hit ratio %.3f, warm-up saved %d blocks", w.Backend, w.HitRatio, w.WarmSavedBlocks)
	if w.Backend != "tutti-cpu-tp2" || w.VerifyMismatches != 0 || w.WarmSavedBlocks == 0 || w.HitRatio == 0 || !strings.Contains(md, "started WARM") {
		t.Fatalf("%+v", w)
	}
}

// TestReplayTuttiSaveBound: --tutti-save-bound-ms reaches tutti's store and
// the report says so; other backends are unaffected; 0 keeps the runtime's.
func TestReplayTuttiSaveBound(t *testing.T) {
	rows, md, _ := replayRows(t, "--backends", "tutti-cpu,dram", "--requests", "12", "--tutti-save-bound-ms", "30000")
	if len(rows) != 2 {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		if r.VerifyMismatches != 0 {
			t.Fatalf("%s: %d mismatches", r.Backend, r.VerifyMismatches)
		}
	}
	if !strings.Contains(md, "tutti-cpu: save bound 30000 ms") || strings.Contains(md, "dram: save bound") {
		t.Fatalf("report.md does not name tutti-cpu's save bound alone:\n%s", md)
	}
	if _, md, _ := replayRows(t, "--backends", "tutti-cpu", "--requests", "4", "--tutti-save-bound-ms", "0"); strings.Contains(md, "save bound") {
		t.Fatalf("--tutti-save-bound-ms 0 still names a bound:\n%s", md)
	}
}

// TestReplayTraceErrorWhere: the trace is parsed once, yet a malformed line
// fails the step that reaches it, as when each step read the file itself: a
// window that ends before line 3 fails on spreading the arrivals (which
// needs the whole trace), one that reaches it on reading the window; both
// name the line. Both fail before any backend runs.
func TestReplayTraceErrorWhere(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	lines := `{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 10, "input_length": 600, "output_length": 1, "hash_ids": [1, 3]}
{"timestamp": 20, "input_length": 600, "output_length": 1, "hash_ids": [1]}
`
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--requests", "2"}, "spreading the arrivals of " + path + ": trace line 3: field hash_ids"},
		{[]string{"--to-ms", "10"}, "spreading the arrivals of " + path + ": trace line 3: field hash_ids"},
		{[]string{"--requests", "3"}, "reading " + path + ": trace line 3: field hash_ids"},
		{[]string{"--from-ms", "15"}, "reading " + path + ": trace line 3: field hash_ids"},
	} {
		var stderr bytes.Buffer
		args := append([]string{"replay", "--trace", path, "--backends", "dram", "--no-ceiling", "--out", t.TempDir()}, c.args...)
		if code := run(args, &bytes.Buffer{}, &stderr); code == 0 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q: want %q", c.args, code, stderr.String(), c.want)
		}
	}
}

// TestSpreadAsInTrace: a window inside one timestamp bucket keeps the
// spacing the whole bucket has in the trace (here 6 requests over the 3 s to
// the next bucket: 500 ms apart), instead of arriving all at once.
func TestSpreadAsInTrace(t *testing.T) {
	var b strings.Builder
	line := func(ts int, id int) {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 600, "output_length": 5, "hash_ids": [%d, %d]}`+"\n", ts, 2*id, 2*id+1)
	}
	id := 0
	for _, c := range []struct{ ts, n int }{{0, 4}, {3000, 6}, {6000, 2}} {
		for i := 0; i < c.n; i++ {
			line(c.ts, id)
			id++
		}
	}
	path := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	parsed, err := parseTrace(path, trace.Options{BlockTokens: 512})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		w    trace.Window
		want []float64
	}{
		{trace.Window{FromMs: 3000, First: 3}, []float64{3000, 3500, 4000}},
		{trace.Window{FromMs: 1, First: 8}, []float64{3000, 3500, 4000, 4500, 5000, 5500, 6000, 7500}},
		{trace.Window{First: 2}, []float64{0, 750}},
	} {
		reqs, _, err := parsed.Select(c.w)
		if err != nil {
			t.Fatal(err)
		}
		if err := spreadAsInTrace(reqs, parsed); err != nil {
			t.Fatal(err)
		}
		var got []float64
		for _, r := range reqs {
			got = append(got, r.ArrivalMs)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("window %+v: arrivals %v, want %v", c.w, got, c.want)
		}
	}
}
