package kernels_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/uring"
)

// registeredBuffer is off-heap host memory registered with CUDA, freed at
// the end of the test.
func registeredBuffer(t *testing.T, bytes int64) *uring.Buffer {
	t.Helper()
	b, err := uring.AllocBuffer(int(bytes))
	if err != nil {
		t.Fatal(err)
	}
	if err := kernels.HostRegister(b.Addr(), bytes); err != nil {
		b.Free()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := kernels.HostUnregister(b.Addr()); err != nil {
			t.Error(err)
		}
		b.Free()
	})
	return b
}

// fillAllPages scatters testkit content into every engine page of every
// layer: engine page p holds saved page p of seed (FillObject).
func fillAllPages(t *testing.T, r *kernels.Restorer, g kvshape.Geometry, numPages int, seed uint64) {
	t.Helper()
	pb := g.PageBytesPerLayer()
	obj := registeredBuffer(t, int64(numPages)*pb)
	pm := make([]kernels.PageMap, numPages)
	for i := range pm {
		pm[i] = kernels.PageMap{DstPage: uint32(i), SlotOff: uint32(int64(i) * pb)}
	}
	if err := r.SetHostMap(pm); err != nil {
		t.Fatal(err)
	}
	for l := 0; l < g.Layers; l++ {
		if err := testkit.FillObject(obj.Bytes(), g, seed, l, 0, numPages); err != nil {
			t.Fatal(err)
		}
		if err := r.ScatterHost(l, obj.Addr(), int64(obj.Len())); err != nil {
			t.Fatal(err)
		}
		if err := r.SyncCopies(); err != nil {
			t.Fatal(err)
		}
	}
}

// checkGathered compares got (layers [first, first+len(got)/stride) of
// pages, stride apart) with the generator's bytes; it names the first
// differing page.
func checkGathered(g kvshape.Geometry, seed uint64, pages []int32, first int, got []byte, stride int64) error {
	pb := g.PageBytesPerLayer()
	want := make([]byte, pb)
	for l := 0; int64(l)*stride < int64(len(got)); l++ {
		for i, p := range pages {
			if err := testkit.FillObject(want, g, seed, first+l, int(p), 1); err != nil {
				return err
			}
			off := int64(l)*stride + int64(i)*pb
			if !bytes.Equal(got[off:off+pb], want) {
				return fmt.Errorf("layer %d, page %d (engine page %d) differs", first+l, i, p)
			}
		}
	}
	return nil
}

// TestGPUGatherLanes gathers from one goroutine per lane at once, round
// after round, each its own pages of every layer, and checks every byte
// against the generator and against a single-threaded Gather of the same
// pages; then the refusals (ErrInvalid) of a bad lane, too many pages, an
// unregistered or misaligned destination, after which the lanes still work.
func TestGPUGatherLanes(t *testing.T) {
	gpuOrSkip(t)
	g := kvshape.Geometry{Layers: 4, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}
	const numPages, pages, rounds, seed = 96, 37, 4, 23
	pb := g.PageBytesPerLayer()
	stride := int64(pages) * pb
	for _, layout := range []kernels.Layout{kernels.LayoutPerLayer, kernels.LayoutCrossLayer} {
		r, err := kernels.Bind(kernels.Config{Geometry: g, Layout: layout, NumPages: numPages, KV: kvTensors(t, g, layout, numPages), MaxPages: numPages})
		if err != nil {
			t.Fatal(err)
		}
		fillAllPages(t, r, g, numPages, seed)
		lanes := r.GatherLanes()
		if lanes != 8 {
			t.Errorf("%v: %d gather lanes, want the default 8", layout, lanes)
		}
		// lane w's pages in round k: distinct (7 is prime to numPages), and
		// different for every lane and round.
		pagesOf := func(w, k int) []int32 {
			p := make([]int32, pages)
			for i := range p {
				p[i] = int32((i*7 + w*11 + k*3) % numPages)
			}
			return p
		}
		bufs := make([]*uring.Buffer, lanes)
		for w := range bufs {
			bufs[w] = registeredBuffer(t, int64(g.Layers)*stride)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := 0; w < lanes; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for k := 0; k < rounds; k++ {
					clear(bufs[w].Bytes())
					pw := pagesOf(w, k)
					crcs := make([]uint32, g.Layers*len(pw)*g.Planes)
					if err := r.GatherLane(w, pw, 0, g.Layers, bufs[w].Addr(), stride, crcs, 0); err != nil {
						t.Errorf("%v lane %d round %d: %v", layout, w, k, err)
						return
					}
					if err := checkGathered(g, seed, pw, 0, bufs[w].Bytes(), stride); err != nil {
						t.Errorf("%v lane %d round %d: %v", layout, w, k, err)
						return
					}
					if err := checkPlaneCRCs(g, len(pw), bufs[w].Bytes(), stride, crcs); err != nil {
						t.Errorf("%v lane %d round %d: %v", layout, w, k, err)
						return
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		ref := registeredBuffer(t, int64(g.Layers)*stride)
		for w := 0; w < lanes; w++ {
			if err := r.Gather(pagesOf(w, rounds-1), 0, g.Layers, ref.Addr(), stride); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(ref.Bytes(), bufs[w].Bytes()) {
				t.Errorf("%v lane %d: concurrent gather differs from a single-threaded Gather", layout, w)
			}
		}
		gatherLaneRefusals(t, r, g, numPages, bufs[0], stride)
		// Layers [1, 3) on the last lane after the refusals: the lanes still work.
		pw := pagesOf(0, 0)
		if err := r.GatherLane(lanes-1, pw, 1, 2, bufs[0].Addr(), stride, nil, 0); err != nil {
			t.Fatalf("%v: gather after the refusals: %v", layout, err)
		}
		if err := checkGathered(g, seed, pw, 1, bufs[0].Bytes()[:2*stride], stride); err != nil {
			t.Fatalf("%v: gather of layers [1,3): %v", layout, err)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGPUGatherLaneStagedAndZeroCopy: a gather larger than a lane's device
// staging (several parts, each moved by the copy engine) gives the bytes and
// plane CRCs of the generator, and the same bytes as the zero-copy gather
// (BenchOptions.ZeroCopyGather), for every layout.
func TestGPUGatherLaneStagedAndZeroCopy(t *testing.T) {
	gpuOrSkip(t)
	g := kvshape.Geometry{Layers: 3, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}
	const numPages, seed = 256, 31
	pb := g.PageBytesPerLayer()
	n := int(3*kernels.GatherStageBytes/pb) + 5 // three parts of a lane's staging and a few pages
	if n > numPages {
		t.Fatalf("%d pages to gather, %d in the pool", n, numPages)
	}
	pw := make([]int32, n)
	for i := range pw {
		pw[i] = int32((i*37 + 11) % numPages) // distinct: 37 is prime to 256
	}
	stride := int64(n) * pb
	for _, layout := range []kernels.Layout{kernels.LayoutPerLayer, kernels.LayoutCrossLayer} {
		var got [2][]byte
		for k, zc := range []bool{false, true} {
			r, err := kernels.BindBench(kernels.Config{Geometry: g, Layout: layout, NumPages: numPages,
				KV: kvTensors(t, g, layout, numPages), MaxPages: numPages}, kernels.BenchOptions{ZeroCopyGather: zc})
			if err != nil {
				t.Fatal(err)
			}
			fillAllPages(t, r, g, numPages, seed)
			buf := registeredBuffer(t, int64(g.Layers)*stride)
			crcs := make([]uint32, g.Layers*n*g.Planes)
			if err := r.GatherLane(2, pw, 0, g.Layers, buf.Addr(), stride, crcs, 0); err != nil {
				t.Fatalf("%v, zero copy %v: %v", layout, zc, err)
			}
			if err := checkGathered(g, seed, pw, 0, buf.Bytes(), stride); err != nil {
				t.Errorf("%v, zero copy %v: %v", layout, zc, err)
			}
			if err := checkPlaneCRCs(g, n, buf.Bytes(), stride, crcs); err != nil {
				t.Errorf("%v, zero copy %v: %v", layout, zc, err)
			}
			got[k] = append([]byte(nil), buf.Bytes()...)
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got[0], got[1]) {
			t.Errorf("%v: the staged gather's bytes differ from the zero-copy gather's", layout)
		}
	}
}

// TestGPUGatherLaneAfterEvent: an engine writes its pages on a stream of its
// own, behind a spin, and records an event; a gather given that event copies
// what the engine wrote, though its host never waited for the engine's
// stream. The control, the same gather without the event, copies the bytes
// from before the engine's writes: the ordering is the event's.
func TestGPUGatherLaneAfterEvent(t *testing.T) {
	gpuOrSkip(t)
	g := kvshape.Geometry{Layers: 3, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}
	const numPages, spin = 32, 300 * time.Millisecond
	pw := []int32{3, 17, 9, 30}
	stride := int64(len(pw)) * g.PageBytesPerLayer()
	for _, layout := range []kernels.Layout{kernels.LayoutPerLayer, kernels.LayoutCrossLayer} {
		r, err := kernels.Bind(kernels.Config{Geometry: g, Layout: layout, NumPages: numPages, KV: kvTensors(t, g, layout, numPages), MaxPages: numPages})
		if err != nil {
			t.Fatal(err)
		}
		buf := registeredBuffer(t, int64(g.Layers)*stride)
		for _, c := range []struct {
			name        string
			afterEvent  bool
			old, engine byte
		}{{"after the event", true, 0x11, 0x5A}, {"control: no event", false, 0x22, 0x6B}} {
			if err := testkit.FillKV(r, c.old); err != nil {
				t.Fatal(err)
			}
			ev, err := testkit.FillKVAfter(r, c.engine, spin)
			if err != nil {
				t.Fatal(err)
			}
			if done, err := testkit.EventDone(ev); err != nil || done {
				t.Fatalf("%v, %s: the engine's event completed before the gather (%v): the spin is too short to test", layout, c.name, err)
			}
			after := uintptr(0)
			if c.afterEvent {
				after = ev
			}
			if err := r.GatherLane(1, pw, 0, g.Layers, buf.Addr(), stride, nil, after); err != nil {
				t.Fatalf("%v, %s: %v", layout, c.name, err)
			}
			want := c.old
			if c.afterEvent {
				want = c.engine
			}
			for i, b := range buf.Bytes() {
				if b != want {
					t.Errorf("%v, %s: gathered byte %d is %#x, want %#x", layout, c.name, i, b, want)
					break
				}
			}
			// The next fill must not race the engine's: wait for its event, at most 20 spins' time.
			for i := 0; ; i++ {
				done, err := testkit.EventDone(ev)
				if err != nil {
					t.Fatal(err)
				}
				if done {
					break
				}
				if i == int(20*spin/(10*time.Millisecond)) {
					t.Fatalf("%v, %s: the engine's event is not done %v after its spin", layout, c.name, 20*spin)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := testkit.EventDestroy(ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// gatherLaneRefusals: what GatherLane refuses before any copy (ErrInvalid).
func gatherLaneRefusals(t *testing.T, r *kernels.Restorer, g kvshape.Geometry, numPages int, buf *uring.Buffer, stride int64) {
	t.Helper()
	few := []int32{0, 1, 2}
	many := make([]int32, r.Limits().MaxPages+1)
	for i := range many {
		many[i] = int32(i % numPages)
	}
	unregistered, err := uring.AllocBuffer(int(stride))
	if err != nil {
		t.Fatal(err)
	}
	defer unregistered.Free()
	for _, c := range []struct {
		name   string
		lane   int
		pages  []int32
		dst    uintptr
		stride int64
	}{
		{"lane past the last", r.GatherLanes(), few, buf.Addr(), stride},
		{"negative lane", -1, few, buf.Addr(), stride},
		{"more pages than MaxPages", 0, many, buf.Addr(), int64(len(many)) * g.PageBytesPerLayer()},
		{"unregistered destination", 0, few, unregistered.Addr(), stride},
		{"destination past the registered buffer", 0, few, buf.Addr() + uintptr(buf.Len()) - uintptr(stride) + 4096, stride},
		{"misaligned destination", 0, few, buf.Addr() + 8, stride},
		{"misaligned stride", 0, few, buf.Addr(), int64(len(few))*g.PageBytesPerLayer() + 8},
	} {
		if err := r.GatherLane(c.lane, c.pages, 0, 1, c.dst, c.stride, nil, 0); !errors.Is(err, kernels.ErrInvalid) {
			t.Errorf("gather lane, %s: %v, want ErrInvalid", c.name, err)
		}
	}
	if err := r.GatherLane(0, few, 0, 1, buf.Addr(), stride, make([]uint32, len(few)*g.Planes-1), 0); !errors.Is(err, kernels.ErrInvalid) {
		t.Errorf("gather lane, one plane CRC short: %v, want ErrInvalid", err)
	}
}

// checkPlaneCRCs holds the GPU's plane CRCs of a gather of n pages of every
// layer (layer l at l*stride in buf) to hash/crc32's CRC32C of the bytes
// gathered.
func checkPlaneCRCs(g kvshape.Geometry, n int, buf []byte, stride int64, crcs []uint32) error {
	pb, ppb := g.PageBytesPerLayer(), g.PageBytesPerPlane()
	bad := 0
	for l := 0; l < g.Layers; l++ {
		for i := 0; i < n; i++ {
			for p := 0; p < g.Planes; p++ {
				off := int64(l)*stride + int64(i)*pb + int64(p)*ppb
				if objmap.CRC32C(buf[off:off+ppb]) != crcs[(l*n+i)*g.Planes+p] {
					bad++
				}
			}
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d plane CRCs differ from the gathered bytes' CRC32C", bad, len(crcs))
	}
	return nil
}
