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

func TestMedianCI(t *testing.T) {
	ten := []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	for _, c := range []struct {
		name   string
		values []float64
		conf   float64
		lo, hi float64
		ok     bool
	}{
		{"too few for 0.95", []float64{1, 2, 3, 4, 5}, 0.95, 0, 0, false},
		{"six: the extremes (coverage 1-2/64)", []float64{6, 1, 5, 2, 4, 3}, 0.95, 1, 6, true},
		{"ten: 2nd and 9th (coverage 0.979)", ten, 0.95, 2, 9, true},
		{"ten at 0.80: 3rd and 8th (coverage 0.891)", ten, 0.80, 3, 8, true},
		{"conf 1", ten, 1, 0, 0, false},
		{"empty", nil, 0.95, 0, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			lo, hi, ok := MedianCI(c.values, c.conf)
			if ok != c.ok || lo != c.lo || hi != c.hi {
				t.Fatalf("MedianCI = %v, %v, %v; want %v, %v, %v", lo, hi, ok, c.lo, c.hi, c.ok)
			}
		})
	}
	if ten[0] != 10 {
		t.Fatal("MedianCI reordered its input")
	}
}

func TestSignTest(t *testing.T) {
	for _, c := range []struct {
		name         string
		values       []float64
		above, below int
		p            float64
	}{
		{"8 of 10 above: 2·56/1024", []float64{2, 2, 2, 2, 2, 2, 2, 2, 0, 0}, 8, 2, 2 * 56.0 / 1024},
		{"even split", []float64{2, 0, 2, 0}, 2, 2, 1},
		{"ties left out", []float64{1, 1, 2, 2, 2, 2, 2, 2}, 6, 0, 2.0 / 64},
		{"all below", []float64{0, 0, 0, 0, 0}, 0, 5, 2.0 / 32},
		{"nothing apart", []float64{1, 1}, 0, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b, p := SignTest(c.values, 1)
			if a != c.above || b != c.below || math.Abs(p-c.p) > 1e-12 {
				t.Fatalf("SignTest = %d, %d, %v; want %d, %d, %v", a, b, p, c.above, c.below, c.p)
			}
		})
	}
}
