package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLineProgress: a phase prints its first and last update as whole
// lines and nothing in between within progressEvery; a new phase prints at
// once.
func TestLineProgress(t *testing.T) {
	var buf bytes.Buffer
	p := newLineProgress(&buf)
	for i := 1; i <= 100; i++ {
		p.Update("tutti-cpu", i, 100)
	}
	p.Note("dram", 1, 10, "(last x)")
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[0], "tutti-cpu: 1/100") || !strings.HasSuffix(lines[1], "tutti-cpu: 100/100") ||
		!strings.HasSuffix(lines[2], "dram: 1/10 (last x)") || strings.Contains(buf.String(), "\r") {
		t.Fatalf("progress lines:\n%s", buf.String())
	}
}

// TestReplayAbsurdTimestamp: a trace line with a timestamp of 1e308 fails
// the replay naming that line, before any backend runs.
func TestReplayAbsurdTimestamp(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "trace.jsonl")
	line := func(ts string) string {
		return `{"timestamp": ` + ts + `, "input_length": 512, "output_length": 1, "hash_ids": [1]}` + "\n"
	}
	if err := os.WriteFile(tr, []byte(line("0")+line("1e308")+line("5")), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"replay", "--trace", tr, "--dir", filepath.Join(dir, "store"), "--out", filepath.Join(dir, "out"), "--no-ceiling", "--backends", "dram"}, &stdout, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "trace line 2: field timestamp: 1e+308 ms is beyond the limit") {
		t.Fatalf("exit %d, %q", code, stderr.String())
	}
}
