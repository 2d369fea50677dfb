package kvshape

import (
	"errors"
	"fmt"
)

// Limits on a Geometry. They keep every byte size far from int64 overflow
// and within what a store keeps per run: its run header holds one CRC per
// layer beside the run's chain ids, and one chunk of one layer is one I/O.
const (
	MaxLayers     = 256
	MaxKVHeads    = 1024
	MaxHeadDim    = 65536
	MaxPageTokens = 65536
	MaxChunkPages = 65536
	// MaxChunkBytesPerLayer bounds one chunk of one layer (1 GiB), so an
	// object of a run's chunks stays well inside int64 and a chunk fits
	// one uring op (uint32 length).
	MaxChunkBytesPerLayer = 1 << 30
)

// ErrGeometry is wrapped by every Validate error.
var ErrGeometry = errors.New("kvshape: invalid geometry")

// Geometry is the KV shape of one model as the engine pages it. A store is
// written for exactly one Geometry (objmap fingerprints it into every run
// header), so a store written for another shape is never served. Its JSON
// form is the store manifest's and the reports'.
type Geometry struct {
	Layers  int   `json:"layers"`
	KVHeads int   `json:"kv_heads"`
	HeadDim int   `json:"head_dim"`
	DType   DType `json:"dtype"`
	// Planes is 2 for separate K and V tensors (MHA/GQA) and 1 for one latent
	// plane (MLA, DeepSeek-V3: 576 dims, 1 head).
	Planes int `json:"planes"`
	// PageTokens is the tokens per paged KV block of the engine (vLLM: 16).
	PageTokens int `json:"page_tokens"`
	// ChunkPages is the pages per chain block (the hash granularity): 1 for
	// vLLM block hashing, 32 for Mooncake's 512-token blocks at 16-token pages.
	ChunkPages int `json:"chunk_pages"`
}

func geomErr(field string, v, lo, hi int) error {
	return fmt.Errorf("%w: %s = %d, want %d..%d", ErrGeometry, field, v, lo, hi)
}

// Validate reports the first bad field by name.
func (g Geometry) Validate() error {
	if g.Layers < 1 || g.Layers > MaxLayers {
		return geomErr("Layers", g.Layers, 1, MaxLayers)
	}
	if g.KVHeads < 1 || g.KVHeads > MaxKVHeads {
		return geomErr("KVHeads", g.KVHeads, 1, MaxKVHeads)
	}
	if g.HeadDim < 1 || g.HeadDim > MaxHeadDim {
		return geomErr("HeadDim", g.HeadDim, 1, MaxHeadDim)
	}
	if g.DType.Bytes() == 0 {
		return fmt.Errorf("%w: DType = %d is not one of bf16, fp16, fp8, fp32", ErrGeometry, uint8(g.DType))
	}
	if g.Planes != 1 && g.Planes != 2 {
		return fmt.Errorf("%w: Planes = %d, want 1 (MLA latent) or 2 (K and V)", ErrGeometry, g.Planes)
	}
	if g.PageTokens < 1 || g.PageTokens > MaxPageTokens {
		return geomErr("PageTokens", g.PageTokens, 1, MaxPageTokens)
	}
	if g.ChunkPages < 1 || g.ChunkPages > MaxChunkPages {
		return geomErr("ChunkPages", g.ChunkPages, 1, MaxChunkPages)
	}
	// Each factor is bounded above, so these products fit in int64; check
	// the chunk against its own bound.
	if cb := g.ChunkBytesPerLayer(); cb > MaxChunkBytesPerLayer {
		return fmt.Errorf("%w: one chunk of one layer is %d bytes (ChunkPages*Planes*PageTokens*KVHeads*HeadDim*dtype), want <= %d",
			ErrGeometry, cb, MaxChunkBytesPerLayer)
	}
	return nil
}

// PageBytesPerPlane is one page of one plane of one layer:
// PageTokens*KVHeads*HeadDim*dtype.
func (g Geometry) PageBytesPerPlane() int64 {
	return int64(g.PageTokens) * int64(g.KVHeads) * int64(g.HeadDim) * int64(g.DType.Bytes())
}

// PageBytesPerLayer is one page of one layer, all planes (K and V together).
func (g Geometry) PageBytesPerLayer() int64 { return int64(g.Planes) * g.PageBytesPerPlane() }

// ChunkBytesPerLayer is one chain block of one layer: ChunkPages pages.
func (g Geometry) ChunkBytesPerLayer() int64 { return int64(g.ChunkPages) * g.PageBytesPerLayer() }

// ChunkBytes is one chain block over all layers (the payload it adds to a run).
func (g Geometry) ChunkBytes() int64 { return int64(g.Layers) * g.ChunkBytesPerLayer() }

func (g Geometry) String() string {
	return fmt.Sprintf("layers=%d kv_heads=%d head_dim=%d dtype=%s planes=%d page_tokens=%d chunk_pages=%d",
		g.Layers, g.KVHeads, g.HeadDim, g.DType, g.Planes, g.PageTokens, g.ChunkPages)
}
