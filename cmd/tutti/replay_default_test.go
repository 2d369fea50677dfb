package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/harness"
	"github.com/tutti-io/tutti/internal/trace"
)

// TestDefaultReplayReuses: the no-flag replay runs docqa, and its requests
// (the tiny model's blocks) have real reuse: with every distinct block
// stored, at least half of the block references hit.
func TestDefaultReplayReuses(t *testing.T) {
	f := newReplayFlags(io.Discard)
	if err := parseFlags(f.fs, nil); err != nil {
		t.Fatal(err)
	}
	prof, _, err := f.check()
	if err != nil {
		t.Fatal(err)
	}
	if f.kind != workloadDocQA {
		t.Fatalf("the no-flag replay runs %q, want docqa", f.kind)
	}
	reqs, _, warm, _, err := replayRequests(f.fs, f.wl, f.kind, *f.tracePath, trace.Options{BlockTokens: *f.blockTokens},
		trace.Window{First: *f.requests}, *f.warmMs, prof.BlockTokens(), io.Discard)
	if err != nil || warm != nil {
		t.Fatalf("%v, warm %v", err, warm)
	}
	sum := trace.Summarize(reqs)
	u := harness.AnalyzeWindow(reqs, nil, int(sum.DistinctBlocks))
	if ratio := float64(u.Hits) / float64(u.BlockRefs); ratio < 0.5 {
		t.Fatalf("%d requests: %d of %d block references can hit (%.2f), want at least half", len(reqs), u.Hits, u.BlockRefs, ratio)
	}
}

// TestSummaryStartsWithGains: the summary's first lines say what tutti
// gained (harness.Gains), before the setup line and the table.
func TestSummaryStartsWithGains(t *testing.T) {
	row := func(name string, p50, rate float64) harness.BackendResult {
		return harness.BackendResult{Backend: name, Requests: 2, TTFTmsP50: p50, MaxRateAtSLO: rate, HitRatio: 0.8,
			Services: []harness.Service{{}, {}}}
	}
	res := &harness.Result{Model: "tiny", Workload: harness.WorkloadDocQA, Disks: "vda", Backends: []harness.BackendResult{
		row("tutti-cpu", 5, 100), row("lmcache-gds", 10, 50), row("recompute", 20, 10)}}
	var out bytes.Buffer
	printSummary(&out, res)
	lines := strings.Split(out.String(), "\n")
	if !strings.HasPrefix(lines[0], "what tutti-cpu gained on this machine (docqa") ||
		!strings.Contains(lines[1], "recompute") || !strings.Contains(lines[1], "4.00× lower") ||
		!strings.Contains(lines[2], "lmcache-gds") || !strings.HasPrefix(lines[3], "model tiny") {
		t.Fatalf("summary:\n%s", out.String())
	}
}

// TestBackendsAgree: `tutti replay -h` and the README's backend table list
// the same backends, the default ones apart from those run only when named,
// each with harness.BackendSummary's words (the report uses them too).
func TestBackendsAgree(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	run([]string{"replay", "-h"}, io.Discard, &stderr)
	help := stderr.String()
	defaults, named, _ := strings.Cut(help, "only when named")
	var inReadme []string
	for _, l := range strings.Split(string(readme), "\n") {
		if rest, ok := strings.CutPrefix(l, "| `"); ok {
			name, summary, _ := strings.Cut(rest, "` | ")
			if s := harness.BackendSummary(name); s != "" {
				inReadme = append(inReadme, name)
				if summary != s+" |" {
					t.Errorf("README.md says %s is %q, want %q", name, summary, s+" |")
				}
			}
		}
	}
	all := slices.Concat(harness.BackendNames, harness.ExtraBackendNames)
	if !slices.Equal(inReadme, all) {
		t.Errorf("README.md's backend table lists %v, want %v", inReadme, all)
	}
	for _, n := range harness.BackendNames {
		if !strings.Contains(defaults, n+strings.Repeat(" ", 19-len(n))+harness.BackendSummary(n)) {
			t.Errorf("replay -h does not list default backend %s with its summary:\n%s", n, help)
		}
	}
	for _, n := range harness.ExtraBackendNames {
		if !strings.Contains(named, n+strings.Repeat(" ", max(1, 19-len(n)))+harness.BackendSummary(n)) {
			t.Errorf("replay -h does not list %s among those run only when named", n)
		}
	}
}
