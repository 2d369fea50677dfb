package model

import (
	"math"
	"testing"
)

func TestKVBytesPerToken(t *testing.T) {
	for _, tc := range []struct {
		name      string
		perToken  int64
		pagePlane int64
	}{
		{"llama3-8b", 32 * 2 * 8 * 128 * 2, 16 * 8 * 128 * 2},  // 128 KiB
		{"llama3-70b", 80 * 2 * 8 * 128 * 2, 16 * 8 * 128 * 2}, // 320 KiB
		{"qwen3-32b", 64 * 2 * 8 * 128 * 2, 16 * 8 * 128 * 2},  // 256 KiB
		{"deepseek-v3", 61 * 1 * 1 * 576 * 2, 16 * 576 * 2},    // 68.6 KiB
		{"tiny", 2 * 2 * 2 * 64 * 2, 4096},
	} {
		p, err := Lookup(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		if got := p.KVBytesPerToken(); got != tc.perToken {
			t.Errorf("%s: KV bytes per token %d, want %d", tc.name, got, tc.perToken)
		}
		if got := p.PageBytesPerPlane(); got != tc.pagePlane {
			t.Errorf("%s: page bytes per plane %d, want %d", tc.name, got, tc.pagePlane)
		}
		if got := p.BlockBytes(); got != 512*tc.perToken || p.BlockTokens() != 512 {
			t.Errorf("%s: block bytes %d (%d tokens)", tc.name, got, p.BlockTokens())
		}
	}
	p, _ := Lookup("llama3-70b")
	if p.KVBytesPerToken() != 320<<10 {
		t.Fatalf("llama3-70b: %d, want 320 KiB", p.KVBytesPerToken())
	}
}

func TestPrefillFLOPs(t *testing.T) {
	p, _ := Lookup("llama3-8b")
	// Sum of per-token costs equals the closed form.
	var sum float64
	for pos := 100; pos < 150; pos++ {
		sum += p.PrefillFLOPsPerToken(pos)
	}
	if got := p.PrefillFLOPs(100, 50); math.Abs(got-sum)/sum > 1e-12 {
		t.Fatalf("closed form %g, summed %g", got, sum)
	}
	// The linear term dominates short contexts: about 2*params per token.
	if got := p.PrefillFLOPsPerToken(0) / 16.06e9; got < 1 || got > 1.01 {
		t.Fatalf("per-token FLOPs at pos 0 = %g x 2*params", got)
	}
	// Llama-3-8B attention: 32 layers * 32 heads * 2 * (128+128) = 524288 FLOPs per context token.
	if got := p.AttnFLOPsPerContextToken(); got != 524288 {
		t.Fatalf("attention FLOPs per context token %g", got)
	}
	if p.PrefillFLOPs(10, 0) != 0 {
		t.Fatal("no new tokens must cost nothing")
	}
	// Loading a prefix saves work: prefill of the suffix is cheaper than of the whole.
	if !(p.PrefillFLOPs(4096, 512) < p.PrefillFLOPs(0, 4608)) {
		t.Fatal("suffix prefill not cheaper than the whole")
	}
	if d, _ := Lookup("deepseek-v3"); d.LinearFLOPsPerToken() != 74e9 {
		t.Fatalf("deepseek-v3 uses activated params: %g", d.LinearFLOPsPerToken())
	}
}

func TestLookupUnknown(t *testing.T) {
	if _, err := Lookup("gpt-5"); err == nil {
		t.Fatal("want error")
	}
	if len(Names()) != 5 {
		t.Fatalf("names %v", Names())
	}
}

func TestGeometry(t *testing.T) {
	for _, n := range Names() {
		p, _ := Lookup(n)
		g, err := p.Geometry()
		if err != nil {
			t.Fatal(err)
		}
		if g.ChunkBytes() != p.BlockBytes() || g.PageBytesPerPlane() != p.PageBytesPerPlane() {
			t.Fatalf("%s: geometry %v chunk %d, profile block %d", n, g, g.ChunkBytes(), p.BlockBytes())
		}
	}
}
