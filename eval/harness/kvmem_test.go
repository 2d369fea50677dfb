package harness

import (
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

// TestAllocConsecutive: a request's pages are one run of consecutive ids
// on a fresh memory and again after the previous request's release, so the
// GPU path's clears and copies over them (pageRuns) are one call per layer
// and plane, not one per page (descending ids made every page its own run:
// 322 s of tutti-gpu's 354 s replay went to per-page cudaMemset and copies).
func TestAllocConsecutive(t *testing.T) {
	g := kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 4}
	kv, err := NewKVMemory(g, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Free()
	for _, n := range []int{12, 12, 20, 8, 64} {
		pages, err := kv.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		if err := pageRuns(pages, func(first int32, k int) error { runs++; return nil }); err != nil {
			t.Fatal(err)
		}
		if runs != 1 {
			t.Fatalf("Alloc(%d) = %v: %d runs of consecutive ids, want 1", n, pages, runs)
		}
		kv.Release(pages)
	}
	if _, err := kv.Alloc(65); err == nil {
		t.Fatal("Alloc(65) of 64 pages succeeded")
	}
}
