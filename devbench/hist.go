package devbench

import (
	"math"
	"math/bits"
)

// hist is a log-linear latency histogram in nanoseconds: 32 sub-buckets per
// power of two (relative error under 3.2%), fixed size, no allocation per
// sample.
type hist struct {
	counts [64 * subBuckets]uint64
	n      uint64
}

const subBits = 5
const subBuckets = 1 << subBits

func bucketOf(ns uint64) int {
	if ns < subBuckets {
		return int(ns)
	}
	exp := bits.Len64(ns) - 1 - subBits // >= 0
	mant := int(ns>>uint(exp)) & (subBuckets - 1)
	return (exp+1)*subBuckets + mant
}

// lowOf is the smallest value of bucket i; upper bound is lowOf(i+1).
func lowOf(i int) uint64 {
	if i < subBuckets {
		return uint64(i)
	}
	exp := i/subBuckets - 1
	mant := uint64(i % subBuckets)
	return (subBuckets + mant) << uint(exp)
}

func (h *hist) add(ns int64) {
	if ns < 0 {
		ns = 0
	}
	h.counts[bucketOf(uint64(ns))]++
	h.n++
}

func (h *hist) merge(o *hist) {
	for i := range h.counts {
		h.counts[i] += o.counts[i]
	}
	h.n += o.n
}

// quantile returns the q-quantile in nanoseconds (bucket midpoint).
func (h *hist) quantile(q float64) float64 {
	if h.n == 0 {
		return math.NaN()
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := lowOf(i), lowOf(i+1)
			return float64(lo+hi) / 2
		}
	}
	return float64(lowOf(len(h.counts) - 1))
}
