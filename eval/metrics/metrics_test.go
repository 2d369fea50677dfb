package metrics

import (
	"math"
	"testing"
)

func TestPercentile(t *testing.T) {
	v := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for _, tc := range []struct{ q, want float64 }{{0, 1}, {0.1, 1}, {0.5, 5}, {0.9, 9}, {0.99, 10}, {1, 10}} {
		if got := Percentile(v, tc.q); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.q, got, tc.want)
		}
	}
	if v[0] != 5 {
		t.Fatal("input modified")
	}
	if !math.IsNaN(Percentile(nil, 0.5)) {
		t.Fatal("empty not NaN")
	}
	s := Summarize(v)
	if s.N != 10 || s.Mean != 5.5 || s.P50 != 5 || s.P90 != 9 || s.P99 != 10 || s.Max != 10 {
		t.Fatalf("%+v", s)
	}
}

func TestAttainmentCDF(t *testing.T) {
	v := []float64{1, 2, 3, 4}
	if a := Attainment(v, 2.5); a != 0.5 {
		t.Fatalf("attainment %v", a)
	}
	if Attainment(nil, 1) != 1 {
		t.Fatal("empty attainment")
	}
	xs, ys := CDF([]float64{3, 1, 2})
	if xs[0] != 1 || xs[2] != 3 || ys[2] != 1 || math.Abs(ys[0]-1.0/3) > 1e-12 {
		t.Fatalf("%v %v", xs, ys)
	}
	if Mean([]float64{1, 3}) != 2 {
		t.Fatal("mean")
	}
}
