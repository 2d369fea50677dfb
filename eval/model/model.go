// Package model holds the model profiles of the evaluation: real KV-cache
// shapes (layers, KV heads, head dim, dtype, planes) and the prefill cost
// (FLOPs per token as a function of context), so bytes per block and the time
// to recompute a prefix follow from the shape instead of being made up.
//
// Shapes are taken from each model's published config.json (cited per
// profile). The KV cache is paged as an engine pages it: PageTokens tokens per
// page (vLLM's 16), ChunkPages pages per chain block (512-token Mooncake blocks
// at 16-token pages = 32).
package model

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tutti-io/tutti/kvshape"
)

// Profile is one model.
type Profile struct {
	Name   string
	Source string // where the numbers come from
	// Shape is the KV-cache shape as an engine pages it (kvshape's geometry:
	// KVHeads is 1 and HeadDim kv_lora_rank+qk_rope_head_dim for MLA's latent).
	Shape kvshape.Geometry

	HiddenSize int
	QHeads     int // attention (query) heads
	// QKDim and VDim are the per-head dims of the attention products (QK^T
	// and A·V); for GQA both are the head dim, for MLA prefill (weights not
	// absorbed) QK uses nope+rope dims and AV the value head dim.
	QKDim, VDim int

	// Params is the total parameter count; ActiveParams the parameters one
	// token passes through (equal for dense models, the activated experts'
	// share for MoE).
	Params, ActiveParams float64
}

// KVBytesPerToken is the KV cache one token occupies over all layers:
// Layers * Planes * KVHeads * HeadDim * dtype bytes.
func (p Profile) KVBytesPerToken() int64 {
	return int64(p.Shape.Layers) * p.Shape.PageBytesPerLayer() / int64(p.Shape.PageTokens)
}

// KVBytesPerTokenLayer is one token's KV in one layer (all planes).
func (p Profile) KVBytesPerTokenLayer() int64 { return p.KVBytesPerToken() / int64(p.Shape.Layers) }

// BlockTokens is the tokens of one chain block: PageTokens * ChunkPages.
func (p Profile) BlockTokens() int { return p.Shape.PageTokens * p.Shape.ChunkPages }

// BlockBytes is the KV payload of one chain block over all layers.
func (p Profile) BlockBytes() int64 { return int64(p.BlockTokens()) * p.KVBytesPerToken() }

// PageBytesPerPlane is one engine page of one plane of one layer.
func (p Profile) PageBytesPerPlane() int64 { return p.Shape.PageBytesPerPlane() }

// LinearFLOPsPerToken is the weight-matmul work of one token: 2 FLOPs
// (multiply, add) per active parameter.
func (p Profile) LinearFLOPsPerToken() float64 { return 2 * p.ActiveParams }

// AttnFLOPsPerContextToken is the attention work that one new token spends
// per token of context it attends to, over all layers: QK^T (2*QKDim) and
// A·V (2*VDim) per query head.
func (p Profile) AttnFLOPsPerContextToken() float64 {
	return float64(p.Shape.Layers) * float64(p.QHeads) * 2 * float64(p.QKDim+p.VDim)
}

// PrefillFLOPsPerToken is the prefill work of the token at 0-based position
// pos (it attends causally to pos+1 tokens).
func (p Profile) PrefillFLOPsPerToken(pos int) float64 {
	return p.LinearFLOPsPerToken() + p.AttnFLOPsPerContextToken()*float64(pos+1)
}

// PrefillFLOPs is the work of prefilling newTokens tokens after cachedTokens
// tokens whose KV is already present (restored or resident):
// new*2*ActiveParams + attn * sum_{pos=cached}^{cached+new-1} (pos+1).
func (p Profile) PrefillFLOPs(cachedTokens, newTokens int) float64 {
	if newTokens <= 0 {
		return 0
	}
	c, n := float64(cachedTokens), float64(newTokens)
	ctxSum := n*c + n*(n+1)/2
	return n*p.LinearFLOPsPerToken() + p.AttnFLOPsPerContextToken()*ctxSum
}

// PrefillFLOPsPerLayer is PrefillFLOPs spread evenly over the layers (the
// per-layer compute a layer-wise restore overlaps with).
func (p Profile) PrefillFLOPsPerLayer(cachedTokens, newTokens int) float64 {
	return p.PrefillFLOPs(cachedTokens, newTokens) / float64(p.Shape.Layers)
}

// Validate checks the profile is usable: its shape (kvshape's rules) and its
// compute description.
func (p Profile) Validate() error {
	if err := p.Shape.Validate(); err != nil {
		return fmt.Errorf("model %s: %w", p.Name, err)
	}
	switch {
	case p.ActiveParams <= 0 || p.Params < p.ActiveParams:
		return fmt.Errorf("model %s: params %v active %v", p.Name, p.Params, p.ActiveParams)
	case p.QHeads < 1 || p.QKDim < 1 || p.VDim < 1 || p.HiddenSize < 1:
		return fmt.Errorf("model %s: attention dims missing", p.Name)
	}
	return nil
}

// Mooncake's 512-token blocks at vLLM's 16-token pages.
const (
	defaultPageTokens = 16
	defaultChunkPages = 32
)

var profiles = map[string]Profile{
	// meta-llama/Meta-Llama-3-8B config.json: hidden_size 4096, num_hidden_layers 32,
	// num_attention_heads 32, num_key_value_heads 8 (head dim 4096/32 = 128),
	// torch_dtype bfloat16. 8.03B parameters (model card).
	"llama3-8b": {
		Name: "llama3-8b", Source: "huggingface.co/meta-llama/Meta-Llama-3-8B config.json",
		Shape:      kvshape.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: defaultPageTokens, ChunkPages: defaultChunkPages},
		HiddenSize: 4096, QHeads: 32, QKDim: 128, VDim: 128,
		Params: 8.03e9, ActiveParams: 8.03e9,
	},
	// meta-llama/Meta-Llama-3-70B config.json: hidden_size 8192, num_hidden_layers 80,
	// num_attention_heads 64, num_key_value_heads 8 (head dim 128), bfloat16.
	// 70.6B parameters (model card).
	"llama3-70b": {
		Name: "llama3-70b", Source: "huggingface.co/meta-llama/Meta-Llama-3-70B config.json",
		Shape:      kvshape.Geometry{Layers: 80, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: defaultPageTokens, ChunkPages: defaultChunkPages},
		HiddenSize: 8192, QHeads: 64, QKDim: 128, VDim: 128,
		Params: 70.6e9, ActiveParams: 70.6e9,
	},
	// Qwen/Qwen3-32B config.json: hidden_size 5120, num_hidden_layers 64,
	// num_attention_heads 64, num_key_value_heads 8, head_dim 128, bfloat16.
	// 32.8B parameters (model card).
	"qwen3-32b": {
		Name: "qwen3-32b", Source: "huggingface.co/Qwen/Qwen3-32B config.json",
		Shape:      kvshape.Geometry{Layers: 64, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: defaultPageTokens, ChunkPages: defaultChunkPages},
		HiddenSize: 5120, QHeads: 64, QKDim: 128, VDim: 128,
		Params: 32.8e9, ActiveParams: 32.8e9,
	},
	// deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, num_hidden_layers 61,
	// num_attention_heads 128, MLA with kv_lora_rank 512 and qk_rope_head_dim 64
	// (the cached latent: one plane of 512+64 = 576 dims), qk_nope_head_dim 128,
	// v_head_dim 128; the KV cache is kept in bf16 here. 671B parameters, 37B
	// activated per token (technical report, arXiv 2412.19437).
	"deepseek-v3": {
		Name: "deepseek-v3", Source: "huggingface.co/deepseek-ai/DeepSeek-V3 config.json; arXiv 2412.19437",
		Shape:      kvshape.Geometry{Layers: 61, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16, Planes: 1, PageTokens: defaultPageTokens, ChunkPages: defaultChunkPages},
		HiddenSize: 7168, QHeads: 128, QKDim: 128 + 64, VDim: 128,
		Params: 671e9, ActiveParams: 37e9,
	},
	// tiny is a test shape, not a real model: small enough that the embedded
	// replay window runs in seconds on two cores (1 KiB of KV per token,
	// 512 KiB per 512-token block), and one page of one plane is
	// 16 tokens * 2 heads * 64 dims * 2 bytes = 4 KiB so per-page O_DIRECT
	// I/O stays aligned. Its compute stand-in (220M parameters) keeps
	// llama3-70b's ratio of prefill FLOPs to KV bytes (2*70.6e9 / 320 KiB ≈
	// 2*220e6 / 1 KiB), so the load-versus-recompute trade-off of a tiny
	// replay resembles a real long-context model's.
	"tiny": {
		Name: "tiny", Source: "test shape (not a real model); compute scaled to llama3-70b's FLOPs per KV byte",
		Shape:      kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: defaultPageTokens, ChunkPages: defaultChunkPages},
		HiddenSize: 512, QHeads: 8, QKDim: 64, VDim: 64,
		Params: 220e6, ActiveParams: 220e6,
	},
}

// Lookup returns the profile named name.
func Lookup(name string) (Profile, error) {
	p, ok := profiles[name]
	if !ok {
		return Profile{}, fmt.Errorf("unknown model %q (have %s)", name, strings.Join(Names(), ", "))
	}
	return p, nil
}

// Names lists the profile names, sorted.
func Names() []string {
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
