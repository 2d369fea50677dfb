package testkit

import (
	"errors"
	"testing"

	"github.com/tutti-io/tutti/kernels"
	"time"
)

// prefillOrSkip creates a Prefill for gemms, or skips where there is no GPU
// or library (unless TUTTI_KERNELS_LIB names one: a library built before the
// prefill entry points then fails the test, naming the missing symbol).
func prefillOrSkip(t testing.TB, layers int, gemms []GEMM) *Prefill {
	t.Helper()
	if err := kernels.Init(0); err != nil {
		if !kernels.Explicit() && (errors.Is(err, kernels.ErrNotLoaded) || errors.Is(err, kernels.ErrNoGPU)) {
			t.Skipf("GPU test skipped: %v", err)
		}
		t.Fatalf("GPU test cannot start: %v", err)
	}
	a, b, c := PrefillBuffers(gemms)
	p, err := NewPrefill(PrefillConfig{Device: 0, MaxLayers: layers, AElems: a, BElems: b, CElems: c})
	if err != nil {
		t.Fatalf("NewPrefill: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

func TestGPUPrefill(t *testing.T) {
	// Odd sizes exercise the padded leading dimensions; the 1-column GEMM is
	// the attention remainder the harness emits.
	gemms := []GEMM{{M: 512, N: 1024, K: 1024, Count: 2}, {M: 37, N: 300, K: 520, Count: 1}, {M: 5, N: 1, K: 64, Count: 1}}
	const layers = 6
	p := prefillOrSkip(t, layers, gemms)

	got, err := p.Run(layers, gemms, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != layers {
		t.Fatalf("%d layer times, want %d", len(got), layers)
	}
	for l, d := range got {
		if d <= 0 {
			t.Errorf("layer %d: time %v", l, d)
		}
	}

	// One run at a time.
	if err := p.Start(2, gemms); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(2, gemms); !errors.Is(err, kernels.ErrBusy) {
		t.Errorf("second Start: %v, want kernels.ErrBusy", err)
	}
	if got, err = p.Wait(got[:0]); err != nil || len(got) != 2 {
		t.Fatalf("Wait: %v, %d layers", err, len(got))
	}
	if _, err := p.Wait(nil); !errors.Is(err, kernels.ErrInvalid) {
		t.Errorf("Wait with nothing started: %v, want kernels.ErrInvalid", err)
	}

	// Rejected before anything is enqueued; the Prefill stays usable.
	for _, bad := range [][]GEMM{{{M: 513, N: 1024, K: 1024, Count: 1}}, {{M: 8, N: 8, K: 8, Count: 0}}} {
		if err := p.Start(1, bad); !errors.Is(err, kernels.ErrInvalid) {
			t.Errorf("Start(%+v): %v, want kernels.ErrInvalid", bad, err)
		}
	}
	if err := p.Start(layers+1, gemms); !errors.Is(err, kernels.ErrInvalid) {
		t.Errorf("Start(%d layers): %v, want kernels.ErrInvalid", layers+1, err)
	}
	if _, err := p.Run(1, gemms[2:], nil); err != nil {
		t.Fatalf("Run after rejected starts: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(1, gemms); err == nil {
		t.Error("Start after Close succeeded")
	}
}

// BenchmarkGPUPrefillGEMM reports the bf16 GEMM rate of one 8192³ GEMM per
// layer, 8 layers per run (the rate the harness's layer times come from).
func BenchmarkGPUPrefillGEMM(b *testing.B) {
	gemms := []GEMM{{M: 8192, N: 8192, K: 8192, Count: 1}}
	const layers = 8
	p := prefillOrSkip(b, layers, gemms)
	if _, err := p.Run(layers, gemms, nil); err != nil { // warm-up: cuBLAS loads its kernels
		b.Fatal(err)
	}
	var gpu time.Duration
	var times []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var err error
		if times, err = p.Run(layers, gemms, times[:0]); err != nil {
			b.Fatal(err)
		}
		for _, d := range times {
			gpu += d
		}
	}
	b.ReportMetric(gemms[0].FLOPs()*layers*float64(b.N)/gpu.Seconds()/1e12, "TFLOP/s")
}
