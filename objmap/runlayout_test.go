package objmap

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

// llama3_8b is the Llama-3-8B shape with vLLM paging.
var llama3_8b = kvshape.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 1}

func TestRunLayoutSizes(t *testing.T) {
	g := llama3_8b
	if got := ChunkTableBytes(g, 3); got != BlockBytes {
		t.Fatalf("ChunkTableBytes(3) = %d", got)
	}
	if got := runBytes1(g, 3); got != HeaderBytes+BlockBytes+32*3*65536 {
		t.Fatalf("runBytes1(3) = %d", got)
	}
	// MLA page of 18432 bytes is not block-aligned: objects are padded.
	mla := kvshape.Geometry{Layers: 2, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16, Planes: 1, PageTokens: 16, ChunkPages: 1}
	if got, want := ObjectStride(mla, 1), int64(20480); got != want {
		t.Fatalf("ObjectStride(1) = %d, want %d", got, want)
	}
	off, io, data, err := layerSpan1(mla, 3, 1, 1)
	if err != nil || off != HeaderBytes+BlockBytes+ObjectStride(mla, 3) || io != 20480 || data != 18432 {
		t.Fatalf("LayerSpan = %d %d %d %v", off, io, data, err)
	}
	if _, _, _, err := layerSpan1(mla, 3, 1, 4); !errors.Is(err, kvshape.ErrOutOfRange) {
		t.Fatalf("LayerSpan k>run: %v", err)
	}
	if _, _, _, err := layerSpan1(mla, 3, 2, 1); !errors.Is(err, kvshape.ErrOutOfRange) {
		t.Fatalf("LayerSpan layer out of range: %v", err)
	}
	for n := 1; n <= 50; n++ {
		if k := chunksThatFit1(mla, runBytes1(mla, n)); k != n {
			t.Fatalf("chunksThatFit1(runBytes1(%d)) = %d", n, k)
		}
		if k := chunksThatFit1(mla, runBytes1(mla, n)-1); k != n-1 {
			t.Fatalf("chunksThatFit1(runBytes1(%d)-1) = %d", n, k)
		}
	}
}

func TestFingerprintCoversEveryField(t *testing.T) {
	base := llama3_8b
	seen := map[uint64]string{Fingerprint(base): "base"}
	for name, mut := range map[string]func(*kvshape.Geometry){
		"Layers": func(g *kvshape.Geometry) { g.Layers++ }, "KVHeads": func(g *kvshape.Geometry) { g.KVHeads++ },
		"HeadDim": func(g *kvshape.Geometry) { g.HeadDim++ }, "DType": func(g *kvshape.Geometry) { g.DType = kvshape.FP16 },
		"Planes": func(g *kvshape.Geometry) { g.Planes = 1 }, "PageTokens": func(g *kvshape.Geometry) { g.PageTokens++ },
		"ChunkPages": func(g *kvshape.Geometry) { g.ChunkPages++ },
	} {
		g := base
		mut(&g)
		fp := Fingerprint(g)
		if prev, dup := seen[fp]; dup {
			t.Errorf("changing %s gives the fingerprint of %s", name, prev)
		}
		seen[fp] = name
	}
	if Fingerprint(base) != Fingerprint(llama3_8b) {
		t.Fatal("fingerprint not stable")
	}
}

func TestChunkPageOffset(t *testing.T) {
	g := kvshape.Geometry{Layers: 1, KVHeads: 1, HeadDim: 8, DType: kvshape.FP8, Planes: 2, PageTokens: 1, ChunkPages: 2}
	// chunk0: p0q0 p0q1 p1q0 p1q1, chunk1: ...
	want := int64(0)
	for c := range 2 {
		for p := range 2 {
			for q := range 2 {
				off, err := ChunkPageOffset(g, c, p, q)
				if err != nil || off != want {
					t.Fatalf("(%d,%d,%d) = %d %v, want %d", c, p, q, off, err, want)
				}
				want += g.PageBytesPerPlane()
			}
		}
	}
	if want != ObjectBytes(g, 2) {
		t.Fatalf("object of 2 chunks is %d bytes, slots cover %d", ObjectBytes(g, 2), want)
	}
}

// TestGeometryOnDisk pins how a store writes a geometry: its JSON in the
// manifest (kvshape's field and dtype names) and its fingerprint in every
// run header. Changing either makes every existing store unreadable.
func TestGeometryOnDisk(t *testing.T) {
	b, err := json.Marshal(tinyGeom)
	if want := `{"layers":2,"kv_heads":1,"head_dim":64,"dtype":"fp16","planes":2,"page_tokens":4,"chunk_pages":2}`; err != nil || string(b) != want {
		t.Errorf("geometry JSON %s %v, want %s", b, err, want)
	}
	for _, c := range []struct {
		g  kvshape.Geometry
		fp uint64
	}{{tinyGeom, 0x45321ee82ac40e52}, {llama3_8b, 0xccd33c18aa87e53f}} {
		if got := Fingerprint(c.g); got != c.fp {
			t.Errorf("%v: fingerprint %016x, want %016x", c.g, got, c.fp)
		}
	}
	// A manifest as an earlier build wrote it reads back as that geometry.
	m, err := parseManifest([]byte(`{"version": 1, "store_id": "00112233445566778899aabbccddeeff", "dir_index": 0, "dirs": 1,
		"geometry": {"layers": 2, "kv_heads": 1, "head_dim": 64, "dtype": "fp16", "planes": 2, "page_tokens": 4, "chunk_pages": 2},
		"fingerprint": "45321ee82ac40e52", "files_per_dir": 1, "file_bytes": 1048576, "capacity_bytes": 1048576}`))
	if err != nil || m.Geometry != tinyGeom {
		t.Fatalf("manifest: %+v %v, want geometry %v", m, err, tinyGeom)
	}
}
