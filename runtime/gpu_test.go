package runtime

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
)

// deviceKV is KV memory in HBM plus a host mirror (HostKV) to fill and
// check it.
type deviceKV struct {
	mirror *HostKV
	dev    []uint64
	mem    KVMemory
}

func newDeviceKV(t testing.TB, g kvshape.Geometry, layout kvshape.Layout, numPages int) *deviceKV {
	t.Helper()
	h, err := AllocHostKV(g, layout, numPages)
	if err != nil {
		t.Fatal(err)
	}
	d := &deviceKV{mirror: h}
	hm := h.Memory()
	regions := hm.Layers
	if layout == kvshape.LayoutCrossLayer {
		regions = []Region{hm.Cross}
	}
	for _, r := range regions {
		p, err := kernels.DevAlloc(r.LenBytes)
		if err != nil {
			t.Fatal(err)
		}
		d.dev = append(d.dev, p)
		if layout == kvshape.LayoutPerLayer {
			d.mem.Layers = append(d.mem.Layers, Region{Addr: uintptr(p), LenBytes: r.LenBytes})
		} else {
			d.mem.Cross = Region{Addr: uintptr(p), LenBytes: r.LenBytes}
		}
	}
	t.Cleanup(func() {
		for _, p := range d.dev {
			kernels.DevFree(p)
		}
		h.Free()
	})
	return d
}

func (d *deviceKV) regions() (host, dev []Region) {
	hm := d.mirror.Memory()
	if len(hm.Layers) > 0 {
		return hm.Layers, d.mem.Layers
	}
	return []Region{hm.Cross}, []Region{d.mem.Cross}
}

func (d *deviceKV) upload(t testing.TB) {
	t.Helper()
	host, dev := d.regions()
	for i := range host {
		if err := kernels.CopyToDevice(uint64(dev[i].Addr), host[i].Addr, host[i].LenBytes); err != nil {
			t.Fatal(err)
		}
	}
}

func (d *deviceKV) download(t testing.TB) {
	t.Helper()
	host, dev := d.regions()
	for i := range host {
		if err := kernels.CopyToHost(host[i].Addr, uint64(dev[i].Addr), host[i].LenBytes); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGPURoundTrip saves KV from HBM (gathered by the GPU), restores it with
// GPU-driven reads into other pages, checks it bit-exact, then reopens the
// store on the CPU path and restores the same runs there. It skips where the
// GPU path cannot run (the reason is printed).
func TestGPURoundTrip(t *testing.T) {
	g := tinyGeometry()
	for _, layout := range []kvshape.Layout{kvshape.LayoutPerLayer, kvshape.LayoutCrossLayer} {
		t.Run(layout.String(), func(t *testing.T) {
			const numPages = 64
			cfg := testConfig(t, g, layout, numPages)
			cfg.Path = PathGPU
			s, err := Open(cfg)
			if errors.Is(err, ErrGPUUnavailable) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			d := newDeviceKV(t, g, layout, numPages)
			if err := s.RegisterKV(d.mem); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(5, 5))
			a := chainOf(7000, 6)
			pa := pageTable(rng, g, numPages, len(a))
			fill(d.mirror, g, a, pa)
			d.upload(t)
			if sv := saveWait(t, s, a, pa); sv.Saved() != len(a) {
				t.Fatalf("saved %d of %d: %v", sv.Saved(), len(a), s.Stats())
			}
			b := append(append([]uint64(nil), a...), chainOf(8000, 3)...)
			pb := pageTable(rng, g, numPages, len(b))
			fill(d.mirror, g, b, pb)
			d.upload(t)
			if sv := saveWait(t, s, b, pb); sv.Saved() != 3 {
				t.Fatalf("extension saved %d of 3: %v", sv.Saved(), s.Stats())
			}

			scramble(d.mirror, g, numPages)
			d.upload(t)
			p2 := pageTable(rng, g, numPages, len(b))
			l := loadWait(t, s, b, p2)
			if l.Blocks() != len(b) {
				t.Fatalf("GPU restore: %d of %d blocks: %v", l.Blocks(), len(b), s.Stats())
			}
			d.download(t)
			if err := verify(d.mirror, g, b, p2, len(b)); err != nil {
				t.Fatalf("GPU restore: %v", err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}

			// The same store on the CPU path: what the GPU saved restores here.
			cfg.Path = PathCPU
			cs, kv := openKV(t, cfg)
			defer closeKV(t, cs, kv)
			p3 := pageTable(rng, g, numPages, len(b))
			if l := loadWait(t, cs, b, p3); l.Blocks() != len(b) {
				t.Fatalf("CPU restore of GPU saves: %d of %d", l.Blocks(), len(b))
			}
			if err := verify(kv, g, b, p3, len(b)); err != nil {
				t.Fatalf("CPU restore of GPU saves: %v", err)
			}
		})
	}
}

// TestGPUConcurrentLoads: more loads of one store in flight than the
// kernels take restores live at once (MaxRequests, 4; vLLM's step of 5
// restored requests): every one restores whole, bit-exact, none fails with
// the kernels' ErrBusy. It skips where the GPU path cannot run.
func TestGPUConcurrentLoads(t *testing.T) {
	const numPages, loads, blocks = 64, 6, 2
	g := tinyGeometry()
	cfg := testConfig(t, g, kvshape.LayoutPerLayer, numPages)
	cfg.Path = PathGPU
	s, err := Open(cfg)
	if errors.Is(err, ErrGPUUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	d := newDeviceKV(t, g, kvshape.LayoutPerLayer, numPages)
	if err := s.RegisterKV(d.mem); err != nil {
		t.Fatal(err)
	}
	chains, tables := disjointLoads(rand.New(rand.NewPCG(5, 6)), g, numPages, loads, blocks, 7100)
	for i := range chains {
		fill(d.mirror, g, chains[i], tables[i])
	}
	d.upload(t)
	for i := range chains {
		if sv := saveWait(t, s, chains[i], tables[i]); sv.Saved() != blocks {
			t.Fatalf("chain %d: saved %d of %d: %v", i, sv.Saved(), blocks, s.Stats())
		}
	}
	scramble(d.mirror, g, numPages)
	d.upload(t)
	ls := make([]*Load, loads)
	for i := range ls { // back to back: the first ones are still on the GPU when the last start
		if ls[i], err = s.Load(chains[i], tables[i]); err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
	}
	for i, l := range ls {
		if err := l.Wait(); err != nil || l.Blocks() != blocks {
			t.Fatalf("load %d of %d in flight: %d of %d blocks, %v (%v)", i, loads, l.Blocks(), blocks, err, l.Failure())
		}
	}
	d.download(t)
	for i := range ls {
		if err := verify(d.mirror, g, chains[i], tables[i], blocks); err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
	}
}
