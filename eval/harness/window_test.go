package harness

import (
	"strings"
	"testing"

	"github.com/tutti-io/tutti/internal/trace"
)

func chainReq(ids ...uint64) trace.Request {
	return trace.Request{InputTokens: len(ids) * 512, HashIDs: ids}
}

func TestAnalyzeWindowAndNotes(t *testing.T) {
	a, b := chainReq(1, 2, 3, 4), chainReq(5, 6, 7, 8)
	for _, tc := range []struct {
		name                string
		window              []trace.Request
		warm                []warmStep
		capBlocks           int
		hits, unbounded     int64
		warmHits            int64
		overCap             int
		note                string // a WindowNotes line contains it ("" = no reuse note)
		warmSetEvictedNote  bool
		shortAndLowerBounds bool
	}{
		{"no hit at all", []trace.Request{a, b}, nil, 0, 0, 0, 0, 0, "NO prefix hit", false, true},
		{"reuse fits", []trace.Request{a, b, a}, nil, 0, 4, 4, 0, 0, "", false, true},
		{"evicted before use", []trace.Request{a, b, a}, nil, 4, 0, 4, 0, 0, "evicted (leaf-first LRU) before use", false, true},
		{"partly evicted", []trace.Request{a, chainReq(5, 6), a}, nil, 5, 3, 4, 0, 0, "evicted blocks before the window used them", false, true},
		{"longer than the capacity", []trace.Request{a, a}, nil, 2, 2, 4, 0, 2, "evicted blocks before", false, true},
		{"warm hits", []trace.Request{a}, []warmStep{{chain: []uint64{1, 2}}}, 0, 2, 2, 2, 0, "", false, true},
		{"warm set evicted", []trace.Request{b, a}, []warmStep{{chain: []uint64{1, 2}}}, 4, 0, 2, 0, 0, "evicted (leaf-first LRU) before use", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := AnalyzeWindow(tc.window, tc.warm, tc.capBlocks)
			if u.Hits != tc.hits || u.UnboundedHits != tc.unbounded || u.WarmHits != tc.warmHits || u.OverCapacity != tc.overCap {
				t.Fatalf("reuse %+v, want hits %d, unbounded %d, warm %d, over capacity %d", u, tc.hits, tc.unbounded, tc.warmHits, tc.overCap)
			}
			res := &Result{Reuse: u, CapacityBlocks: tc.capBlocks, Trace: trace.Summarize(tc.window)}
			if tc.warm != nil {
				res.Warm = &WarmSummary{Blocks: u.WarmBlocks}
			}
			res.Backends = []BackendResult{{Backend: "x", MaxRateIsLowerBound: true}}
			notes := strings.Join(WindowNotes(res), "\n")
			if tc.note != "" && !strings.Contains(notes, tc.note) {
				t.Fatalf("notes %q lack %q", notes, tc.note)
			}
			if tc.note == "" && strings.Contains(notes, "hit") && !strings.Contains(notes, "warm") {
				t.Fatalf("notes %q speak of hits on a window that keeps its reuse", notes)
			}
			if got := strings.Contains(notes, "warm set"); got != tc.warmSetEvictedNote {
				t.Fatalf("notes %q: warm set evicted note %v, want %v", notes, got, tc.warmSetEvictedNote)
			}
			if tc.shortAndLowerBounds && (!strings.Contains(notes, "indicative only") || !strings.Contains(notes, "lower bound")) {
				t.Fatalf("notes %q do not say the window is short and the rate a lower bound", notes)
			}
		})
	}
}

func TestBelowNotes(t *testing.T) {
	res := &Result{Backends: []BackendResult{
		{Backend: "tutti-cpu", MaxRateAtSLO: 10, HitRatio: 0.1, BytesPerS: 1e9, DirectIO: true, RestoredBytes: 1 << 30},
		{Backend: "lmcache-disk", MaxRateAtSLO: 12, HitRatio: 0.2, BytesPerS: 2e9, RestoredBytes: 1 << 30, DeviceReadBytes: 1 << 20},
		{Backend: "vllm-fs", MaxRateAtSLO: 5, HitRatio: 0.2},
		{Backend: "dram", MaxRateAtSLO: 20, HitRatio: 0.1, BytesPerS: 9e9},
	}}
	got := strings.Join(BelowNotes(res), "\n")
	for _, want := range []string{"lmcache-disk's rate at SLO 12.000", "planner recomputed", "page cache", "2.00 GB/s", "one round only", "DRAM tier is the bound"} {
		if !strings.Contains(got, want) {
			t.Fatalf("notes %q lack %q", got, want)
		}
	}
	if strings.Contains(got, "vllm-fs") {
		t.Fatalf("notes %q explain a backend below tutti-cpu", got)
	}
	res.Backends[0].Rounds = &RoundFigures{MaxRateAtSLO: []float64{8, 10, 13}}
	res.Backends[1].Rounds = &RoundFigures{MaxRateAtSLO: []float64{11, 12, 14}}
	if got := strings.Join(BelowNotes(res), "\n"); !strings.Contains(got, "within the spread over 3 rounds") {
		t.Fatalf("notes %q do not say the rounds overlap", got)
	}
}
