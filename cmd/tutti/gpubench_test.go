package main

import (
	"bytes"
	"strings"
	"testing"

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
