package kvshape

import (
	"errors"
	"strings"
	"testing"
)

// llama3_8b is the Llama-3-8B shape with vLLM paging.
var llama3_8b = Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DType: BF16, Planes: 2, PageTokens: 16, ChunkPages: 1}

func TestGeometryValidate(t *testing.T) {
	mla := Geometry{Layers: 61, KVHeads: 1, HeadDim: 576, DType: BF16, Planes: 1, PageTokens: 16, ChunkPages: 32}
	for _, tc := range []struct {
		name  string
		g     Geometry
		field string // "" = valid
	}{
		{"llama", llama3_8b, ""},
		{"mla", mla, ""},
		{"layers0", func() Geometry { g := llama3_8b; g.Layers = 0; return g }(), "Layers"},
		{"layers-big", func() Geometry { g := llama3_8b; g.Layers = MaxLayers + 1; return g }(), "Layers"},
		{"heads", func() Geometry { g := llama3_8b; g.KVHeads = -1; return g }(), "KVHeads"},
		{"headdim", func() Geometry { g := llama3_8b; g.HeadDim = 0; return g }(), "HeadDim"},
		{"dtype", func() Geometry { g := llama3_8b; g.DType = 0; return g }(), "DType"},
		{"planes", func() Geometry { g := llama3_8b; g.Planes = 3; return g }(), "Planes"},
		{"pagetokens", func() Geometry { g := llama3_8b; g.PageTokens = 0; return g }(), "PageTokens"},
		{"chunkpages", func() Geometry { g := llama3_8b; g.ChunkPages = 0; return g }(), "ChunkPages"},
		{"chunk-too-big", Geometry{Layers: 1, KVHeads: 1024, HeadDim: 65536, DType: FP32, Planes: 2, PageTokens: 16, ChunkPages: 1}, "one chunk"},
	} {
		err := tc.g.Validate()
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil || !errors.Is(err, ErrGeometry) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v, want an ErrGeometry naming %s", tc.name, err, tc.field)
		}
	}
}

func TestGeometrySizes(t *testing.T) {
	g := llama3_8b
	if got := g.PageBytesPerPlane(); got != 16*8*128*2 {
		t.Fatalf("PageBytesPerPlane = %d", got)
	}
	if got := g.PageBytesPerLayer(); got != 2*16*8*128*2 {
		t.Fatalf("PageBytesPerLayer = %d", got)
	}
	if got := g.ChunkBytes(); got != 32*2*16*8*128*2 {
		t.Fatalf("ChunkBytes = %d", got)
	}
}

func TestPageOffset(t *testing.T) {
	g := Geometry{Layers: 3, KVHeads: 2, HeadDim: 4, DType: FP16, Planes: 2, PageTokens: 2, ChunkPages: 1}
	pp := g.PageBytesPerPlane() // 32
	const pages = 5
	// Per-layer: [planes, pages, ...]; every (plane, page) is a distinct
	// PageBytesPerPlane slot covering the tensor exactly once.
	for _, layout := range []Layout{LayoutPerLayer, LayoutCrossLayer} {
		size, err := g.TensorBytes(layout, pages)
		if err != nil {
			t.Fatal(err)
		}
		layers := 1
		if layout == LayoutCrossLayer {
			layers = g.Layers
		}
		used := make(map[int64]bool)
		for l := range layers {
			for p := range pages {
				for q := range g.Planes {
					off, err := g.PageOffset(layout, pages, l, q, p)
					if err != nil {
						t.Fatal(err)
					}
					if off%pp != 0 || off < 0 || off+pp > size || used[off] {
						t.Fatalf("%s: (l%d q%d p%d) at %d: overlapping or outside %d", layout, l, q, p, off, size)
					}
					used[off] = true
				}
			}
		}
		if int64(len(used))*pp != size {
			t.Fatalf("%s: %d slots do not cover %d bytes", layout, len(used), size)
		}
	}
	if off, _ := g.PageOffset(LayoutPerLayer, pages, 2, 1, 3); off != (1*pages+3)*pp {
		t.Fatalf("per-layer offset %d", off)
	}
	if off, _ := g.PageOffset(LayoutCrossLayer, pages, 2, 1, 3); off != ((3*3+2)*2+1)*pp {
		t.Fatalf("cross-layer offset %d", off)
	}
	_, err := g.PageOffset(LayoutPerLayer, pages, 0, 0, pages)
	if !errors.Is(err, ErrOutOfRange) || !strings.Contains(err.Error(), "page id 5") {
		t.Fatalf("page out of range: %v", err)
	}
	if _, err := g.PageOffset(LayoutPerLayer, pages, 3, 0, 0); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("layer out of range: %v", err)
	}
	if _, err := g.PageOffset(LayoutPerLayer, pages, 0, 2, 0); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("plane out of range: %v", err)
	}
}

func TestDTypeText(t *testing.T) {
	for d := BF16; d <= FP32; d++ {
		b, err := d.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var e DType
		if err := e.UnmarshalText(b); err != nil || e != d {
			t.Fatalf("%s: %v %v", d, e, err)
		}
	}
	if _, err := ParseDType("int4"); err == nil {
		t.Fatal("int4 parsed")
	}
}
