package gpubench

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

// TestGroupBenchCPU runs the --gpus benchmark's logic on the CPU path (what
// the GPU path does there, minus the device copies): one rank and N ranks
// restore the same shape, verified, with the aggregate next to one rank.
func TestGroupBenchCPU(t *testing.T) {
	for _, g := range []kvshape.Geometry{
		{Layers: 3, KVHeads: 4, HeadDim: 32, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 1},
		{Layers: 2, KVHeads: 1, HeadDim: 72, DType: kvshape.BF16, Planes: 1, PageTokens: 16, ChunkPages: 1},
	} {
		var stderr bytes.Buffer
		rows := runGroupBench(context.Background(), groupBenchOptions{model: "test", g: g, layout: kvshape.LayoutPerLayer, tokens: 1024,
			dirs: []string{t.TempDir()}, ranks: 4, path: runtime.PathCPU, seed: 9, reps: 2,
			stagingBytes: 1 << 20, slotBytes: 256 << 10}, &stderr)
		if len(rows) != 2 || rows[0].Ranks != 1 || rows[1].Ranks != 4 {
			t.Fatalf("rows %+v", rows)
		}
		for _, r := range rows {
			if r.Error != "" || r.Mismatches != 0 || r.BytesPerS <= 0 || r.IOs == 0 || len(r.RankSeconds) != r.Ranks {
				t.Fatalf("%+v (%s)", r, stderr.String())
			}
		}
		if rows[0].XSingle != 1 || rows[1].XSingle <= 0 {
			t.Fatalf("x single: %v %v", rows[0].XSingle, rows[1].XSingle)
		}
	}
	// Refusals: heads that do not split, no directory.
	var out, errb bytes.Buffer
	if err := runGroupBenchCLI(context.Background(), Config{Model: "llama3-70b", Tokens: 1024, Dir: t.TempDir(), Layout: "per-layer", Seed: 1, GPUs: 3}, &out, &errb); err == nil ||
		!strings.Contains(err.Error(), "8 KV heads cannot be split evenly over 3 ranks") {
		t.Fatalf("3 ranks: %v", err)
	}
	if err := runGroupBenchCLI(context.Background(), Config{Model: "llama3-70b", Tokens: 1024, Layout: "per-layer", Seed: 1, GPUs: 2}, &out, &errb); err == nil || !strings.Contains(err.Error(), "--dir") {
		t.Fatalf("no dir: %v", err)
	}
}

// TestRankDirs: the one-rank and the n-rank run use the same directories.
func TestRankDirs(t *testing.T) {
	for _, tc := range []struct {
		dirs []string
		n    int
		want string
	}{
		{[]string{"a", "b", "c", "d"}, 1, "[[a b c d]]"},
		{[]string{"a", "b", "c", "d"}, 2, "[[a c] [b d]]"},
		{[]string{"a", "b", "c"}, 2, "[[a c] [b]]"},
		{[]string{"a"}, 2, "[[a] [a]]"},
		{[]string{"a", "b"}, 4, "[[a] [b] [a] [b]]"},
	} {
		if got := fmt.Sprint(rankDirs(tc.dirs, tc.n)); got != tc.want {
			t.Errorf("rankDirs(%v, %d) = %s, want %s", tc.dirs, tc.n, got, tc.want)
		}
	}
}
