package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSplitStorePaths(t *testing.T) {
	for _, c := range []struct {
		in             string
		kernels, store []string
	}{
		{"gpu,store-cpu, uring,store-gpu", []string{"gpu", "uring"}, []string{"store-cpu", "store-gpu"}},
		{"store-cpu", nil, []string{"store-cpu"}},
		{"gpu-kick,,per-block", []string{"gpu-kick", "per-block"}, nil},
	} {
		k, s := splitStorePaths(c.in)
		if !slices.Equal(k, c.kernels) || !slices.Equal(s, c.store) {
			t.Errorf("%q: %v %v, want %v %v", c.in, k, s, c.kernels, c.store)
		}
	}
}

// TestGPUBenchStoreCPU runs `gpubench --paths store-cpu` as a user does on a
// machine without a GPU: rows for the save and the restore, in the JSON too.
func TestGPUBenchStoreCPU(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "rows.json")
	var out, errb bytes.Buffer
	err := runGPUBench([]string{"--paths", "store-cpu", "--dir", dir, "--model", "tiny", "--tokens", "2048", "--no-ceiling", "--json", js}, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out.String(), errb.String())
	}
	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d JSON rows:\n%s", len(lines), data)
	}
	for i, op := range []string{"save", "restore"} {
		var r struct {
			Path, Op   string
			Blocks     int
			Mismatches uint64
		}
		if err := json.Unmarshal([]byte(lines[i]), &r); err != nil {
			t.Fatal(err)
		}
		if r.Path != "store-cpu" || r.Op != op || r.Blocks != 4 || r.Mismatches != 0 {
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
