package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval"
	"github.com/tutti-io/tutti/eval/harness"
	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/trace"
)

// TestReplayGroup replays a short window of the embedded trace through
// tutti-cpu over 2 tensor-parallel ranks (what `tutti replay --gpus 2`
// runs): every request served, every restored byte verified against what
// was saved (after joining the ranks' shards), hits restored.
func TestReplayGroup(t *testing.T) {
	prof, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	reqs, _, err := trace.ReadAll(bytes.NewReader(eval.DefaultWindow), trace.Options{BlockTokens: trace.DefaultBlockTokens},
		trace.Window{First: 25})
	if err != nil {
		t.Fatal(err)
	}
	trace.Rebase(reqs)
	trace.Spread(reqs, 0)
	comp, err := harness.NewCompute(prof, harness.DefaultGPUFLOPs, harness.DefaultLayerFixedNs)
	if err != nil {
		t.Fatal(err)
	}
	bs, err := tpBackends([]harness.Backend{harness.NewTuttiCPU(nil), harness.NewDRAM()}, 2, nil, prof)
	if err != nil {
		t.Fatal(err)
	}
	if bs[0].Name() != "tutti-cpu-tp2" || bs[1].Name() != "dram" {
		t.Fatalf("backends %s, %s", bs[0].Name(), bs[1].Name())
	}
	res, err := harness.Run(context.Background(), harness.Config{Requests: reqs, Profile: prof, Dir: t.TempDir(),
		Backends: bs[:1], QueueDepth: 16, Compute: comp, CeilingBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	b := res.Backends[0]
	t.Logf("%s: hit ratio %.3f, %d requests with hits, restored %d bytes, %d mismatches", b.Backend, b.HitRatio, b.RequestsWithHitsRestore, b.RestoredBytes, b.VerifyMismatches)
	if b.Skipped != "" || b.Requests != len(reqs) || b.VerifyMismatches != 0 || b.RestoredBytes == 0 || b.RequestsWithHitsRestore == 0 {
		t.Fatalf("%+v", b)
	}
	for _, tc := range []struct {
		bs   []harness.Backend
		gpus int
		err  string
	}{
		{[]harness.Backend{harness.NewDRAM()}, 2, "not among the backends"},
		{[]harness.Backend{harness.NewTuttiCPU(nil)}, 4, "2 KV heads cannot be split evenly over 4 ranks"},
		{[]harness.Backend{harness.NewTuttiCPU(nil)}, 0, "--gpus 0: must be in [1, 64]"},
	} {
		if _, err := tpBackends(tc.bs, tc.gpus, nil, prof); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Fatalf("--gpus %d: %v, want %q", tc.gpus, err, tc.err)
		}
	}
	if same, err := tpBackends(bs[1:], 1, nil, prof); err != nil || len(same) != 1 || same[0] != bs[1] {
		t.Fatalf("--gpus 1 changed the backends: %v", err)
	}
}
