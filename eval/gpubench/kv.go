package gpubench

import (
	"fmt"
	goruntime "runtime"
	"sync"
	"sync/atomic"

	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

// KV is an engine's KV memory for a benchmark (gpubench's product-path rows,
// `tutti serve-bench`): host memory (store-cpu) or HBM tensors with a host
// mirror they are filled from (store-gpu). In gpubench's rows page i of the
// prefix lives at engine page dst[i] and holds internal/kvdata's content of
// Key{Block: seed + i, Layer, Plane, Page: 0}, the content testkit's GPU
// verify checks. Free releases both.
type KV struct {
	G        kvshape.Geometry
	NumPages int
	Host     *runtime.HostKV // store-cpu: the KV; store-gpu: the mirror
	Dev      []uint64        // store-gpu: one tensor per layer
	Device   int
}

// NewKV allocates per-layer KV memory; onGPU puts it in HBM on device.
func NewKV(g kvshape.Geometry, numPages int, onGPU bool, device int) (*KV, error) {
	h, err := runtime.AllocHostKV(g, kvshape.LayoutPerLayer, numPages)
	if err != nil {
		return nil, err
	}
	k := &KV{G: g, NumPages: numPages, Host: h, Device: device}
	if !onGPU {
		return k, nil
	}
	for _, r := range h.Memory().Layers {
		p, err := kernels.DevAllocOn(device, r.LenBytes)
		if err != nil {
			k.Free()
			return nil, fmt.Errorf("KV tensors in HBM: %w", err)
		}
		k.Dev = append(k.Dev, p)
	}
	return k, nil
}

// Memory is what the store registers.
func (k *KV) Memory() runtime.KVMemory {
	if k.Dev == nil {
		return k.Host.Memory()
	}
	var m runtime.KVMemory
	for i, r := range k.Host.Memory().Layers {
		m.Layers = append(m.Layers, runtime.Region{Addr: uintptr(k.Dev[i]), LenBytes: r.LenBytes})
	}
	return m
}

func (k *KV) Free() {
	for _, p := range k.Dev {
		kernels.DevFree(p)
	}
	k.Dev = nil
	k.Host.Free()
}

// forLayers runs f for every layer on up to GOMAXPROCS goroutines and
// returns the first error.
func forLayers(layers int, f func(l int) error) error {
	var next atomic.Int64
	var first error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < min(layers, goruntime.GOMAXPROCS(0)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := int(next.Add(1) - 1); l < layers; l = int(next.Add(1) - 1) {
				if err := f(l); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// fill writes the prefix's content into the pages dst (and uploads it to
// HBM on store-gpu).
func (k *KV) fill(seed uint64, dst []int32) error {
	err := forLayers(k.G.Layers, func(l int) error {
		for i, p := range dst {
			for pl := 0; pl < k.G.Planes; pl++ {
				kvdata.Fill(k.Host.Page(l, pl, p), kvdata.Key{Block: seed + uint64(i), Layer: l, Plane: pl})
			}
		}
		return nil
	})
	if err != nil || k.Dev == nil {
		return err
	}
	return k.Upload()
}

// Upload copies the host pages into the HBM tensors (store-gpu; a no-op
// on store-cpu, whose KV is the host memory).
func (k *KV) Upload() error {
	if k.Dev == nil {
		return nil
	}
	for i, r := range k.Host.Memory().Layers {
		if err := kernels.CopyToDevice(k.Dev[i], r.Addr, r.LenBytes); err != nil {
			return fmt.Errorf("uploading layer %d: %w", i, err)
		}
	}
	return nil
}

// poison sets every byte of the KV memory to 0xA5, so that a page a restore
// did not write cannot verify.
func (k *KV) poison() error {
	if k.Dev == nil {
		return forLayers(k.G.Layers, func(l int) error {
			for p := 0; p < k.NumPages; p++ {
				for pl := 0; pl < k.G.Planes; pl++ {
					b := k.Host.Page(l, pl, int32(p))
					for i := range b {
						b[i] = 0xA5
					}
				}
			}
			return nil
		})
	}
	for i, r := range k.Host.Memory().Layers {
		if err := kernels.MemsetDevice(k.Dev[i], 0xA5, r.LenBytes); err != nil {
			return fmt.Errorf("poisoning layer %d: %w", i, err)
		}
	}
	return nil
}

// verify counts the 8-byte words of pages dst[:n] that differ from their
// content: in HBM with testkit's kernel (store-gpu), on the CPU otherwise.
func (k *KV) verify(seed uint64, dst []int32) (uint64, error) {
	if len(dst) == 0 {
		return 0, nil
	}
	if k.Dev != nil {
		pm := make([]kernels.PageMap, len(dst))
		for i, p := range dst {
			pm[i] = kernels.PageMap{DstPage: uint32(p)}
		}
		cfg := kernels.Config{Device: k.Device, Geometry: k.G, Layout: kernels.LayoutPerLayer,
			NumPages: k.NumPages, KV: k.Dev}
		return testkit.VerifyTensors(cfg, seed, pm, 0, k.G.Layers)
	}
	var bad atomic.Uint64
	err := forLayers(k.G.Layers, func(l int) error {
		want := make([]byte, k.G.PageBytesPerPlane())
		for i, p := range dst {
			for pl := 0; pl < k.G.Planes; pl++ {
				key := kvdata.Key{Block: seed + uint64(i), Layer: l, Plane: pl}
				got := k.Host.Page(l, pl, p)
				if kvdata.Verify(got, key) < 0 {
					continue
				}
				kvdata.Fill(want, key)
				bad.Add(diffWords(got, want))
			}
		}
		return nil
	})
	return bad.Load(), err
}

// diffWords counts the 8-byte words in which a and b differ.
func diffWords(a, b []byte) uint64 {
	var n uint64
	for i := 0; i+8 <= len(a) && i+8 <= len(b); i += 8 {
		if string(a[i:i+8]) != string(b[i:i+8]) {
			n++
		}
	}
	return n
}
