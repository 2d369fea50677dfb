package gpubench

import (
	"fmt"
	"slices"
	"sort"
)

// Rounds. A host's device ceiling can drift a lot between two samples a
// minute apart (RAM-backed loop devices above all; BENCHMARKS.md, Save and
// restore through the store), so a single ceiling sample taken before every path ran would
// make a path's fraction depend on when it ran. gpubench therefore runs --rounds rounds,
// each a fresh sample of the sum ceiling followed by every path (in the
// order roundOrder gives) with a striped ceiling sample between any two,
// and reports for each path the median over the rounds: of its bytes/s, of
// its CPU s/GiB and of its fractions of the ceilings sampled around it and
// in its round. The per-round values are kept in the row.

// RoundStats are one path's per-round values, in round order.
type RoundStats struct {
	BytesPerS       []float64 `json:"bytes_per_s_rounds,omitempty"`
	CeilingBytesPS  []float64 `json:"ceiling_bytes_per_s_rounds,omitempty"`
	CeilingFraction []float64 `json:"ceiling_fraction_rounds,omitempty"`
	CeilingSum      []float64 `json:"ceiling_sum_bytes_per_s_rounds,omitempty"`
	CeilingSumFrac  []float64 `json:"ceiling_sum_fraction_rounds,omitempty"`
	CeilingCached   []float64 `json:"ceiling_cached_bytes_per_s_rounds,omitempty"`
	CPUSPerGiB      []float64 `json:"cpu_s_per_gib_rounds,omitempty"`
	IOWQWorkers     []int     `json:"io_wq_workers_rounds,omitempty"`
	// Position is where the path ran in each round's order (0: first).
	Position []int `json:"position_rounds,omitempty"`
}

// roundOrder is the order of n paths (their indices) in round k: the list
// rotated by k/2, and mirrored in odd rounds. A round and its mirror run
// every pair of paths both ways, so with an even number of rounds every
// path runs before every other in exactly half of them, and over 2n rounds
// every path runs in every position twice. (A plain rotation by one per
// round runs some pairs in one order more often than the other, and the
// path that runs second in a round can come out ahead on a GPU host.)
func roundOrder(n, k int) []int {
	o := make([]int, n)
	for j := range o {
		o[j] = (j + k/2) % n
	}
	if k%2 == 1 {
		slices.Reverse(o)
	}
	return o
}

// mergeRounds folds rounds (rounds[k][i]: path i in round k; every round runs
// the same paths in the same order) into one row per path. A path that
// failed in any round fails: its row carries that round's error and no
// throughput, and its mismatches are summed over all rounds. Otherwise the
// row is the round with the median bytes/s (the lower one of an even
// count), with the medians of bytes/s, CPU s/GiB, ceiling and ceiling
// fraction put in.
func mergeRounds(rounds [][]Row) ([]Row, error) {
	if len(rounds) == 0 {
		return nil, nil
	}
	n := len(rounds[0])
	for k, r := range rounds {
		if len(r) != n {
			return nil, fmt.Errorf("round %d ran %d paths, round 1 ran %d", k+1, len(r), n)
		}
	}
	out := make([]Row, n)
	for i := 0; i < n; i++ {
		var st RoundStats
		var mism uint64
		failed := -1
		for k, r := range rounds {
			row := r[i]
			if row.Path != rounds[0][i].Path {
				return nil, fmt.Errorf("round %d path %d is %q, round 1 ran %q there", k+1, i+1, row.Path, rounds[0][i].Path)
			}
			mism += row.Mismatches
			if row.Error != "" && failed < 0 {
				failed = k
			}
			st.BytesPerS = append(st.BytesPerS, row.BytesPerS)
			st.CeilingBytesPS = append(st.CeilingBytesPS, row.CeilingBytesPS)
			st.CeilingFraction = append(st.CeilingFraction, row.CeilingFraction)
			st.CeilingSum = append(st.CeilingSum, row.CeilingSumBytesPS)
			st.CeilingSumFrac = append(st.CeilingSumFrac, row.CeilingSumFraction)
			st.CeilingCached = append(st.CeilingCached, row.CeilingCachedBytesPS)
			st.CPUSPerGiB = append(st.CPUSPerGiB, row.CPUSPerGiB)
			st.IOWQWorkers = append(st.IOWQWorkers, row.IOWQWorkers)
			st.Position = append(st.Position, row.position)
		}
		var row Row
		if failed >= 0 {
			row = rounds[failed][i]
			if len(rounds) > 1 {
				row.Error = fmt.Sprintf("round %d of %d: %s", failed+1, len(rounds), row.Error)
			}
			row.BytesPerS, row.CeilingFraction, row.CeilingSumFraction = 0, 0, 0
		} else {
			row = rounds[medianIndex(st.BytesPerS)][i] // its bytes/s is the median
			row.CPUSPerGiB = Median(st.CPUSPerGiB)
			row.CeilingBytesPS = Median(st.CeilingBytesPS)
			row.CeilingCachedBytesPS = Median(st.CeilingCached)
			row.CeilingFraction = Median(st.CeilingFraction)
			row.CeilingSumBytesPS = Median(st.CeilingSum)
			row.CeilingSumFraction = Median(st.CeilingSumFrac)
		}
		row.Mismatches = mism
		row.Rounds = len(rounds)
		row.PerRound = st
		out[i] = row
	}
	return out, nil
}

// medianIndex is the index of the median of v (the lower middle of an
// even count); v is not reordered.
func medianIndex(v []float64) int {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return v[idx[a]] < v[idx[b]] })
	return idx[(len(v)-1)/2]
}

// Median is the median of v (the lower middle of an even count: a value
// of v); v must not be empty and is not reordered.
func Median(v []float64) float64 { return v[medianIndex(v)] }
