package harness

import "fmt"

// BelowNotes says, for each backend whose rate at SLO beats tutti-cpu's,
// what the measurements show about why: the planner recomputing cached
// blocks (a lower hit ratio), a faster measured restore, reads served from
// the page cache instead of the device, the DRAM tier being the bound, and
// whether the two differ by more than their spread over rounds (one round:
// the difference may be noise). Empty when tutti-cpu did not run or leads.
func BelowNotes(res *Result) []string {
	var t *BackendResult
	for i := range res.Backends {
		if b := &res.Backends[i]; b.Backend == "tutti-cpu" && b.Skipped == "" {
			t = b
		}
	}
	if t == nil {
		return nil
	}
	var notes []string
	for _, b := range res.Backends {
		if b.Skipped != "" || b.Backend == t.Backend || b.MaxRateAtSLO <= t.MaxRateAtSLO {
			continue
		}
		why := ""
		add := func(format string, args ...any) {
			if why != "" {
				why += "; "
			}
			why += fmt.Sprintf(format, args...)
		}
		switch {
		case b.Backend == "dram":
			add("the DRAM tier is the bound every storage tier is below (no device)")
		case b.Backend == "recompute":
			add("recomputing beats loading from this storage at this model's prefill rate (the planner loads less where it sees that)")
		}
		if t.HitRatio < b.HitRatio-1e-9 {
			add("the planner recomputed cached blocks (hit ratio %.3f against %.3f)", t.HitRatio, b.HitRatio)
		}
		if pc := fromPageCache(&b); pc != "" {
			add("%s", pc)
		}
		if b.BytesPerS > t.BytesPerS && t.BytesPerS > 0 {
			add("its restores measured %.2f GB/s against tutti-cpu's %.2f", b.BytesPerS/1e9, t.BytesPerS/1e9)
		}
		switch {
		case b.Rounds == nil || t.Rounds == nil:
			add("one round only: the difference may be noise (--rounds N gives each its spread)")
		default:
			_, thi := MinMax(t.Rounds.MaxRateAtSLO)
			blo, _ := MinMax(b.Rounds.MaxRateAtSLO)
			if blo <= thi {
				add("within the spread over %d rounds (tutti-cpu up to %.3f req/s, %s from %.3f)", len(t.Rounds.MaxRateAtSLO), thi, b.Backend, blo)
			}
		}
		notes = append(notes, fmt.Sprintf("%s's rate at SLO %.3f is above tutti-cpu's %.3f: %s", b.Backend, b.MaxRateAtSLO, t.MaxRateAtSLO, why))
	}
	return notes
}

// fromPageCache says that b restored from the page cache rather than from
// its device (buffered reads, fewer device bytes than restored), or "".
func fromPageCache(b *BackendResult) string {
	if b.Backend == "dram" || b.RestoredBytes <= 0 || b.DirectIO || b.DeviceReadBytes >= uint64(b.RestoredBytes) {
		return ""
	}
	return fmt.Sprintf("%s restored from the page cache (device reads %d MiB of %d MiB restored)", b.Backend, b.DeviceReadBytes>>20, b.RestoredBytes>>20)
}
