package objmap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc64"
)

// DType is the element type of the KV cache.
type DType uint8

// Element types. DTypeInvalid is the zero value so that a Geometry with no
// dtype set fails Validate instead of silently meaning BF16.
const (
	DTypeInvalid DType = iota
	BF16
	FP16
	FP8
	FP32
)

// Bytes is the size of one element, 0 for an unknown dtype.
func (d DType) Bytes() int {
	switch d {
	case BF16, FP16:
		return 2
	case FP8:
		return 1
	case FP32:
		return 4
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case BF16:
		return "bf16"
	case FP16:
		return "fp16"
	case FP8:
		return "fp8"
	case FP32:
		return "fp32"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// ParseDType is the inverse of String.
func ParseDType(s string) (DType, error) {
	for d := BF16; d <= FP32; d++ {
		if d.String() == s {
			return d, nil
		}
	}
	return DTypeInvalid, fmt.Errorf("objmap: unknown dtype %q (want bf16, fp16, fp8 or fp32)", s)
}

// MarshalText and UnmarshalText make a DType read as its name in the store
// manifest and in JSON reports.
func (d DType) MarshalText() ([]byte, error) {
	if d.Bytes() == 0 {
		return nil, fmt.Errorf("objmap: marshaling invalid dtype %d", uint8(d))
	}
	return []byte(d.String()), nil
}

// UnmarshalText parses a dtype name.
func (d *DType) UnmarshalText(b []byte) error {
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// Limits on a Geometry. They bound the header (one CRC per layer must fit in
// 4 KiB with room for chain ids) and keep every byte size far from int64
// overflow.
const (
	MaxLayers     = 256
	MaxKVHeads    = 1024
	MaxHeadDim    = 65536
	MaxPageTokens = 65536
	MaxChunkPages = 65536
	// MaxChunkBytesPerLayer bounds one chunk of one layer (1 GiB), so an
	// object of MaxRunChunks chunks stays well inside int64 and a chunk fits
	// one uring op (uint32 length).
	MaxChunkBytesPerLayer = 1 << 30
)

// ErrGeometry is wrapped by every Validate error.
var ErrGeometry = errors.New("objmap: invalid geometry")

// Geometry is the KV shape of one model as the engine pages it. A store is
// written for exactly one Geometry; its Fingerprint is in every run header.
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
	if MaxRunChunks(g) < 1 {
		return fmt.Errorf("%w: Layers = %d leaves no room for a chain id in the %d-byte header", ErrGeometry, g.Layers, HeaderBytes)
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

// fingerprintVersion is mixed into the fingerprint so that a change of the
// on-disk object layout (not only of the shape) invalidates old stores.
const fingerprintVersion = 1

var crc64Table = crc64.MakeTable(crc64.ECMA)

// Fingerprint is a stable hash over every field (and the object layout
// version). It is stored in each run header and in the manifest: a store
// written for another shape, dtype or block size is never served.
func (g Geometry) Fingerprint() uint64 {
	var b [8 * 8]byte
	for i, v := range []uint64{fingerprintVersion, uint64(g.Layers), uint64(g.KVHeads), uint64(g.HeadDim),
		uint64(g.DType), uint64(g.Planes), uint64(g.PageTokens), uint64(g.ChunkPages)} {
		binary.LittleEndian.PutUint64(b[i*8:], v)
	}
	return crc64.Checksum(b[:], crc64Table)
}

func (g Geometry) String() string {
	return fmt.Sprintf("layers=%d kv_heads=%d head_dim=%d dtype=%s planes=%d page_tokens=%d chunk_pages=%d",
		g.Layers, g.KVHeads, g.HeadDim, g.DType, g.Planes, g.PageTokens, g.ChunkPages)
}

// Layout is how the engine's paged KV memory is arranged.
type Layout uint8

const (
	// LayoutPerLayer is vLLM's: one tensor per layer, shaped
	// [planes, num_pages, page_tokens, kv_heads, head_dim].
	LayoutPerLayer Layout = iota
	// LayoutCrossLayer is one tensor for all layers, shaped
	// [num_pages, layers, planes, page_tokens, kv_heads, head_dim]: a page's
	// planes of one layer are adjacent (one copy of PageBytesPerLayer).
	LayoutCrossLayer
)

func (l Layout) String() string {
	switch l {
	case LayoutPerLayer:
		return "per-layer"
	case LayoutCrossLayer:
		return "cross-layer"
	}
	return fmt.Sprintf("Layout(%d)", uint8(l))
}

// ErrOutOfRange is wrapped when a layer, plane, page or chunk index is out of range.
var ErrOutOfRange = errors.New("objmap: index out of range")

// TensorBytes is the size of one KV tensor for numPages pages: per layer for
// LayoutPerLayer (there are Layers of them), the whole cache for
// LayoutCrossLayer (there is one).
func (g Geometry) TensorBytes(layout Layout, numPages int) (int64, error) {
	if numPages < 1 {
		return 0, fmt.Errorf("objmap: tensor of %d pages: %w", numPages, ErrOutOfRange)
	}
	switch layout {
	case LayoutPerLayer:
		return int64(numPages) * g.PageBytesPerLayer(), nil
	case LayoutCrossLayer:
		return int64(numPages) * int64(g.Layers) * g.PageBytesPerLayer(), nil
	}
	return 0, fmt.Errorf("objmap: unknown layout %d", layout)
}

// PageOffset is the byte offset of (layer, plane, page) in the engine's KV
// memory: inside layer's own tensor for LayoutPerLayer, inside the single
// tensor for LayoutCrossLayer. The span [off, off+PageBytesPerPlane) holds
// that page of that plane. Every index is checked; an error names the bad one.
func (g Geometry) PageOffset(layout Layout, numPages, layer, plane, page int) (int64, error) {
	if layer < 0 || layer >= g.Layers {
		return 0, fmt.Errorf("objmap: layer %d of %d: %w", layer, g.Layers, ErrOutOfRange)
	}
	if plane < 0 || plane >= g.Planes {
		return 0, fmt.Errorf("objmap: plane %d of %d: %w", plane, g.Planes, ErrOutOfRange)
	}
	if page < 0 || page >= numPages {
		return 0, fmt.Errorf("objmap: page id %d of %d pages: %w", page, numPages, ErrOutOfRange)
	}
	if layout != LayoutPerLayer && layout != LayoutCrossLayer {
		return 0, fmt.Errorf("objmap: unknown layout %d", layout)
	}
	return g.PlaneOffset(layout, numPages, layer, plane, page), nil
}

// PlaneOffset is PageOffset without its checks, for loops over indices the
// caller has checked once (0 <= layer < Layers, 0 <= plane < Planes,
// 0 <= page < numPages, layout one of the two); anything else gives a
// meaningless offset. It is the one statement of the engine's KV layout:
// the kernels' plane_ptr and Python's Geometry.page_offset are held to it.
func (g Geometry) PlaneOffset(layout Layout, numPages, layer, plane, page int) int64 {
	pp := g.PageBytesPerPlane()
	if layout == LayoutPerLayer {
		return (int64(plane)*int64(numPages) + int64(page)) * pp
	}
	return ((int64(page)*int64(g.Layers)+int64(layer))*int64(g.Planes) + int64(plane)) * pp
}

// Object layout on disk. A run of n chunks (consecutive chain blocks saved
// together) is one extent in one pool file:
//
//	[header: HeaderBytes][chunk CRC table: ChunkTableBytes(n)][object 0]...[object Layers-1]
//
// Object l holds layer l for the whole run, chunk-major, then page, then
// plane: [chunk0: page0 plane0, page0 plane1, page1 plane0, ...][chunk1 ...].
// K and V of a page are stored together so that one read per (layer, run)
// restores both, and the first k chunks of a run are one contiguous read per
// layer. Each object starts on a BlockBytes boundary (padded), so every read
// satisfies O_DIRECT alignment whatever the shape.

// BlockBytes is the alignment of every extent, object and I/O length (O_DIRECT).
const BlockBytes = 4096

func alignUp(n int64) int64 { return (n + BlockBytes - 1) &^ (BlockBytes - 1) }

// ObjectBytes is the payload of one layer of a run of chunks chunks (no padding).
func (g Geometry) ObjectBytes(chunks int) int64 { return int64(chunks) * g.ChunkBytesPerLayer() }

// ObjectStride is the on-disk size of one object of a run of chunks chunks:
// ObjectBytes rounded up to BlockBytes.
func (g Geometry) ObjectStride(chunks int) int64 { return alignUp(g.ObjectBytes(chunks)) }

// ChunkTableBytes is the on-disk size of the chunk CRC table of a run of
// chunks chunks: 4 bytes per (layer, chunk), padded to BlockBytes.
func (g Geometry) ChunkTableBytes(chunks int) int64 { return chunkTableBytes(g.Layers, chunks) }

// HeaderRegionBytes is the header plus the chunk CRC table of a run of
// chunks chunks: what recovery reads, in one read, per run; the first
// object starts right after it.
func (g Geometry) HeaderRegionBytes(chunks int) int64 { return HeaderBytes + g.ChunkTableBytes(chunks) }

// RunBytes is the extent a run of chunks chunks occupies: header, chunk
// table and objects.
func (g Geometry) RunBytes(chunks int) int64 {
	return g.HeaderRegionBytes(chunks) + int64(g.Layers)*g.ObjectStride(chunks)
}

// ChunksThatFit is the largest chunk count whose run fits in extentBytes
// (capped at MaxRunChunks), 0 if not even one chunk fits.
func (g Geometry) ChunksThatFit(extentBytes int64) int {
	// RunBytes grows with the count; binary search for the last that fits.
	lo, hi := 0, MaxRunChunks(g)
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if g.RunBytes(mid) <= extentBytes {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// ObjectOffset is where object (layer) of a run of runChunks chunks starts,
// relative to the start of the run's extent.
func (g Geometry) ObjectOffset(runChunks, layer int) (int64, error) {
	if layer < 0 || layer >= g.Layers {
		return 0, fmt.Errorf("objmap: layer %d of %d: %w", layer, g.Layers, ErrOutOfRange)
	}
	if runChunks < 1 || runChunks > MaxRunChunks(g) {
		return 0, fmt.Errorf("objmap: run of %d chunks (max %d): %w", runChunks, MaxRunChunks(g), ErrOutOfRange)
	}
	return g.HeaderRegionBytes(runChunks) + int64(layer)*g.ObjectStride(runChunks), nil
}

// LayerSpan gives the one read that restores layer of the first k chunks of
// a run of runChunks chunks: off is relative to the run's extent start,
// ioBytes is the read length rounded up to BlockBytes (it stays inside the
// object's padding), dataBytes = k*ChunkBytesPerLayer is the payload within
// it, starting at the buffer's first byte. Only the first k chunks are read
// (each has its own CRC: RunInfo.VerifySpan, ChunkVerifier); ChunkSpan is
// the general form (chunks [first, first+k)).
func (g Geometry) LayerSpan(runChunks, layer, k int) (off, ioBytes, dataBytes int64, err error) {
	s, err := g.ChunkSpan(runChunks, layer, 0, k)
	if err != nil {
		return 0, 0, 0, err
	}
	return s.Off, s.IOBytes, s.DataBytes, nil
}

// ChunkPageOffset is where (chunk, page within the chunk, plane) lies inside
// an object (relative to the object's start); the span is PageBytesPerPlane.
func (g Geometry) ChunkPageOffset(chunk, page, plane int) (int64, error) {
	if chunk < 0 {
		return 0, fmt.Errorf("objmap: chunk %d: %w", chunk, ErrOutOfRange)
	}
	if page < 0 || page >= g.ChunkPages {
		return 0, fmt.Errorf("objmap: page %d of a %d-page chunk: %w", page, g.ChunkPages, ErrOutOfRange)
	}
	if plane < 0 || plane >= g.Planes {
		return 0, fmt.Errorf("objmap: plane %d of %d: %w", plane, g.Planes, ErrOutOfRange)
	}
	return ((int64(chunk)*int64(g.ChunkPages)+int64(page))*int64(g.Planes) + int64(plane)) * g.PageBytesPerPlane(), nil
}
