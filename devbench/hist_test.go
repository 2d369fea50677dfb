package devbench

import (
	"math"
	"testing"
)

func TestHistBuckets(t *testing.T) {
	for _, v := range []uint64{0, 1, 31, 32, 33, 63, 64, 100, 1000, 4096, 12345, 1e6, 1e9, 1e12} {
		i := bucketOf(v)
		if lo, hi := lowOf(i), lowOf(i+1); v < lo || v >= hi {
			t.Fatalf("value %d in bucket %d = [%d,%d)", v, i, lo, hi)
		}
	}
}

func TestHistQuantile(t *testing.T) {
	var h hist
	for i := 1; i <= 1000; i++ {
		h.add(int64(i) * 1000) // 1..1000 µs
	}
	for _, tc := range []struct{ q, want float64 }{{0.5, 500e3}, {0.99, 990e3}} {
		if got := h.quantile(tc.q); math.Abs(got-tc.want)/tc.want > 0.04 {
			t.Fatalf("q%.2f = %.0f, want %.0f ±4%%", tc.q, got, tc.want)
		}
	}
	var e hist
	if !math.IsNaN(e.quantile(0.5)) {
		t.Fatal("empty histogram must give NaN")
	}
}
