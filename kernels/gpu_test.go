package kernels_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// gpuOrSkip skips when the library or the GPU is absent, saying why, unless
// TUTTI_KERNELS_LIB names a library: then a machine that should run the GPU
// tests fails instead of skipping.
func gpuOrSkip(t *testing.T) {
	t.Helper()
	err := kernels.Init(0)
	if err == nil {
		return
	}
	if !kernels.Explicit() && (errors.Is(err, kernels.ErrNotLoaded) || errors.Is(err, kernels.ErrNoGPU)) {
		t.Skipf("GPU test skipped: %v", err)
	}
	t.Fatalf("GPU test cannot start: %v", err)
}

// kvTensors allocates the KV memory of g (per-layer tensors or one
// cross-layer tensor) and frees it at the end of the test.
func kvTensors(t *testing.T, g kvshape.Geometry, layout kernels.Layout, numPages int) []uint64 {
	t.Helper()
	per := g.PageBytesPerLayer() * int64(numPages)
	var ptrs []uint64
	n, bytes := g.Layers, per
	if layout == kernels.LayoutCrossLayer {
		n, bytes = 1, per*int64(g.Layers)
	}
	for i := 0; i < n; i++ {
		// Odd tensors through DevAllocOn(0): both entry points serve the binds.
		alloc := kernels.DevAlloc
		if i%2 == 1 {
			alloc = func(b int64) (uint64, error) { return kernels.DevAllocOn(0, b) }
		}
		p, err := alloc(bytes)
		if err != nil {
			t.Fatal(err)
		}
		ptrs = append(ptrs, p)
	}
	t.Cleanup(func() {
		for _, p := range ptrs {
			if err := kernels.DevFree(p); err != nil {
				t.Error(err)
			}
		}
	})
	return ptrs
}

// objectFile writes layers objects of pages pages each (object l at
// l*stride) with GenWord content and opens it with O_DIRECT.
func objectFile(t *testing.T, g kvshape.Geometry, pages int, seed uint64) (*uring.File, int64) {
	t.Helper()
	stride := roundUpTo(int64(pages)*g.PageBytesPerLayer(), kernels.StagingAlign)
	path := filepath.Join(t.TempDir(), "objects")
	w, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, stride)
	for l := 0; l < g.Layers; l++ {
		clear(buf)
		if err := testkit.FillObject(buf, g, seed, l, 0, pages); err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteAt(buf, int64(l)*stride); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := uring.OpenFile(path, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, stride
}

func sqpollRing(t *testing.T, entries uint32) *uring.Ring {
	return sqpollRingMem(t, entries, false)
}

// sqpollRingMem: noMmap puts the rings in memory the process allocated
// (IORING_SETUP_NO_MMAP), which CUDA registers like any anonymous memory.
func sqpollRingMem(t *testing.T, entries uint32, noMmap bool) *uring.Ring {
	t.Helper()
	cfg := uring.DefaultConfig()
	cfg.Entries = entries
	cfg.NoMmap = noMmap
	cfg.SQPoll = true
	cfg.SQThreadIdleMs = 20
	r, err := uring.New(cfg)
	if err != nil {
		t.Fatalf("SQPOLL ring: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// wholeRequest restores pages [0,n) of every layer from f, split into runs.
func wholeRequest(f *uring.File, g kvshape.Geometry, stride int64, runs []int, dst func(i int) int32) kernels.Request {
	req := kernels.Request{}
	n := 0
	for _, r := range runs {
		n += r
	}
	for i := 0; i < n; i++ {
		req.Pages = append(req.Pages, dst(i))
	}
	for l := 0; l < g.Layers; l++ {
		var xs []kernels.Extent
		off := int64(l) * stride
		for _, r := range runs {
			xs = append(xs, kernels.Extent{FD: f.FD, Align: f.DirectAlign, Offset: off, Pages: r})
			off += int64(r) * g.PageBytesPerLayer()
		}
		req.Layers = append(req.Layers, xs)
	}
	return req
}

// verifyMap is the page map VerifyKV needs: request page i at engine page dst(i).
func verifyMap(n int, dst func(i int) int32) []kernels.PageMap {
	m := make([]kernels.PageMap, n)
	for i := range m {
		m[i].DstPage = uint32(dst(i))
	}
	return m
}

func TestGPUScatterGather(t *testing.T) {
	gpuOrSkip(t)
	for _, c := range []struct {
		g      kvshape.Geometry
		layout kernels.Layout
	}{
		{kvshape.Geometry{Layers: 4, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}, kernels.LayoutPerLayer},
		{kvshape.Geometry{Layers: 4, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}, kernels.LayoutCrossLayer},
		{kvshape.Geometry{Layers: 3, Planes: 1, PageTokens: 16, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16}, kernels.LayoutPerLayer},
	} {
		const pages, numPages = 37, 100
		dst := func(i int) int32 { return int32((i*13 + 5) % numPages) }
		r, err := kernels.Bind(kernels.Config{Geometry: c.g, Layout: c.layout, NumPages: numPages, KV: kvTensors(t, c.g, c.layout, numPages), MaxPages: pages})
		if err != nil {
			t.Fatal(err)
		}
		if err := testkit.FillKV(r, 0xA5); err != nil {
			t.Fatal(err)
		}
		pb := c.g.PageBytesPerLayer()
		obj, err := uring.AllocBuffer(int(pb) * pages)
		if err != nil {
			t.Fatal(err)
		}
		if err := kernels.HostRegister(obj.Addr(), int64(obj.Len())); err != nil {
			t.Fatal(err)
		}
		pm := make([]kernels.PageMap, pages)
		for i := range pm {
			pm[i] = kernels.PageMap{DstPage: uint32(dst(i)), SlotOff: uint32(int64(i) * pb)}
		}
		if err := r.SetHostMap(pm); err != nil {
			t.Fatal(err)
		}
		for l := 0; l < c.g.Layers; l++ {
			if err := testkit.FillObject(obj.Bytes(), c.g, 11, l, 0, pages); err != nil {
				t.Fatal(err)
			}
			if err := r.ScatterHost(l, obj.Addr(), int64(obj.Len())); err != nil {
				t.Fatal(err)
			}
			if err := r.SyncCopies(); err != nil {
				t.Fatal(err)
			}
		}
		bad, err := testkit.VerifyKV(r, 11, pm, 0, c.g.Layers)
		if err != nil || bad != 0 {
			t.Fatalf("%v %v: %d mismatched words, err %v", c.g, c.layout, bad, err)
		}
		// a wrong seed must be seen: the verifier is not vacuous
		if bad, _ := testkit.VerifyKV(r, 12, pm, 0, 1); bad == 0 {
			t.Fatal("verifier accepted the wrong seed")
		}
		// copies that would leave the registered buffer are refused
		if err := r.ScatterHost(0, obj.Addr()+4096, int64(obj.Len())); !errors.Is(err, kernels.ErrInvalid) {
			t.Fatalf("scatter from outside registered memory: %v", err)
		}
		if err := r.ScatterHost(0, obj.Addr(), int64(obj.Len())-16); !errors.Is(err, kernels.ErrInvalid) {
			t.Fatalf("scatter from a buffer shorter than the map: %v", err)
		}
		// gather layer 1 back and compare with the generator byte for byte
		clear(obj.Bytes())
		pages32 := make([]int32, pages)
		for i := range pages32 {
			pages32[i] = dst(i)
		}
		if err := r.Gather(pages32, 1, 1, obj.Addr(), int64(obj.Len())); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, obj.Len())
		if err := testkit.FillObject(want, c.g, 11, 1, 0, pages); err != nil {
			t.Fatal(err)
		}
		if string(want) != string(obj.Bytes()) {
			t.Fatalf("%v %v: gathered layer differs from what was scattered", c.g, c.layout)
		}
		if err := kernels.HostUnregister(obj.Addr()); err != nil {
			t.Fatal(err)
		}
		obj.Free()
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestGPURestore(t *testing.T) {
	gpuOrSkip(t)
	cases := []struct {
		name   string
		g      kvshape.Geometry
		layout kernels.Layout
		runs   []int
		maxIO  int
		ring   uint32
		noMmap bool
		plain  bool // BenchOptions.NoFixedBuffers: plain READ SQEs (the default is READ_FIXED into registered staging)
		ahead  int  // EnqueueLayers (0: the default, every layer of these requests at once)
		zc     bool // BenchOptions.ZeroCopyScatter: the scatter reads host staging (the default copies it into HBM first)
	}{
		// a 16-entry ring far smaller than a layer: wrap-around and SQ-full back-pressure
		{"gqa-per-layer-small-ring", kvshape.Geometry{Layers: 10, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}, kernels.LayoutPerLayer, []int{20, 13, 7}, 64 << 10, 16, false, false, 0, false},
		{"gqa-cross-layer", kvshape.Geometry{Layers: 10, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}, kernels.LayoutCrossLayer, []int{40}, 256 << 10, 64, false, false, 0, false},
		{"mla-per-layer", kvshape.Geometry{Layers: 7, Planes: 1, PageTokens: 16, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16}, kernels.LayoutPerLayer, []int{3, 30, 7}, 32 << 10, 32, false, false, 0, false},
		// rings of several pages in process memory (NO_MMAP), as gpubench uses
		{"gqa-nommap-256", kvshape.Geometry{Layers: 10, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}, kernels.LayoutPerLayer, []int{40}, 64 << 10, 256, true, false, 0, false},
		{"gqa-plain-reads", kvshape.Geometry{Layers: 10, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}, kernels.LayoutPerLayer, []int{20, 13, 7}, 64 << 10, 64, true, true, 0, false},
		// the feeder enqueues layer by layer; the second request waits in its queue
		{"gqa-fed-1-ahead", kvshape.Geometry{Layers: 10, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}, kernels.LayoutPerLayer, []int{20, 13, 7}, 64 << 10, 16, false, false, 1, false},
		{"gqa-zero-copy", kvshape.Geometry{Layers: 10, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}, kernels.LayoutPerLayer, []int{20, 13, 7}, 64 << 10, 16, false, false, 2, true},
		{"mla-fed-2-ahead", kvshape.Geometry{Layers: 7, Planes: 1, PageTokens: 16, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16}, kernels.LayoutPerLayer, []int{3, 30, 7}, 32 << 10, 32, true, false, 2, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := 0
			for _, r := range c.runs {
				n += r
			}
			const numPages = 200
			dst := func(i int) int32 { return int32((i*7 + 3) % numPages) }
			f, stride := objectFile(t, c.g, n, 5)
			ring := sqpollRingMem(t, c.ring, c.noMmap)
			r, err := kernels.BindBench(kernels.Config{Geometry: c.g, Layout: c.layout, NumPages: numPages, KV: kvTensors(t, c.g, c.layout, numPages),
				Ring: ring, MaxPages: n, MaxIOBytes: c.maxIO, IOWindow: 24, EnqueueLayers: c.ahead},
				kernels.BenchOptions{NoFixedBuffers: c.plain, ZeroCopyScatter: c.zc})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if fixed, ferr := r.FixedBuffers(); fixed == c.plain || ferr != nil {
				t.Fatalf("FixedBuffers() = %v, %v; want %v, nil", fixed, ferr, !c.plain)
			}
			if err := testkit.FillKV(r, 0xA5); err != nil {
				t.Fatal(err)
			}
			req := wholeRequest(f, c.g, stride, c.runs, dst)
			// two requests in flight at once: layers [0,k) and [k,L)
			k := c.g.Layers / 2
			a, b := req, req
			a.Layers = req.Layers[:k]
			b.FirstLayer, b.Layers = k, req.Layers[k:]
			ra, err := r.Restore(a)
			if err != nil {
				t.Fatal(err)
			}
			rb, err := r.Restore(b)
			if err != nil {
				t.Fatal(err)
			}
			if err := ra.StreamWaitLayer(k-1, 0); err != nil {
				t.Fatal(err)
			}
			if err := rb.WaitLayer(k); err != nil {
				t.Fatal(err)
			}
			for _, x := range []*kernels.Restore{ra, rb} {
				res, err := x.Wait()
				if err != nil {
					t.Fatalf("restore: %v", err)
				}
				if len(res.Failed) != 0 || len(res.LayerMs) == 0 {
					t.Fatalf("result %+v", res)
				}
				if err := x.Release(); err != nil {
					t.Fatal(err)
				}
			}
			bad, err := testkit.VerifyKV(r, 5, verifyMap(n, dst), 0, c.g.Layers)
			if err != nil || bad != 0 {
				t.Fatalf("%d mismatched words after restore (err %v)", bad, err)
			}
		})
	}
}

// TestGPURestoreManyLayers: 80-layer requests. Enqueued all at once, one
// fills the GPU's command queue; the wake helper must already run then (it
// did not, and every entry timed out, in the first gpubench runs). With the
// feeder (EnqueueLayers 2 and the default), three such requests are in
// flight at once, the later two waiting in its queue; every layer of each is
// waited for in order, as the runtime does, and the KV is right.
func TestGPURestoreManyLayers(t *testing.T) {
	gpuOrSkip(t)
	g := kvshape.Geometry{Layers: 80, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}
	const n, numPages = 8, 16
	for _, ahead := range []int{80, 2, 0} {
		t.Run(fmt.Sprintf("enqueue-layers=%d", ahead), func(t *testing.T) {
			dst := func(i int) int32 { return int32(2*i + 1) }
			f, stride := objectFile(t, g, n, 33)
			ring := sqpollRingMem(t, 64, true)
			r, err := kernels.Bind(kernels.Config{Geometry: g, NumPages: numPages, KV: kvTensors(t, g, kernels.LayoutPerLayer, numPages), Ring: ring,
				MaxPages: n, MaxIOBytes: 64 << 10, PollTimeout: 2 * time.Second, EnqueueLayers: ahead})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if err := testkit.FillKV(r, 0xA5); err != nil {
				t.Fatal(err)
			}
			var xs []*kernels.Restore
			for range 3 {
				x, err := r.Restore(wholeRequest(f, g, stride, []int{n}, dst))
				if err != nil {
					t.Fatal(err)
				}
				xs = append(xs, x)
			}
			for i, x := range xs {
				for l := 0; l < g.Layers; l++ {
					if err := x.WaitLayer(l); err != nil {
						t.Fatalf("restore %d: %v", i, err)
					}
				}
				res, err := x.Wait()
				if err != nil {
					t.Fatalf("80-layer restore %d: %v", i, err)
				}
				if len(res.LayerMs) != g.Layers {
					t.Fatalf("%d layer times", len(res.LayerMs))
				}
				if err := x.Release(); err != nil {
					t.Fatal(err)
				}
			}
			if bad, err := testkit.VerifyKV(r, 33, verifyMap(n, dst), 0, g.Layers); err != nil || bad != 0 {
				t.Fatalf("%d bad words (%v)", bad, err)
			}
		})
	}
}

// TestGPURestoreFaults: a read past the end of the file, a removed (closed)
// file and a bad descriptor give per-entry errors; their pages keep the
// poison, every other page is right, and the ring serves the next request.
func TestGPURestoreFaults(t *testing.T) {
	gpuOrSkip(t)
	g := kvshape.Geometry{Layers: 6, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}
	const n, numPages = 24, 64
	dst := func(i int) int32 { return int32(numPages - 1 - i) }
	f, stride := objectFile(t, g, n, 21)
	// a second file, removed and closed before the restore
	gone, _ := objectFile(t, g, n, 21)
	goneFD := gone.FD
	os.Remove(gone.Path)
	gone.Close()
	ring := sqpollRing(t, 32)
	r, err := kernels.Bind(kernels.Config{Geometry: g, NumPages: numPages, KV: kvTensors(t, g, kernels.LayoutPerLayer, numPages), Ring: ring,
		MaxPages: n, MaxIOBytes: 128 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	faults := []struct {
		name  string
		layer int
		mut   func(x *kernels.Extent)
		errno syscall.Errno
	}{
		{"past-eof", 1, func(x *kernels.Extent) { x.Offset = 1 << 40 }, 0},
		// the closed descriptor's number may be reused (by the ring itself):
		// any I/O error will do, wrong data will not
		{"removed-file", 3, func(x *kernels.Extent) { x.FD = goneFD }, 0},
		{"bad-descriptor", 4, func(x *kernels.Extent) { x.FD = 100000 }, syscall.EBADF},
	}
	for _, fc := range faults {
		t.Run(fc.name, func(t *testing.T) {
			if err := testkit.FillKV(r, 0xA5); err != nil {
				t.Fatal(err)
			}
			req := wholeRequest(f, g, stride, []int{12, 12}, dst)
			fc.mut(&req.Layers[fc.layer][1]) // pages 12..23 of that layer
			x, err := r.Restore(req)
			if err != nil {
				t.Fatal(err)
			}
			res, err := x.Wait()
			t.Logf("%s: %v", fc.name, err)
			if !errors.Is(err, kernels.ErrIO) {
				t.Fatalf("wait: %v, want ErrIO", err)
			}
			if fc.errno != 0 && !errors.Is(err, fc.errno) {
				t.Fatalf("wait: %v, want %v", err, fc.errno)
			}
			for _, fe := range res.Failed {
				if fe.Result.Status != kernels.EntryIOError && fe.Result.Status != kernels.EntryShort {
					t.Fatalf("failed entry %v", fe)
				}
				if fe.Layer != fc.layer {
					t.Fatalf("failure in layer %d: %v", fe.Layer, fe)
				}
			}
			if res.FailedPages != 12 {
				t.Fatalf("%d failed pages, want 12", res.FailedPages)
			}
			if err := x.Release(); err != nil {
				t.Fatal(err)
			}
			// Every word of a failed page must differ from the saved data (it
			// keeps the poison); every other page must be exact.
			full := verifyMap(n, dst)
			words := uint64(12 * g.PageBytesPerLayer() / 8)
			for l := 0; l < g.Layers; l++ {
				head, err := testkit.VerifyKV(r, 21, full[:12], l, 1)
				if err != nil || head != 0 {
					t.Fatalf("layer %d: first run has %d bad words (%v)", l, head, err)
				}
				all, err := testkit.VerifyKV(r, 21, full, l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if want := map[bool]uint64{true: words, false: 0}[l == fc.layer]; all != want {
					t.Fatalf("layer %d: %d mismatched words, want %d", l, all, want)
				}
			}
		})
	}
	// the ring still works
	if err := testkit.FillKV(r, 0); err != nil {
		t.Fatal(err)
	}
	x, err := r.Restore(wholeRequest(f, g, stride, []int{24}, dst))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Wait(); err != nil {
		t.Fatalf("restore after faults: %v", err)
	}
	x.Release()
	if bad, err := testkit.VerifyKV(r, 21, verifyMap(n, dst), 0, g.Layers); err != nil || bad != 0 {
		t.Fatalf("after faults: %d bad words (%v)", bad, err)
	}
	// a descriptor outside the KV tensors never reaches the GPU
	req := wholeRequest(f, g, stride, []int{24}, dst)
	req.Pages[3] = numPages
	if _, err := r.Restore(req); !errors.Is(err, kernels.ErrInvalid) {
		t.Fatalf("out-of-range page: %v", err)
	}
}

// roundUpTo rounds x up to a multiple of a.
func roundUpTo(x, a int64) int64 { return (x + a - 1) / a * a }
