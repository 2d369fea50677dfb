package harness

import (
	"context"
	"errors"
	"sort"
	"testing"

	"github.com/tutti-io/tutti/eval/model"
)

// Several rounds: every backend runs each round, its row is its median
// round by rate at SLO and carries every round; a replay cancelled during
// round 2 still reports what finished.
func TestRounds(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, err := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	if err != nil {
		t.Fatal(err)
	}
	reqs := synthetic(12)
	var order []string
	cfg := Config{Requests: reqs, Profile: p, Dir: t.TempDir(), Backends: []Backend{NewDRAM(), NewLMCacheDisk(), Recompute{}},
		Compute: comp, CeilingBytes: -1, Rounds: 3,
		Progress: func(b string, done, total int) {
			if done == total {
				order = append(order, b)
			}
		}}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"dram", "lmcache-disk", "recompute", "lmcache-disk", "recompute", "dram", "recompute", "dram", "lmcache-disk"}
	if len(order) != len(want) {
		t.Fatalf("ran %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("ran %v, want %v (interleaved, rotated)", order, want)
		}
	}
	if len(res.Backends) != 3 {
		t.Fatalf("%d rows, want one per backend", len(res.Backends))
	}
	for _, b := range res.Backends {
		if b.Rounds == nil || len(b.Rounds.MaxRateAtSLO) != 3 {
			t.Fatalf("%s: rounds %+v", b.Backend, b.Rounds)
		}
		rates := append([]float64(nil), b.Rounds.MaxRateAtSLO...)
		sort.Float64s(rates)
		if b.MaxRateAtSLO != rates[1] {
			t.Fatalf("%s: row rate %v is not the median of %v", b.Backend, b.MaxRateAtSLO, rates)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	runs := 0
	cfg.Progress = func(b string, done, total int) {
		if done == total {
			if runs++; runs == 4 {
				cancel()
			}
		}
	}
	res, err = Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) || res == nil || len(res.Backends) != 3 {
		t.Fatalf("cancelled in round 2: %v, %d rows", err, len(res.Backends))
	}
	for _, b := range res.Backends {
		if n := len(b.Rounds.MaxRateAtSLO); (b.Backend == "lmcache-disk") != (n == 2) {
			t.Fatalf("%s: %d rounds reported", b.Backend, n)
		}
	}
}
