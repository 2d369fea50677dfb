package harness

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/internal/trace"
	"github.com/tutti-io/tutti/kvshape"
)

func req(line int, ts float64, ids ...uint64) trace.Request {
	return trace.Request{Line: line, TimestampMs: ts, ArrivalMs: ts, InputTokens: len(ids) * 512, HashIDs: ids}
}

// TestPlanWarm: a history block counts only where the history's chain up to
// it is a window chain up to it; steps keep the history's order; the shared
// index's replay of them gives the saves, evictions and residents.
func TestPlanWarm(t *testing.T) {
	window := []trace.Request{req(10, 1000, 1, 2, 3, 4), req(11, 1001, 1, 7, 8), req(12, 1002, 20, 21)}
	for _, tc := range []struct {
		name     string
		history  []trace.Request
		capacity int
		chains   [][]uint64
		blocks   int64
		saves    int64
		evicted  int64
		resident int
		note     string
	}{
		{name: "no history", capacity: 100, note: "started cold"},
		{name: "nothing shared", history: []trace.Request{req(1, 10, 9, 9), req(2, 11, 2, 3)}, capacity: 100, note: "none of the 2 history requests"},
		{
			name: "prefixes cut where the chain leaves the window's",
			// 1,2,3 matches; 1,5,3: only 1 (3 under 5 is another prefix); 20 matches
			history:  []trace.Request{req(1, 10, 1, 2, 3, 99), req(2, 11, 1, 5, 3), req(3, 12, 20), req(4, 13, 30, 20)},
			capacity: 100, chains: [][]uint64{{1, 2, 3}, {1}, {20}}, blocks: 4, saves: 4, resident: 4, note: "started WARM",
		},
		{
			name: "capacity evicts the least recently referenced, leaf first",
			// 4 blocks; 1,7,8 evicts 4 then 3 (leaves of the least recent
			// branch); 1,2 touches; 1,2,3 evicts 8 and saves 3 again
			history:  []trace.Request{req(1, 10, 1, 2, 3, 4), req(2, 11, 1, 7, 8), req(3, 12, 1, 2), req(4, 13, 1, 2, 3)},
			capacity: 4, chains: [][]uint64{{1, 2, 3, 4}, {1, 7, 8}, {1, 2}, {1, 2, 3}},
			blocks: 6, saves: 4 + 2 + 1, evicted: 3, resident: 4, note: "evicted 3 blocks",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &Warm{DurationMs: 1000, FromMs: 0, ToMs: 1000, History: tc.history}
			steps, sum := planWarm(w, window, 512, tc.capacity, 10)
			var chains [][]uint64
			for _, s := range steps {
				chains = append(chains, s.chain)
				if s.req.InputTokens > len(s.chain)*512 {
					t.Fatalf("step %v: %d input tokens", s.chain, s.req.InputTokens)
				}
			}
			want := tc.chains
			if !reflect.DeepEqual(chains, want) {
				t.Fatalf("chains %v, want %v", chains, want)
			}
			if sum.Blocks != tc.blocks || sum.Bytes != tc.blocks*10 || sum.Saves != tc.saves || sum.EvictedBlocks != tc.evicted ||
				sum.Resident != tc.resident || sum.UsedRequests != len(want) || sum.HistoryRequests != len(tc.history) {
				t.Fatalf("%+v", sum)
			}
			if !strings.Contains(sum.Note, tc.note) {
				t.Fatalf("note %q, want %q in it", sum.Note, tc.note)
			}
		})
	}
}

// splitSynthetic returns a history and a window of synthetic requests: the
// window's requests extend the history's chains (synthetic: request i
// extends request i/2), so the window references history blocks.
func splitSynthetic(n int) (history, window []trace.Request) {
	all := synthetic(n)
	return all[:n/2], all[n/2:]
}

// TestWarmStart replays the same window cold and warm through every CPU
// backend: warm hits at least as many blocks (more for every caching
// backend), every restored byte of a warm block verified, every backend
// served the same requests, the O_DIRECT backends' device counters cover
// their restores, and nothing of the warm-up is in the window's figures. A
// capacity below the warm set evicts during the warm-up, and says so.
func TestWarmStart(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, err := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	if err != nil {
		t.Fatal(err)
	}
	history, window := splitSynthetic(32)
	backends := func() []Backend {
		return []Backend{NewTuttiCPU(nil), NewPerBlock(), NewCuFileStandIn(), NewPageCache(), NewDRAM(), Recompute{}}
	}
	var refs int64
	for _, r := range window {
		refs += int64(len(r.HashIDs))
	}
	for _, capBlocks := range []int{0, 10} { // everything fits; below the warm set
		run := func(warm *Warm) *Result {
			reqs := append([]trace.Request(nil), window...)
			trace.Rebase(reqs)
			res, err := Run(context.Background(), Config{Requests: reqs, Profile: p, Dir: t.TempDir(), CapacityBlocks: capBlocks,
				Backends: backends(), Compute: comp, EBPF: true, CeilingBytes: -1, Warm: warm})
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		cold := run(nil)
		warm := run(&Warm{DurationMs: 2000, FromMs: history[0].TimestampMs, ToMs: window[0].TimestampMs, History: history})
		ws := warm.Warm
		if cold.Warm != nil || ws == nil || ws.Blocks == 0 || ws.UsedRequests == 0 || !strings.Contains(ws.Note, "WARM") {
			t.Fatalf("cap %d: warm summary %+v", capBlocks, ws)
		}
		if capBlocks > 0 && (int64(capBlocks) >= ws.Blocks || ws.EvictedBlocks == 0 || !strings.Contains(ws.Note, "evicted")) {
			t.Fatalf("cap %d below the %d warm blocks: %+v", capBlocks, ws.Blocks, ws)
		}
		if capBlocks == 0 && (ws.EvictedBlocks != 0 || ws.Saves != ws.Blocks || int64(ws.Resident) != ws.Blocks) {
			t.Fatalf("everything fits, yet %+v", ws)
		}
		t.Logf("cap %d: %s", capBlocks, ws.Note)
		var hits []int64
		for i, w := range warm.Backends {
			c := cold.Backends[i]
			if w.Skipped != "" || c.Skipped != "" {
				t.Fatalf("%s skipped: %s %s", w.Backend, w.Skipped, c.Skipped)
			}
			// The window only: the same requests, arrivals and hit denominator.
			if w.Requests != len(window) || len(w.Services) != len(window) || len(w.TTFTms) != len(window) {
				t.Fatalf("%s: %d requests, %d services", w.Backend, w.Requests, len(w.Services))
			}
			for k := range w.Services {
				if w.Services[k].ArrivalMs != c.Services[k].ArrivalMs {
					t.Fatalf("%s: request %d arrives at %v warm, %v cold", w.Backend, k, w.Services[k].ArrivalMs, c.Services[k].ArrivalMs)
				}
			}
			if w.VerifyMismatches != 0 || w.Fallbacks != 0 || w.WarmFallbacks != 0 {
				t.Fatalf("%s: %d mismatches, %d fallbacks, %d warm-up fallbacks", w.Backend, w.VerifyMismatches, w.Fallbacks, w.WarmFallbacks)
			}
			if w.HitRatio < c.HitRatio || w.HitRatio != float64(w.HitBlocks)/float64(refs) {
				t.Fatalf("%s: hit ratio %.3f warm, %.3f cold (%d hit blocks of %d)", w.Backend, w.HitRatio, c.HitRatio, w.HitBlocks, refs)
			}
			if w.DirectIO && w.DeviceReadBytes < uint64(w.RestoredBytes) {
				t.Fatalf("%s: device read %d < restored %d (%s)", w.Backend, w.DeviceReadBytes, w.RestoredBytes, w.DeviceBytesSource)
			}
			t.Logf("cap %d %s: hit ratio %.3f warm / %.3f cold; warm-up %d blocks %.3f s, evicted %d; saved in the window %d / %d bytes; %s",
				capBlocks, w.Backend, w.HitRatio, c.HitRatio, w.WarmSavedBlocks, w.WarmSeconds, w.WarmEvictedBlocks, w.SavedBytes, c.SavedBytes, w.WarmNote)
			if w.Backend == "recompute" {
				if w.WarmSavedBlocks != 0 || w.HitBlocks != 0 {
					t.Fatalf("recompute warmed: %+v", w)
				}
				continue
			}
			if w.HitRatio <= c.HitRatio || w.WarmSavedBlocks < min(ws.Blocks, int64(max(capBlocks, 1))) || w.WarmSavedBytes != w.WarmSavedBlocks*p.BlockBytes() {
				t.Fatalf("%s: hit ratio %.3f warm / %.3f cold, warm-up saved %d blocks (%d bytes) of %d", w.Backend, w.HitRatio, c.HitRatio,
					w.WarmSavedBlocks, w.WarmSavedBytes, ws.Blocks)
			}
			if w.Backend == "tutti-cpu" {
				continue // its own index: its own admission
			}
			hits = append(hits, w.HitBlocks)
			if w.RestoredBytes != w.HitBlocks*p.BlockBytes() || w.WarmSavedBlocks != ws.Saves || w.WarmEvictedBlocks != ws.EvictedBlocks {
				t.Fatalf("%s: restored %d bytes for %d blocks; warm-up saved %d evicted %d, the shared index %d and %d",
					w.Backend, w.RestoredBytes, w.HitBlocks, w.WarmSavedBlocks, w.WarmEvictedBlocks, ws.Saves, ws.EvictedBlocks)
			}
			// Warm blocks are not saved again in the window: the window's
			// saves are the cold run's less the warm set.
			if capBlocks == 0 && w.SavedBytes != c.SavedBytes-w.WarmSavedBytes {
				t.Fatalf("%s: saved %d bytes in the window, cold %d, warm-up %d", w.Backend, w.SavedBytes, c.SavedBytes, w.WarmSavedBytes)
			}
			if w.Backend == "pagecache" && !strings.Contains(w.WarmNote, "dropped from the page cache") {
				t.Fatalf("pagecache: %s", w.WarmNote)
			}
		}
		for _, h := range hits {
			if h != hits[0] {
				t.Fatalf("cap %d: hit blocks differ between the shared-index backends: %v", capBlocks, hits)
			}
		}
	}
}

// TestWarmNoHistory: a window at the trace's start has no history; asking
// for a warm start is then a no-op that says so.
func TestWarmNoHistory(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, _ := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	reqs := synthetic(12)
	res, err := Run(context.Background(), Config{Requests: reqs, Profile: p, Dir: t.TempDir(), Compute: comp, CeilingBytes: -1,
		Backends: []Backend{NewDRAM(), NewPageCache()}, Warm: &Warm{DurationMs: 5000, FromMs: -5000, ToMs: 0}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Warm == nil || res.Warm.Blocks != 0 || !strings.Contains(res.Warm.Note, "started cold") {
		t.Fatalf("%+v", res.Warm)
	}
	for _, b := range res.Backends {
		if b.WarmSavedBlocks != 0 || !strings.Contains(b.WarmNote, "started cold") || b.HitBlocks == 0 {
			t.Fatalf("%s: %+v", b.Backend, b)
		}
	}
}

// TestSettleFiles: after the drop, none of a written file's pages is in the
// page cache (where the file system honours DONTNEED; tmpfs does not).
func TestSettleFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.kv"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "a.kv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before, err := residentBytes(f)
	if err != nil {
		t.Fatal(err)
	}
	synced, dropped, after, err := settleFiles([]string{dir}, true)
	if err != nil || synced != 1 || dropped != 1 {
		t.Fatalf("synced %d dropped %d: %v", synced, dropped, err)
	}
	t.Logf("resident before %d bytes, after %d", before, after)
	if before > 0 && after >= before {
		t.Fatalf("resident %d bytes before the drop, %d after", before, after)
	}
}

// TestFillVerifyParallel: blocks large enough to fill and verify one layer
// per goroutine give the same bytes and the same count of bad pages.
func TestFillVerifyParallel(t *testing.T) {
	g := kvshape.Geometry{Layers: 6, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 32}
	kv, err := NewKVMemory(g, 2*g.ChunkPages)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Free()
	if int64(g.ChunkPages)*g.PageBytesPerLayer()*int64(g.Layers) < parallelBlockBytes {
		t.Fatal("the shape does not take the parallel path")
	}
	pages, _ := kv.Alloc(2 * g.ChunkPages)
	a, b := pages[:g.ChunkPages], pages[g.ChunkPages:]
	kv.FillBlock(7, a)
	for l := 0; l < g.Layers; l++ { // the sequential reference
		for p := 0; p < g.Planes; p++ {
			for i, pg := range b {
				kvdata.Fill(kv.Page(l, p, pg), PageKey(7, l, p, i))
			}
		}
	}
	for l := 0; l < g.Layers; l++ {
		for p := 0; p < g.Planes; p++ {
			for i := range a {
				if !bytes.Equal(kv.Page(l, p, a[i]), kv.Page(l, p, b[i])) {
					t.Fatalf("layer %d plane %d page %d differs", l, p, i)
				}
			}
		}
	}
	if bad := kv.VerifyBlock(7, a); bad != 0 {
		t.Fatalf("%d bad pages", bad)
	}
	kv.Page(3, 1, a[5])[100] ^= 1
	kv.Page(5, 0, a[0])[0] ^= 1
	if bad := kv.VerifyBlock(7, a); bad != 2 {
		t.Fatalf("%d bad pages, want 2", bad)
	}
	if bad := kv.VerifyBlock(8, b); bad != g.Layers*g.Planes*g.ChunkPages {
		t.Fatalf("another block's id: %d bad pages", bad)
	}
}
