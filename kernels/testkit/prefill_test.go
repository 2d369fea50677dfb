package testkit

import (
	"errors"
	"testing"

	"github.com/tutti-io/tutti/kernels"
)

func TestGEMMElemsAndFLOPs(t *testing.T) {
	for _, c := range []struct {
		g       GEMM
		a, b, c int64
		flops   float64
	}{
		{GEMM{M: 8, N: 16, K: 32, Count: 1}, 8 * 32, 32 * 16, 8 * 16, 2 * 8 * 16 * 32},
		// leading dimensions round up to 8: lda = ldc = 40, ldb = 8
		{GEMM{M: 37, N: 3, K: 5, Count: 2}, 40 * 5, 8 * 3, 40 * 3, 2 * 2 * 37 * 3 * 5},
		{GEMM{M: 1, N: 1, K: 1, Count: 1}, 8, 8, 8, 2},
	} {
		a, b, cc := c.g.Elems()
		if a != c.a || b != c.b || cc != c.c {
			t.Errorf("%+v: elems %d/%d/%d, want %d/%d/%d", c.g, a, b, cc, c.a, c.b, c.c)
		}
		if f := c.g.FLOPs(); f != c.flops {
			t.Errorf("%+v: FLOPs %v, want %v", c.g, f, c.flops)
		}
	}
}

func TestCheckPrefill(t *testing.T) {
	gemms := []GEMM{{M: 512, N: 1024, K: 256, Count: 2}, {M: 37, N: 4096, K: 64, Count: 3}}
	a, b, c := PrefillBuffers(gemms)
	if a != 512*256 || b != 256*1024 || c != 512*1024 {
		t.Fatalf("PrefillBuffers = %d/%d/%d", a, b, c)
	}
	cfg := PrefillConfig{MaxLayers: 80, AElems: a, BElems: b, CElems: c}
	for _, tc := range []struct {
		name   string
		layers int
		gemms  []GEMM
		ok     bool
	}{
		{"fits", 80, gemms, true},
		{"one layer", 1, gemms[1:], true},
		{"no layers", 0, gemms, false},
		{"too many layers", 81, gemms, false},
		{"no shapes", 4, nil, false},
		{"zero dim", 4, []GEMM{{M: 0, N: 1, K: 1, Count: 1}}, false},
		{"zero count", 4, []GEMM{{M: 1, N: 1, K: 1, Count: 0}}, false},
		{"negative", 4, []GEMM{{M: -8, N: 1, K: 1, Count: 1}}, false},
		{"A too small", 4, []GEMM{{M: 513, N: 1024, K: 256, Count: 1}}, false},
		{"B too small", 4, []GEMM{{M: 8, N: 4097, K: 256, Count: 1}}, false},
		{"C too small", 4, []GEMM{{M: 512, N: 4097, K: 8, Count: 1}}, false},
		{"dimension past int32", 1, []GEMM{{M: 1, N: 1, K: 1 << 31, Count: 1}}, false},
		{"too many launches", 80, []GEMM{{M: 8, N: 8, K: 8, Count: MaxPrefillLaunches/80 + 1}}, false},
		{"launch limit exactly", 80, []GEMM{{M: 8, N: 8, K: 8, Count: MaxPrefillLaunches / 80}}, true},
	} {
		err := CheckPrefill(cfg, tc.layers, tc.gemms)
		if tc.ok != (err == nil) {
			t.Errorf("%s: err %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, kernels.ErrInvalid) {
			t.Errorf("%s: %v does not wrap kernels.ErrInvalid", tc.name, err)
		}
	}
}
