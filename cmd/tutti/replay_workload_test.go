package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The docqa workload replays like a trace: every backend serves every
// generated request, the questions after the first of each document hit,
// and the report's first table says what was left out.
func TestReplayDocQA(t *testing.T) {
	var stdout, stderr bytes.Buffer
	out := t.TempDir()
	code := run([]string{"replay", "--workload", "docqa", "--docqa-docs", "3", "--docqa-questions", "3",
		"--docqa-min-doc-tokens", "1024", "--docqa-max-doc-tokens", "4096", "--json", "--no-ceiling",
		"--dir", t.TempDir(), "--out", out, "--backends", "lmcache-disk,recompute", "--rounds", "2"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rows []struct {
		Backend  string  `json:"backend"`
		Requests int     `json:"requests"`
		Hit      float64 `json:"hit_ratio"`
		Rounds   *struct {
			Rates []float64 `json:"max_rate_at_slo"`
		} `json:"rounds"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if len(rows) != 2 || rows[0].Requests != 9 || rows[0].Hit <= 0 || rows[0].Rounds == nil || len(rows[0].Rounds.Rates) != 2 {
		t.Fatalf("rows %+v", rows)
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"docqa (long-document QA", "| left out | 0 requests", "indicative only", "over 2 rounds"} {
		if !strings.Contains(string(md), want) {
			t.Fatalf("report lacks %q", want)
		}
	}
}

func TestReplayWorkloadFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in the error
	}{
		{[]string{"--workload", "nosuch"}, `--workload "nosuch"`},
		{[]string{"--workload", "docqa", "--trace", "x.jsonl"}, "--workload and --trace"},
		{[]string{"--workload", "docqa", "--warm-ms", "1000"}, "--warm-ms"},
		{[]string{"--workload", "docqa", "--docqa-docs", "0"}, "0 documents"},
		{[]string{"--workload", "docqa", "--rounds", "0"}, "--rounds 0"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"replay", "--no-ceiling", "--out", t.TempDir()}, tc.args...), &stdout, &stderr)
		if code == 0 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, want an error naming %q: %s", tc.args, code, tc.want, stderr.String())
		}
	}
}

// --pick-window on the embedded window prints windows with their reuse.
func TestReplayPickWindow(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"replay", "--workload", "conversation", "--pick-window", "--model", "llama3-70b", "--warm-ms", "30000", "--pick-top", "2"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if lines := strings.Count(stdout.String(), "--from-ms "); lines != 2 || !strings.Contains(stdout.String(), "from the warm set") {
		t.Fatalf("output: %s", stdout.String())
	}
}
