package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReplayStripedDirs: replay --dir a,b,c runs every CPU backend over the
// three dirs (each backend's files in all of them), verifies, and puts the
// storage label into every JSON row and the report; a bad --dir is a usage
// error that names the entry.
func TestReplayStripedDirs(t *testing.T) {
	roots := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	out := t.TempDir()
	const label = "three temp dirs (test)"
	var stdout, stderr bytes.Buffer
	code := run([]string{"replay", "--workload", "conversation", "--requests", "20", "--json", "--no-ceiling", "--keep",
		"--dir", strings.Join(roots, ","), "--storage-label", label, "--out", out,
		"--backends", "tutti-cpu,per-block,cufile,pagecache,dram,recompute"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rows []struct {
		Backend          string `json:"backend"`
		Storage          string `json:"storage"`
		Requests         int    `json:"requests"`
		VerifyMismatches int64  `json:"verify_mismatches"`
		HitBlocks        int64  `json:"hit_blocks"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if len(rows) != 6 {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		if r.Storage != label || r.Requests != 20 || r.VerifyMismatches != 0 {
			t.Fatalf("%+v", r)
		}
		if r.Backend == "dram" || r.Backend == "recompute" {
			continue
		}
		for _, root := range roots {
			ents, err := os.ReadDir(filepath.Join(root, r.Backend))
			if err != nil || len(ents) == 0 {
				t.Fatalf("%s: no file in %s (%v)", r.Backend, root, err)
			}
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), label) || !strings.Contains(string(md), roots[2]) {
		t.Fatal("report does not name the storage label and every dir")
	}

	stderr.Reset()
	if code := run([]string{"replay", "--dir", roots[0] + ",," + roots[1], "--no-ceiling"}, &stdout, &stderr); code == 0 ||
		!strings.Contains(stderr.String(), "entry 2 is empty") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

func TestShellJoin(t *testing.T) {
	got := shellJoin([]string{"--dir", "/m0,/m1", "--storage-label", "emulated storage (4 loops)", "it's", ""})
	want := `--dir /m0,/m1 --storage-label 'emulated storage (4 loops)' 'it'\''s' ''`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}
