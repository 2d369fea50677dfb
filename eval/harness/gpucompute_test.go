package harness

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
)

// The GEMMs launched for a layer carry the profile's prefill FLOPs: the
// attention part within its 8-key rounding, the weights within the rounding of N to a multiple of 8; every shape
// fits the buffers NewGPUCompute allocates.
func TestPrefillGEMMsFLOPs(t *testing.T) {
	tileSets := []GEMMTiles{DefaultGEMMTiles, {Rows: 1000, Ctx: 3000}, {Rows: 7, Ctx: 5}}
	cases := []struct{ newTokens, cached int }{
		{1, 0}, {2, 0}, {511, 0}, {512, 512}, {6758, 0}, {1000, 7000}, {8192, 0}, {8193, 1}, {20000, 100000},
	}
	for _, name := range model.Names() {
		p, err := model.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		d, err := dimsOf(p)
		if err != nil {
			t.Fatal(err)
		}
		// The rounding of N to a multiple of 8 is the linear part's only
		// inexact step.
		lin := p.LinearFLOPsPerToken() / float64(p.Shape.Layers)
		if rel := math.Abs(2*float64(d.K*d.LinearN)-lin) / lin; rel > 1e-4 || d.LinearN%8 != 0 {
			t.Errorf("%s: linear N %d off by %.2g", name, d.LinearN, rel)
		}
		for _, tiles := range tileSets {
			a, b, c := prefillBuffers(d, tiles)
			cfg := testkit.PrefillConfig{MaxLayers: p.Shape.Layers, AElems: a, BElems: b, CElems: c}
			for _, tc := range cases {
				if tiles.Rows < 100 && tc.newTokens > 10000 {
					continue // too many tiny GEMMs to be a real configuration
				}
				what := fmt.Sprintf("%s %d new after %d, tiles %+v", name, tc.newTokens, tc.cached, tiles)
				gs, err := PrefillGEMMs(p, tc.newTokens, tc.cached, tiles)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				var linF, attnF float64
				rows := 0
				for _, g := range gs {
					if g.N > tiles.Rows || (g.K == d.AttnD && g.M > tiles.Ctx) {
						t.Errorf("%s: GEMM %+v exceeds the tiles", what, g)
					}
					if g.K == d.K && g.M == d.LinearN {
						linF += g.FLOPs()
						rows += g.N * g.Count
					} else {
						attnF += g.FLOPs()
					}
				}
				if rows != tc.newTokens {
					t.Errorf("%s: weight GEMMs cover %d rows", what, rows)
				}
				n, s := float64(tc.newTokens), float64(tc.cached)
				wantAttn := p.AttnFLOPsPerContextToken() / float64(p.Shape.Layers) * (n*s + n*(n+1)/2)
				// The last tile's keys are rounded to a multiple of 8 (and the
				// per-token mean to the nearest key): at most 5 keys per row
				// of each chunk off, whatever the context.
				chunks := float64((tc.newTokens + tiles.Rows - 1) / tiles.Rows)
				if tol := 2 * float64(d.AttnD) * 5 * float64(min(tc.newTokens, tiles.Rows)) * chunks; math.Abs(attnF-wantAttn) > tol {
					t.Errorf("%s: attention FLOPs %v, want %v within %v", what, attnF, wantAttn, tol)
				}
				if linF != 2*float64(d.K*d.LinearN)*n {
					t.Errorf("%s: weight FLOPs %v, want %v", what, linF, 2*float64(d.K*d.LinearN)*n)
				}
				want := p.PrefillFLOPsPerLayer(tc.cached, tc.newTokens)
				if rel := math.Abs(linF+attnF-want) / want; rel > 1e-4+math.Abs(attnF-wantAttn)/want {
					t.Errorf("%s: %v FLOPs per layer, profile says %v (off by %.2g)", what, linF+attnF, want, rel)
				}
				if tiles.Rows < 100 {
					continue // only the shapes and FLOPs: more launches than a run takes
				}
				if err := testkit.CheckPrefill(cfg, p.Shape.Layers, gs); err != nil {
					t.Errorf("%s: %v", what, err)
				}
			}
		}
	}
}

func TestPrefillGEMMsRejects(t *testing.T) {
	p, _ := model.Lookup("tiny")
	for _, tc := range []struct {
		n, c  int
		tiles GEMMTiles
	}{{0, 0, DefaultGEMMTiles}, {-1, 5, DefaultGEMMTiles}, {5, -1, DefaultGEMMTiles}, {5, 0, GEMMTiles{Rows: 0, Ctx: 1}}, {5, 0, GEMMTiles{Rows: 1, Ctx: 0}}} {
		if _, err := PrefillGEMMs(p, tc.n, tc.c, tc.tiles); err == nil {
			t.Errorf("PrefillGEMMs(%d, %d, %+v) accepted", tc.n, tc.c, tc.tiles)
		}
	}
	bad := p
	bad.HiddenSize = 0
	if _, err := PrefillGEMMs(bad, 5, 0, DefaultGEMMTiles); err == nil {
		t.Error("a profile without hidden size was accepted")
	}
}

// gpuComputeAvailable reports whether this machine runs the GPU prefill; a
// named library (TUTTI_KERNELS_LIB) that cannot is a failure, not a skip.
func gpuComputeAvailable(t testing.TB) bool {
	t.Helper()
	err := kernels.Init(0)
	if err == nil {
		return true
	}
	if kernels.Explicit() || !(errors.Is(err, kernels.ErrNotLoaded) || errors.Is(err, kernels.ErrNoGPU)) {
		t.Fatalf("GPU expected: %v", err)
	}
	return false
}

func TestSetupCompute(t *testing.T) {
	p, _ := model.Lookup("tiny")
	sim, err := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	if err != nil {
		t.Fatal(err)
	}
	c, g, err := SetupCompute(ComputeSim, p, sim)
	if err != nil || g != nil || c.Label != sim.Label {
		t.Fatalf("sim: %v, %v, %q", err, g, c.Label)
	}
	if _, _, err := SetupCompute("fast", p, sim); err == nil {
		t.Error("--compute fast accepted")
	}
	// Without a GPU prefill, nil GPUCompute gives the simulated layer time.
	var none *GPUCompute
	if d, err := none.Finish(none.Start(2048, 512), sim, 1536, 512); err != nil || d != sim.Layer(1536, 512) {
		t.Errorf("nil GPUCompute: %v, %v; want %v", d, err, sim.Layer(1536, 512))
	}
	if gpuComputeAvailable(t) {
		t.Skip("a GPU is here: the fallback is not exercised (TestGPUCompute runs)")
	}
	c, g, err = SetupCompute(ComputeAuto, p, sim)
	if err != nil || g != nil {
		t.Fatalf("auto without GPU: %v, %v", err, g)
	}
	if !strings.HasPrefix(c.Label, "simulated") || !strings.Contains(c.Label, "--compute auto fell back") {
		t.Errorf("auto without GPU: label %q does not report the fallback", c.Label)
	}
	if _, g, err = SetupCompute(ComputeGPU, p, sim); err == nil || g != nil ||
		!(errors.Is(err, kernels.ErrNotLoaded) || errors.Is(err, kernels.ErrNoGPU)) {
		t.Errorf("gpu without GPU: %v, %v", g, err)
	}
}

// calibratedGPU is SetupCompute(ComputeGPU) for profile name, or the
// test's end.
func calibratedGPU(t *testing.T, name string) (Compute, *GPUCompute) {
	t.Helper()
	p, _ := model.Lookup(name)
	sim, err := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	if err != nil {
		t.Fatal(err)
	}
	c, g, err := SetupCompute(ComputeGPU, p, sim)
	if err != nil {
		t.Fatal(err)
	}
	return c, g
}

// On the GPU machine: calibration fits a model, requests measure positive
// layer times, a restore that brought back fewer blocks is re-measured.
func TestGPUCompute(t *testing.T) {
	if !gpuComputeAvailable(t) {
		t.Skip("GPU test skipped: no GPU or kernels library")
	}
	c, g := calibratedGPU(t, "llama3-8b")
	defer g.Close()
	if !strings.HasPrefix(c.Label, "measured on GPU") || c.Layer(1024, 0) <= 0 {
		t.Errorf("label %q, fitted layer time %v", c.Label, c.Layer(1024, 0))
	}
	t.Logf("%s", c.Label)
	for _, tc := range []struct{ input, assumed, cached int }{
		{3000, 1024, 1024}, // restored what was looked up
		{3000, 2048, 1024}, // restored fewer: re-measured
		{3000, 0, 0},       // nothing to restore: no run started
		{512, 512, 512},    // everything cached: nothing computed
	} {
		var r *PrefillRun
		if tc.assumed > 0 {
			r = g.Start(tc.input, tc.assumed)
		}
		d, err := g.Finish(r, c, tc.input-tc.cached, tc.cached)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		if (d > 0) != (tc.input > tc.cached) {
			t.Errorf("%+v: layer time %v", tc, d)
		}
	}
	if st := g.Stats(); st.Requests != 3 || st.Reruns != 1 || st.GPUTime <= 0 {
		t.Errorf("stats %+v", st)
	}
}
