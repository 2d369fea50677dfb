package tp

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

// rankDeviceKV is one rank's KV shard in HBM plus a host mirror to fill and
// check it.
type rankDeviceKV struct {
	mirror *runtime.HostKV
	dev    []uint64
	mem    runtime.KVMemory
}

func hostRegions(m runtime.KVMemory) []runtime.Region {
	if len(m.Layers) > 0 {
		return m.Layers
	}
	return []runtime.Region{m.Cross}
}

// newRankDeviceKV allocates a rank's shard in the HBM of its GPU (device).
func newRankDeviceKV(t testing.TB, device int, g kvshape.Geometry, layout kvshape.Layout, numPages int) *rankDeviceKV {
	t.Helper()
	h, err := runtime.AllocHostKV(g, layout, numPages)
	if err != nil {
		t.Fatal(err)
	}
	d := &rankDeviceKV{mirror: h}
	for _, r := range hostRegions(h.Memory()) {
		p, err := kernels.DevAllocOn(device, r.LenBytes)
		if err != nil {
			t.Fatal(err)
		}
		d.dev = append(d.dev, p)
		reg := runtime.Region{Addr: uintptr(p), LenBytes: r.LenBytes}
		if layout == kvshape.LayoutPerLayer {
			d.mem.Layers = append(d.mem.Layers, reg)
		} else {
			d.mem.Cross = reg
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

func (d *rankDeviceKV) copy(t testing.TB, toDevice bool) {
	t.Helper()
	host, dev := hostRegions(d.mirror.Memory()), hostRegions(d.mem)
	for i := range host {
		var err error
		if toDevice {
			err = kernels.CopyToDevice(uint64(dev[i].Addr), host[i].Addr, host[i].LenBytes)
		} else {
			err = kernels.CopyToHost(host[i].Addr, uint64(dev[i].Addr), host[i].LenBytes)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestGPUGroup: N ranks on the GPU path, each with its own store, ring,
// staging and restorer, save their shards from HBM (GPU gathers) and
// restore them with GPU-driven reads, all ranks at once; every rank's HBM is
// checked bit-exact against its shard. "one-device" puts every rank on
// device 0; "spread" uses the default mapping (rank r on device r mod
// visible GPUs, its KV allocated there by kernels.DevAllocOn), the same as
// one-device on a one-GPU machine. Skips (with the reason) where the GPU
// path cannot run.
func TestGPUGroup(t *testing.T) {
	g := gqaGeometry()
	for _, mode := range []string{"one-device", "spread"} {
		for _, n := range []int{1, 2, 4} {
			t.Run(fmt.Sprintf("%s/ranks=%d", mode, n), func(t *testing.T) {
				const numPages = 64
				cfg := groupConfig(t, n, g, kvshape.LayoutPerLayer, numPages)
				cfg.Store.Path = runtime.PathGPU
				if mode == "one-device" {
					cfg.Devices = make([]int, n)
				}
				grp, err := Open(cfg)
				if errors.Is(err, runtime.ErrGPUUnavailable) && !kernels.Explicit() {
					t.Skip(err) // TUTTI_KERNELS_LIB set: the GPU path must run
				}
				if err != nil {
					t.Fatal(err)
				}
				defer grp.Close()
				tg := &group{Group: grp, full: g, numPages: numPages}
				devs := make([]*rankDeviceKV, n)
				for r := range devs {
					devs[r] = newRankDeviceKV(t, grp.Device(r), grp.ShardGeometry(), cfg.Store.Layout, numPages)
					tg.kv = append(tg.kv, devs[r].mirror)
					if err := grp.RegisterKV(r, devs[r].mem); err != nil {
						t.Fatal(err)
					}
				}
				upload := func() {
					for _, d := range devs {
						d.copy(t, true)
					}
				}
				rng := rand.New(rand.NewPCG(8, uint64(n)))
				a := chainOf(7000, 6)
				pa := pageTable(rng, g, numPages, len(a))
				tg.fill(a, pa)
				upload()
				if sv := saveWait(t, tg, a, pa); sv.Saved() != len(a) || sv.Failed() != nil {
					t.Fatalf("saved %d of %d (failed: %v)", sv.Saved(), len(a), sv.Failed())
				}
				tg.scramble()
				upload()
				p2 := pageTable(rng, g, numPages, len(a))
				l := loadWait(t, tg, a, p2)
				if l.Blocks() != len(a) {
					t.Fatalf("GPU restore: %d of %d blocks: %+v", l.Blocks(), len(a), grp.Stats())
				}
				for _, d := range devs {
					d.copy(t, false)
				}
				if err := tg.verify(a, p2, len(a)); err != nil {
					t.Fatalf("GPU restore: %v", err)
				}
			})
		}
	}
}
