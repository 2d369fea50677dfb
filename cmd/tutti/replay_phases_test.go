package main

import (
	"bytes"
	"strings"
	"testing"
)

// The summary ends with a time line per backend (where its wall time
// went), the progress lines on a pipe carry the same breakdown, and
// --gpu-prefill-every below 1 is a usage error.
func TestReplayTimeLines(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"replay", "--workload", "conversation", "--requests", "12", "--no-ceiling", "--compute", "sim", "--gpu-prefill-every", "4",
		"--dir", t.TempDir(), "--out", t.TempDir(), "--backends", "tutti-cpu,dram,recompute"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, b := range []string{"tutti-cpu", "dram", "recompute"} {
		if !strings.Contains(stdout.String(), "time "+b) {
			t.Fatalf("no time line for %s:\n%s", b, stdout.String())
		}
	}
	if !strings.Contains(stdout.String(), "| harness ") || !strings.Contains(stderr.String(), "12/12 wall ") {
		t.Fatalf("no breakdown:\n%s\n%s", stdout.String(), stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"replay", "--gpu-prefill-every", "0", "--no-ceiling"}, &stdout, &stderr); code == 0 ||
		!strings.Contains(stderr.String(), "--gpu-prefill-every 0") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}
