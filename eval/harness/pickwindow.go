package harness

import (
	"sort"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/trace"
)

// PickOptions bound the windows PickWindows considers (replay
// --pick-window; the Go home of what eval/warm-windows.py did for the
// conversation trace, for any trace).
type PickOptions struct {
	MinRequests, MaxRequests int     // window sizes tried (1 ≤ min ≤ max ≤ 4096)
	WarmMs                   float64 // history before each window (0: cold)
	CapacityBlocks           int     // ≤ 0: every distinct block of window and warm set fits
	MaxKVBytes               int64   // a window whose longest request needs more is skipped (0: no bound)
	MaxDistinctBytes         int64   // a window whose distinct blocks need more is skipped (0: no bound)
	// MaxGPUSeconds bounds the prefill work of one replay: CachingBackends
	// prefill their misses, recompute everything, at GPUFLOPs (0: no bound).
	MaxGPUSeconds   float64
	GPUFLOPs        float64
	CachingBackends int
	MaxStarts       int // window starts tried, spread evenly over the trace's buckets (0: 2000)
	Top             int // candidates returned (0: 5)
}

// WindowCandidate is one window PickWindows scored.
type WindowCandidate struct {
	FromMs        float64 // the window's first timestamp (replay --from-ms)
	Line          int     // its first trace line
	Requests      int     // replay --requests
	Reuse         WindowReuse
	DistinctBytes int64
	MaxKVBytes    int64
	GPUSeconds    float64 // the prefill work PickOptions bounds
	HitRatio      float64 // Reuse.Hits / Reuse.BlockRefs
}

// PickWindows scores windows of all (a whole parsed trace, in trace order,
// timestamps as in the trace) that start at a timestamp bucket and hold
// MinRequests..MaxRequests requests, and returns the best within the
// bounds: most hits from the warm set, then most hits, then least GPU work.
func PickWindows(all []trace.Request, p model.Profile, o PickOptions) []WindowCandidate {
	if o.MinRequests < 1 {
		o.MinRequests = 1
	}
	o.MaxRequests = min(max(o.MaxRequests, o.MinRequests), 4096)
	if o.MaxStarts <= 0 {
		o.MaxStarts = 2000
	}
	if o.Top <= 0 {
		o.Top = 5
	}
	var starts []int
	for i := range all {
		if i == 0 || all[i].TimestampMs > all[i-1].TimestampMs {
			starts = append(starts, i)
		}
	}
	if n := len(starts); n > o.MaxStarts {
		picked := make([]int, 0, o.MaxStarts)
		for k := 0; k < o.MaxStarts; k++ {
			picked = append(picked, starts[k*n/o.MaxStarts])
		}
		starts = picked
	}
	blockBytes := p.BlockBytes()
	var out []WindowCandidate
	for _, s := range starts {
		ts0 := all[s].TimestampMs
		var hist []trace.Request
		if o.WarmMs > 0 {
			h := s
			for h > 0 && all[h-1].TimestampMs >= ts0-o.WarmMs {
				h--
			}
			hist = all[h:s]
		}
		for n := o.MinRequests; n <= o.MaxRequests && s+n <= len(all); n++ {
			win := all[s : s+n]
			var steps []warmStep
			if len(hist) > 0 {
				steps, _ = planWarm(&Warm{History: hist}, win, p.BlockTokens(), 1<<30, blockBytes)
			}
			u := AnalyzeWindow(win, steps, o.CapacityBlocks)
			c := WindowCandidate{FromMs: ts0, Line: all[s].Line, Requests: n, Reuse: u,
				DistinctBytes: u.Distinct * blockBytes, MaxKVBytes: int64(u.MaxBlocks) * blockBytes}
			if u.BlockRefs > 0 {
				c.HitRatio = float64(u.Hits) / float64(u.BlockRefs)
			}
			if o.GPUFLOPs > 0 {
				c.GPUSeconds = windowFLOPs(win, p, u, o.CachingBackends) / o.GPUFLOPs
			}
			if (o.MaxKVBytes > 0 && c.MaxKVBytes > o.MaxKVBytes) || (o.MaxDistinctBytes > 0 && c.DistinctBytes > o.MaxDistinctBytes) ||
				(o.MaxGPUSeconds > 0 && c.GPUSeconds > o.MaxGPUSeconds) {
				continue
			}
			out = append(out, c)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Reuse.WarmHits != b.Reuse.WarmHits {
			return a.Reuse.WarmHits > b.Reuse.WarmHits
		}
		if a.Reuse.Hits != b.Reuse.Hits {
			return a.Reuse.Hits > b.Reuse.Hits
		}
		return a.GPUSeconds < b.GPUSeconds
	})
	return out[:min(len(out), o.Top)]
}

// windowFLOPs is the prefill work of one replay of win: caching backends
// prefill what they miss (their hits spread as the shared index gives them,
// approximated by the window's hit ratio per request), recompute prefills
// everything.
func windowFLOPs(win []trace.Request, p model.Profile, u WindowReuse, caching int) float64 {
	ratio := 0.0
	if u.BlockRefs > 0 {
		ratio = float64(u.Hits) / float64(u.BlockRefs)
	}
	var full, miss float64
	for _, r := range win {
		full += p.PrefillFLOPs(0, r.InputTokens)
		cached := int(ratio * float64(r.InputTokens))
		miss += p.PrefillFLOPs(cached, r.InputTokens-cached)
	}
	return float64(caching)*miss + full
}
