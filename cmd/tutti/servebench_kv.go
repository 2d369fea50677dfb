package main

import (
	"github.com/tutti-io/tutti/eval/gpubench"
	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/kvshape"
)

// benchKV is a serve-bench engine's KV memory: host pages (--path cpu), or
// HBM tensors filled from a host mirror (--path gpu). Page j of chain block
// id holds internal/kvdata's Key{Block: pageSeed(id, j), Layer, Plane}, the
// content testkit's GPU verify checks, so either path verifies what the
// other saved.
type benchKV struct {
	*gpubench.KV
}

func pageSeed(id uint64, j int, g kvshape.Geometry) uint64 {
	return id*uint64(g.ChunkPages) + uint64(j)
}

func newServeBenchKV(g kvshape.Geometry, numPages int, onGPU bool, device int) (*benchKV, error) {
	k, err := gpubench.NewKV(g, numPages, onGPU, device)
	if err != nil {
		return nil, err
	}
	return &benchKV{k}, nil
}

// fill writes chain's content into its pages (and uploads it to HBM).
func (k *benchKV) fill(chain []uint64, pages []int32) error {
	g := k.G
	for i, id := range chain {
		for j := range g.ChunkPages {
			for l := range g.Layers {
				for pl := range g.Planes {
					kvdata.Fill(k.Host.Page(l, pl, pages[i*g.ChunkPages+j]), kvdata.Key{Block: pageSeed(id, j, g), Layer: l, Plane: pl})
				}
			}
		}
	}
	return k.Upload()
}

// verify counts chain's pages that do not hold their content (checked bytes:
// verified).
func (k *benchKV) verify(chain []uint64, pages []int32) (bad, verified int64, err error) {
	g := k.G
	for i, id := range chain {
		pp := pages[i*g.ChunkPages : (i+1)*g.ChunkPages]
		verified += int64(len(pp)) * g.PageBytesPerLayer() * int64(g.Layers)
		if k.Dev != nil {
			pm := make([]kernels.PageMap, len(pp))
			for j, p := range pp {
				pm[j] = kernels.PageMap{DstPage: uint32(p)}
			}
			cfg := kernels.Config{Device: k.Device, Geometry: g, Layout: kernels.LayoutPerLayer, NumPages: k.NumPages, KV: k.Dev}
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
					if kvdata.Verify(k.Host.Page(l, pl, p), kvdata.Key{Block: pageSeed(id, j, g), Layer: l, Plane: pl}) >= 0 {
						bad++
					}
				}
			}
		}
	}
	return bad, verified, nil
}
