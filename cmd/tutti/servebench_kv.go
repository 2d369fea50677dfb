package main

import (
	"fmt"

	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

// benchKV is a serve-bench engine's KV memory: host pages (--path cpu), or
// HBM tensors filled from a host mirror (--path gpu). Page j of chain block
// id holds internal/kvdata's Key{Block: pageSeed(id, j), Layer, Plane}, the
// content testkit's GPU verify checks, so either path verifies what the
// other saved.
type benchKV struct {
	g        kvshape.Geometry
	numPages int
	host     *runtime.HostKV
	dev      []uint64 // --path gpu: one tensor per layer
	device   int
}

func pageSeed(id uint64, j int, g kvshape.Geometry) uint64 {
	return id*uint64(g.ChunkPages) + uint64(j)
}

func newServeBenchKV(g kvshape.Geometry, numPages int, onGPU bool, device int) (*benchKV, error) {
	h, err := runtime.AllocHostKV(g, kvshape.LayoutPerLayer, numPages)
	if err != nil {
		return nil, err
	}
	k := &benchKV{g: g, numPages: numPages, host: h, device: device}
	if !onGPU {
		return k, nil
	}
	for _, r := range h.Memory().Layers {
		p, err := kernels.DevAllocOn(device, r.LenBytes)
		if err != nil {
			k.free()
			return nil, fmt.Errorf("KV tensors in HBM: %w", err)
		}
		k.dev = append(k.dev, p)
	}
	return k, nil
}

func (k *benchKV) memory() runtime.KVMemory {
	if k.dev == nil {
		return k.host.Memory()
	}
	var m runtime.KVMemory
	for i, r := range k.host.Memory().Layers {
		m.Layers = append(m.Layers, runtime.Region{Addr: uintptr(k.dev[i]), LenBytes: r.LenBytes})
	}
	return m
}

func (k *benchKV) free() {
	for _, p := range k.dev {
		_ = kernels.DevFree(p)
	}
	k.dev = nil
	_ = k.host.Free()
}

// fill writes chain's content into its pages (and uploads it to HBM).
func (k *benchKV) fill(chain []uint64, pages []int32) error {
	g := k.g
	for i, id := range chain {
		for j := range g.ChunkPages {
			for l := range g.Layers {
				for pl := range g.Planes {
					kvdata.Fill(k.host.Page(l, pl, pages[i*g.ChunkPages+j]), kvdata.Key{Block: pageSeed(id, j, g), Layer: l, Plane: pl})
				}
			}
		}
	}
	for i, r := range k.host.Memory().Layers {
		if k.dev == nil {
			break
		}
		if err := kernels.CopyToDevice(k.dev[i], r.Addr, r.LenBytes); err != nil {
			return fmt.Errorf("uploading layer %d: %w", i, err)
		}
	}
	return nil
}

// verify counts chain's pages that do not hold their content (checked bytes:
// verified).
func (k *benchKV) verify(chain []uint64, pages []int32) (bad, verified int64, err error) {
	g := k.g
	for i, id := range chain {
		pp := pages[i*g.ChunkPages : (i+1)*g.ChunkPages]
		verified += int64(len(pp)) * g.PageBytesPerLayer() * int64(g.Layers)
		if k.dev != nil {
			pm := make([]kernels.PageMap, len(pp))
			for j, p := range pp {
				pm[j] = kernels.PageMap{DstPage: uint32(p)}
			}
			cfg := kernels.Config{Device: k.device, Geometry: g, Layout: kernels.LayoutPerLayer, NumPages: k.numPages, KV: k.dev}
			words, err := testkit.VerifyTensors(cfg, pageSeed(id, 0, g), pm, 0, g.Layers)
			if err != nil {
				return bad, verified, err
			}
			if words > 0 {
				bad++
			}
			continue
		}
		for j, p := range pp {
			for l := range g.Layers {
				for pl := range g.Planes {
					if kvdata.Verify(k.host.Page(l, pl, p), kvdata.Key{Block: pageSeed(id, j, g), Layer: l, Plane: pl}) >= 0 {
						bad++
					}
				}
			}
		}
	}
	return bad, verified, nil
}
