// Package kvdata generates deterministic KV-cache content so that every
// restored byte can be checked without keeping a copy of what was saved.
//
// The bytes of one page of one plane of one layer of one chain block are a
// pure function of Key{Block, Layer, Plane, Page} (Page is the page's index
// within its chain block, 0..ChunkPages-1, not the engine's page id, so the
// content does not depend on where the engine placed it). Word i (8 bytes,
// little endian) of the page is splitmix64's output function applied to
// seed(key) + (i+1)*golden: a counter-based generator, so any word can be
// computed alone, pages can be filled in parallel, and two distinct keys give
// unrelated streams. A page shorter than a multiple of 8 bytes gets the
// leading bytes of its last word.
//
// Fill writes, Verify checks. Both work on any []byte view (a Go slice, an
// off-heap uring.Buffer's Bytes(), a region of a mapped file); they never
// allocate. Its throughput per core:
// BENCHMARKS.md, prefix, objmap, uring / devbench.
package kvdata

import "encoding/binary"

// Key names one page of one plane of one layer of one chain block.
type Key struct {
	Block uint64 // chain block id (the trace's hash id)
	Layer int    // 0..Layers-1
	Plane int    // 0..Planes-1 (0 = K, 1 = V; 0 for an MLA latent)
	Page  int    // page index within the chain block, 0..ChunkPages-1
}

const golden = 0x9E3779B97F4A7C15

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// Spread is splitmix64 of x (the generator's own mixer after one step of
// its counter): x's bits spread over all 64, so consecutive inputs give
// unrelated outputs.
func Spread(x uint64) uint64 { return mix(x + golden) }

// seed folds the key into one 64-bit stream start. Each field goes through
// the mixer so that neighbouring keys (layer 1 vs 2) are far apart.
func seed(k Key) uint64 {
	s := mix(k.Block ^ 0x7475747469) // "tutti"
	s = mix(s ^ uint64(uint32(k.Layer))<<32 ^ uint64(uint32(k.Plane)))
	return mix(s ^ uint64(uint32(k.Page)))
}

// Word returns word i (bytes 8i..8i+7, little endian) of the page of k.
func Word(k Key, i int) uint64 { return mix(seed(k) + uint64(i+1)*golden) }

// Fill writes the content of the page of k into dst (all of dst).
func Fill(dst []byte, k Key) {
	s := seed(k)
	n := len(dst) / 8
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint64(dst[8*i:], mix(s+uint64(i+1)*golden))
	}
	if rest := len(dst) - 8*n; rest > 0 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], mix(s+uint64(n+1)*golden))
		copy(dst[8*n:], w[:rest])
	}
}

// Verify returns the offset of the first byte of src that differs from the
// content of the page of k, or -1 when all of src matches.
func Verify(src []byte, k Key) int {
	s := seed(k)
	n := len(src) / 8
	for i := 0; i < n; i++ {
		if binary.LittleEndian.Uint64(src[8*i:]) != mix(s+uint64(i+1)*golden) {
			var w [8]byte
			binary.LittleEndian.PutUint64(w[:], mix(s+uint64(i+1)*golden))
			for j := 0; j < 8; j++ {
				if src[8*i+j] != w[j] {
					return 8*i + j
				}
			}
		}
	}
	if rest := len(src) - 8*n; rest > 0 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], mix(s+uint64(n+1)*golden))
		for j := 0; j < rest; j++ {
			if src[8*n+j] != w[j] {
				return 8*n + j
			}
		}
	}
	return -1
}

// ChunkLayout is the shape kvdata needs to fill or verify one layer of one
// chain block laid out as objmap stores it: page-major, then plane
// ([page0 plane0][page0 plane1][page1 plane0]...), each PageBytes long.
type ChunkLayout struct {
	Pages     int // pages per chain block (ChunkPages)
	Planes    int // 1 or 2
	PageBytes int // bytes of one page of one plane
}

// Bytes is the size of one layer of one chunk.
func (c ChunkLayout) Bytes() int { return c.Pages * c.Planes * c.PageBytes }

// FillChunk writes layer's content of chain block into dst (c.Bytes() long).
func FillChunk(dst []byte, c ChunkLayout, block uint64, layer int) {
	for pg := 0; pg < c.Pages; pg++ {
		for pl := 0; pl < c.Planes; pl++ {
			off := (pg*c.Planes + pl) * c.PageBytes
			Fill(dst[off:off+c.PageBytes], Key{Block: block, Layer: layer, Plane: pl, Page: pg})
		}
	}
}

// VerifyChunk checks layer's content of chain block in src (c.Bytes() long)
// and returns the offset of the first wrong byte, or -1.
func VerifyChunk(src []byte, c ChunkLayout, block uint64, layer int) int {
	for pg := 0; pg < c.Pages; pg++ {
		for pl := 0; pl < c.Planes; pl++ {
			off := (pg*c.Planes + pl) * c.PageBytes
			if bad := Verify(src[off:off+c.PageBytes], Key{Block: block, Layer: layer, Plane: pl, Page: pg}); bad >= 0 {
				return off + bad
			}
		}
	}
	return -1
}
