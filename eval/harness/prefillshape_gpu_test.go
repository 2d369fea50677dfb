package harness

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kernels/testkit"
)

// hbmBytesPerS is the H200's HBM bandwidth, only for the floor each
// single-GEMM case reports beside its time (its operands read once).
const hbmBytesPerS = 4.8e12

// BenchmarkPrefillShapes times, alone on the GPU, the GEMMs the replay's
// prefill runs for llama3-8b: whole layers of docqa-like requests (a few
// hundred new tokens after thousands cached) beside the fitted model's
// time for them, and each GEMM shape alone beside its operands' HBM read
// time, with token counts that are and are not multiples of 8, so a layer
// time far above the model can be traced to the shape that costs it. GPU machine only (`-test.bench PrefillShapes -test.benchtime 3x`).
func BenchmarkPrefillShapes(b *testing.B) {
	if !gpuComputeAvailable(b) {
		b.Skip("GPU benchmark skipped: no GPU or kernels library")
	}
	p, _ := model.Lookup("llama3-8b")
	g, err := NewGPUCompute(p, DefaultGEMMTiles)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	fit, _, err := g.Calibrate()
	if err != nil {
		b.Fatal(err)
	}
	layer := func(b *testing.B, gemms []testkit.GEMM) float64 {
		var med float64
		for i := 0; i < b.N; i++ {
			ts, err := g.pf.Run(4, gemms, nil)
			if err != nil {
				b.Fatal(err)
			}
			slices.Sort(ts)
			med = float64(ts[len(ts)/2]) / float64(time.Microsecond)
		}
		return med
	}
	for _, r := range []struct{ newTokens, cached int }{{64, 8192}, {173, 6144}, {200, 4096}, {256, 5888}, {511, 4096}, {512, 8192}, {2048, 8192}} {
		b.Run(fmt.Sprintf("layer-new%d-after%d", r.newTokens, r.cached), func(b *testing.B) {
			gemms, err := PrefillGEMMs(p, r.newTokens, r.cached, g.tiles)
			if err != nil {
				b.Fatal(err)
			}
			us := layer(b, gemms)
			want := fit.LayerNs(r.newTokens, r.cached) / 1e3
			b.ReportMetric(us, "us/layer")
			b.ReportMetric(want, "model-us")
			b.ReportMetric(us/want, "x-model")
			b.Logf("%+v", gemms)
		})
	}
	d := g.dims
	for _, gm := range []testkit.GEMM{
		tokenGEMM(64, d.LinearN, d.K, 1), tokenGEMM(173, d.LinearN, d.K, 1), tokenGEMM(176, d.LinearN, d.K, 1), tokenGEMM(512, d.LinearN, d.K, 1),
		tokenGEMM(173, 6003, d.AttnD, 1), tokenGEMM(176, 6003, d.AttnD, 1), tokenGEMM(173, 6016, d.AttnD, 1), tokenGEMM(176, 6016, d.AttnD, 1),
		tokenGEMM(173, 16384, d.AttnD, 1), tokenGEMM(91, 1, d.AttnD, 1), tokenGEMM(173, 1, d.AttnD, 1),
	} {
		gm.Count = 1
		b.Run(fmt.Sprintf("gemm-%dx%dx%d", gm.M, gm.N, gm.K), func(b *testing.B) {
			us := layer(b, []testkit.GEMM{gm})
			a, bb, c := gm.Elems()
			floor := float64(2*(a+bb+c)) / hbmBytesPerS * 1e6
			b.ReportMetric(us, "us")
			b.ReportMetric(floor, "hbm-floor-us")
			b.ReportMetric(gm.FLOPs()/(us*1e-6)/1e12, "TFLOPS")
		})
	}
}
