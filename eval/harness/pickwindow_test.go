package harness

import (
	"testing"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/trace"
)

// A trace whose only reuse is request 6 repeating request 1's prefix: the
// picker's best window starts where that reuse is reachable from the
// history, and a GPU bound that no window meets leaves none.
func TestPickWindows(t *testing.T) {
	p, _ := model.Lookup("tiny")
	var all []trace.Request
	for i := 0; i < 10; i++ {
		ids := []uint64{uint64(100 + i), uint64(200 + i)}
		if i == 6 {
			ids = []uint64{101, 201, 999}
		}
		all = append(all, trace.Request{Line: i + 1, TimestampMs: float64(i * 1000), InputTokens: len(ids) * 512, HashIDs: ids})
	}
	got := PickWindows(all, p, PickOptions{MinRequests: 2, MaxRequests: 3, WarmMs: 10000, Top: 3})
	if len(got) == 0 {
		t.Fatal("no window")
	}
	best := got[0]
	if best.Reuse.WarmHits != 2 || best.FromMs > 6000 || best.FromMs+float64(best.Requests-1)*1000 < 6000 || best.FromMs <= 1000 {
		t.Fatalf("best window %+v: want one holding request 7 (line) after the history holding line 2", best)
	}
	// Cold, only a window holding both requests 2 and 7 has a hit.
	if cold := PickWindows(all, p, PickOptions{MinRequests: 2, MaxRequests: 3, Top: 1}); len(cold) != 1 || cold[0].Reuse.Hits != 0 {
		t.Fatalf("cold windows of 3 requests: best %+v, want no hit", cold)
	}
	if cold := PickWindows(all, p, PickOptions{MinRequests: 6, MaxRequests: 6, Top: 1}); len(cold) != 1 || cold[0].Reuse.Hits != 2 || cold[0].FromMs != 1000 {
		t.Fatalf("cold windows of 6 requests: best %+v, want the one from line 2 with 2 hits", cold)
	}
	if none := PickWindows(all, p, PickOptions{MinRequests: 2, MaxRequests: 3, GPUFLOPs: 1, MaxGPUSeconds: 1}); len(none) != 0 {
		t.Fatalf("a bound no window meets left %d", len(none))
	}
}
