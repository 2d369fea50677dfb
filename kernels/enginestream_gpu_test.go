package kernels_test

import (
	"testing"
	"time"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/kvshape"
)

// TestGPUWaitsIgnoreTheEngineStream: an engine's work on the legacy default
// stream (PyTorch's default) is not waited for by a restore's waits or by
// setting the host page map. Either would make every restore wait for the
// engine's queued prefill: a cudaMemcpy on the legacy stream, or the lazy
// load of a kernel at its first launch (tk_bind loads them: load_io_layer).
// It runs first of the package's GPU tests, before any restore has launched.
func TestGPUWaitsIgnoreTheEngineStream(t *testing.T) {
	gpuOrSkip(t)
	g := kvshape.Geometry{Layers: 6, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}
	const numPages, n = 64, 24
	dst := func(i int) int32 { return int32((i*5 + 1) % numPages) }
	f, stride := objectFile(t, g, n, 9)
	ring := sqpollRingMem(t, 64, false)
	r, err := kernels.Bind(kernels.Config{Geometry: g, Layout: kernels.LayoutPerLayer, NumPages: numPages,
		KV: kvTensors(t, g, kernels.LayoutPerLayer, numPages), Ring: ring, MaxPages: n, MaxIOBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := testkit.FillKV(r, 0xA5); err != nil {
		t.Fatal(err)
	}
	const spin = 5 * time.Second
	if err := testkit.LegacySpin(0, spin); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	defer func() { // the next test must not find the legacy stream busy
		for i := 0; i < int(spin/(10*time.Millisecond))+100; i++ {
			if busy, err := testkit.LegacyBusy(0); err != nil || !busy {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Errorf("the legacy stream is still busy %v after a %v spin", time.Since(t0), spin)
	}()
	x, err := r.Restore(wholeRequest(f, g, stride, []int{n}, dst))
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitLayer(0); err != nil {
		t.Fatal(err)
	}
	res, err := x.Wait()
	if err != nil || len(res.Failed) != 0 {
		t.Fatalf("restore: %+v, %v", res, err)
	}
	if err := x.Release(); err != nil {
		t.Fatal(err)
	}
	if err := r.SetHostMap(verifyMap(n, dst)); err != nil {
		t.Fatal(err)
	}
	busy, err := testkit.LegacyBusy(0)
	if err != nil {
		t.Fatal(err)
	}
	if !busy {
		t.Fatalf("the engine's %v kernel on the legacy stream had finished when the restore's waits returned (%v after it started): they waited for it",
			spin, time.Since(t0))
	}
}
