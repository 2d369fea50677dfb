package harness

import (
	"fmt"
	"sort"

	"github.com/tutti-io/tutti/internal/trace"
)

// WindowReuse is what a window of requests can reuse under the shared cache
// policy (Index: leaf-first LRU over a block capacity), before any backend
// runs: the hits a caching backend that stores every admitted block will
// see, and the hits an unbounded store would see. Any trace or generated
// workload: only the chained block ids matter.
type WindowReuse struct {
	Requests  int
	BlockRefs int64
	Distinct  int64
	// Hits are block references served from the store under the capacity
	// (warm blocks first saved, when warm is given); WarmHits the part of
	// them that the warm-up saved; UnboundedHits the hits with no capacity
	// limit. Hits < UnboundedHits means the capacity evicted blocks before
	// the window used them.
	Hits, WarmHits, UnboundedHits int64
	WarmBlocks                    int64 // distinct blocks the warm-up saved
	MaxBlocks                     int   // blocks of the longest request
	// OverCapacity counts requests longer than the capacity: each is saved
	// only in part (its leading capacity blocks), for every backend.
	OverCapacity int
}

// AnalyzeWindow replays the window's block ids (after warm's steps, when
// given) through the shared index of capacityBlocks (≤ 0: unbounded).
func AnalyzeWindow(window []trace.Request, warm []warmStep, capacityBlocks int) WindowReuse {
	var w WindowReuse
	w.Requests = len(window)
	seen := map[uint64]struct{}{}
	for _, r := range window {
		w.BlockRefs += int64(len(r.HashIDs))
		w.MaxBlocks = max(w.MaxBlocks, len(r.HashIDs))
		for _, id := range r.HashIDs {
			seen[id] = struct{}{}
		}
	}
	w.Distinct = int64(len(seen))
	run := func(capBlocks int) (hits, warmHits int64, warmSet map[uint64]struct{}) {
		idx := NewIndex(capBlocks)
		warmSet = map[uint64]struct{}{}
		for _, s := range warm {
			hit := idx.Lookup(s.chain)
			end, _ := idx.Admit(s.chain, hit)
			idx.Insert(s.chain, hit, end)
			for _, id := range s.chain[:end] {
				warmSet[id] = struct{}{}
			}
		}
		saved := map[uint64]struct{}{} // saved by the window itself
		for _, r := range window {
			hit := idx.Lookup(r.HashIDs)
			hits += int64(hit)
			for _, id := range r.HashIDs[:hit] {
				if _, w := warmSet[id]; w {
					if _, s := saved[id]; !s {
						warmHits++
					}
				}
			}
			end, _ := idx.Admit(r.HashIDs, hit)
			idx.Insert(r.HashIDs, hit, end)
			for _, id := range r.HashIDs[hit:end] {
				saved[id] = struct{}{}
			}
		}
		return hits, warmHits, warmSet
	}
	unbounded := int(w.Distinct)
	for _, s := range warm {
		unbounded += len(s.chain)
	}
	w.UnboundedHits, _, _ = run(max(1, unbounded))
	var ws map[uint64]struct{}
	if capacityBlocks <= 0 {
		capacityBlocks = max(1, unbounded)
	}
	w.Hits, w.WarmHits, ws = run(capacityBlocks)
	for _, r := range window {
		if len(r.HashIDs) > capacityBlocks {
			w.OverCapacity++
		}
	}
	w.WarmBlocks = int64(len(ws))
	return w
}

// minMeaningfulRequests is the window below which a rate at SLO (a p90 over
// the window) is said to be indicative only.
const minMeaningfulRequests = 20

// WindowNotes says in words what makes a replay's window mean less than it
// seems: no prefix hit at all, a warm set or window blocks evicted before
// use, too few requests for a p90, rates at SLO that are only lower bounds.
// Empty when none applies. res must be Run's result (its Reuse set).
func WindowNotes(res *Result) []string {
	var notes []string
	u := res.Reuse
	switch {
	case u.UnboundedHits == 0:
		notes = append(notes, "the window has NO prefix hit (no request's leading blocks were seen before it, in the window or its warm-up): every caching backend only saves and prefills, so this run compares save paths and prefill, not restores")
	case u.Hits == 0:
		notes = append(notes, fmt.Sprintf("the window has no prefix hit under the capacity of %d blocks: the %d hits an unbounded store would serve were all evicted (leaf-first LRU) before use, so restores are not measured", res.CapacityBlocks, u.UnboundedHits))
	case u.Hits < u.UnboundedHits:
		notes = append(notes, fmt.Sprintf("the capacity of %d blocks evicted blocks before the window used them: %d of the %d hits an unbounded store would serve remain", res.CapacityBlocks, u.Hits, u.UnboundedHits))
	}
	if res.Warm != nil && res.Warm.Blocks > 0 && u.WarmHits == 0 {
		notes = append(notes, fmt.Sprintf("the warm set (%d blocks) was evicted before the window referenced it: no hit came from the warm-up", res.Warm.Blocks))
	}
	if res.Trace.Requests < minMeaningfulRequests {
		notes = append(notes, fmt.Sprintf("the window holds %d requests (fewer than %d): its p90/p99 and rates at SLO rest on a handful of samples and are indicative only", res.Trace.Requests, minMeaningfulRequests))
	}
	var bounds []string
	for _, b := range res.Backends {
		if b.Skipped == "" && b.MaxRateIsLowerBound {
			bounds = append(bounds, b.Backend)
		}
	}
	if len(bounds) > 0 {
		sort.Strings(bounds)
		notes = append(notes, fmt.Sprintf("the rate at SLO of %v is only a lower bound (the SLO held at every rate tried over %d requests)", bounds, res.Trace.Requests))
	}
	return notes
}
