package kvshape_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/tutti-io/tutti/internal/abicheck"
	"github.com/tutti-io/tutti/kvshape"
)

// Geometry and Layout here are the one home of the KV layout math. The
// copies outside Go are held against them: python/tutti's Geometry by
// TestPythonGeometryMatches, the C ABI's and the kernels' enum values by
// TestCHeaderEnumsMatch (the structs' offsets: internal/abicheck's and
// kernels' tests).

func repoRoot(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func skipNoTool(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, abicheck.ErrNoTool) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// layoutCase is one shape, layout and page count with the (layer, plane,
// page) points whose offsets are compared.
type layoutCase struct {
	Name       string   `json:"name"`
	Layers     int      `json:"layers"`
	KVHeads    int      `json:"kv_heads"`
	HeadDim    int      `json:"head_dim"`
	DType      string   `json:"dtype"`
	Planes     int      `json:"planes"`
	PageTokens int      `json:"page_tokens"`
	ChunkPages int      `json:"chunk_pages"`
	Layout     string   `json:"layout"` // Python's name: per_layer, cross_layer
	NumPages   int      `json:"num_pages"`
	Points     [][3]int `json:"points"` // layer, plane, page
}

// pyLayout is what python/tutti's Geometry says about one layoutCase.
type pyLayout struct {
	PagePlane   int64   `json:"page_bytes_per_plane"`
	PageLayer   int64   `json:"page_bytes_per_layer"`
	BlockTokens int     `json:"block_tokens"`
	TensorBytes int64   `json:"tensor_bytes"`
	Shape       []int64 `json:"tensor_shape"`
	Offsets     []int64 `json:"offsets"`
}

const pyGeometry = `
import json, sys
from tutti.store import Geometry
out = []
for c in json.load(sys.stdin):
    g = Geometry(layers=c["layers"], kv_heads=c["kv_heads"], head_dim=c["head_dim"], dtype=c["dtype"],
                 planes=c["planes"], page_tokens=c["page_tokens"], chunk_pages=c["chunk_pages"])
    lay, n = c["layout"], c["num_pages"]
    out.append({"page_bytes_per_plane": g.page_bytes_per_plane, "page_bytes_per_layer": g.page_bytes_per_layer,
                "block_tokens": g.block_tokens, "tensor_bytes": g.tensor_bytes(lay, n),
                "tensor_shape": list(g.tensor_shape(lay, n)),
                "offsets": [g.page_offset(lay, n, l, p, pg) for l, p, pg in c["points"]]})
json.dump(out, sys.stdout)
`

func layoutCases() []layoutCase {
	shapes := []layoutCase{
		{Name: "llama3-70b", Layers: 80, KVHeads: 8, HeadDim: 128, DType: "bf16", Planes: 2, PageTokens: 16, ChunkPages: 1, NumPages: 65536},
		{Name: "deepseek-v3-mla", Layers: 61, KVHeads: 1, HeadDim: 576, DType: "bf16", Planes: 1, PageTokens: 16, ChunkPages: 32, NumPages: 4096},
		{Name: "llama3-8b-fp16-mooncake", Layers: 32, KVHeads: 8, HeadDim: 128, DType: "fp16", Planes: 2, PageTokens: 16, ChunkPages: 32, NumPages: 1000},
		{Name: "odd-fp8", Layers: 3, KVHeads: 3, HeadDim: 40, DType: "fp8", Planes: 2, PageTokens: 7, ChunkPages: 3, NumPages: 11},
		{Name: "one-of-each-fp32", Layers: 1, KVHeads: 1, HeadDim: 1, DType: "fp32", Planes: 1, PageTokens: 1, ChunkPages: 1, NumPages: 1},
		{Name: "max-layers", Layers: 256, KVHeads: 2, HeadDim: 64, DType: "bf16", Planes: 2, PageTokens: 32, ChunkPages: 2, NumPages: 1 << 20},
	}
	var out []layoutCase
	for _, s := range shapes {
		for _, layout := range []string{"per_layer", "cross_layer"} {
			c := s
			c.Name, c.Layout = s.Name+"/"+layout, layout
			L, P, N := c.Layers-1, c.Planes-1, c.NumPages-1
			c.Points = [][3]int{{0, 0, 0}, {L, P, N}, {0, P, N}, {L, 0, 0}, {L / 2, P, N / 2}, {L / 3, 0, N / 3}}
			out = append(out, c)
		}
	}
	return out
}

// contiguousOffset is the byte offset of index idx in a row-major tensor of
// shape whose elements are elem bytes.
func contiguousOffset(shape, idx []int64, elem int64) int64 {
	off, stride := int64(0), elem
	for i := len(shape) - 1; i >= 0; i-- {
		off += idx[i] * stride
		stride *= shape[i]
	}
	return off
}

// TestPythonGeometryMatches holds python/tutti's Geometry (sizes, tensor
// shape and bytes, page offsets) against kvshape's for a table of shapes,
// both layouts, and pages at the edges and inside.
func TestPythonGeometryMatches(t *testing.T) {
	cases := layoutCases()
	var py []pyLayout
	skipNoTool(t, abicheck.Python(repoRoot(t), pyGeometry, cases, &py))
	if len(py) != len(cases) {
		t.Fatalf("python answered %d cases of %d", len(py), len(cases))
	}
	for i, c := range cases {
		dt, err := kvshape.ParseDType(c.DType)
		if err != nil {
			t.Fatal(err)
		}
		g := kvshape.Geometry{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DType: dt,
			Planes: c.Planes, PageTokens: c.PageTokens, ChunkPages: c.ChunkPages}
		if err := g.Validate(); err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		layout := kvshape.LayoutPerLayer
		if c.Layout == "cross_layer" {
			layout = kvshape.LayoutCrossLayer
		}
		p := py[i]
		tb, err := g.TensorBytes(layout, c.NumPages)
		if err != nil {
			t.Fatal(err)
		}
		if p.PagePlane != g.PageBytesPerPlane() || p.PageLayer != g.PageBytesPerLayer() ||
			p.BlockTokens != g.PageTokens*g.ChunkPages || p.TensorBytes != tb {
			t.Errorf("%s: python plane %d layer %d block tokens %d tensor %d; kvshape %d %d %d %d", c.Name,
				p.PagePlane, p.PageLayer, p.BlockTokens, p.TensorBytes,
				g.PageBytesPerPlane(), g.PageBytesPerLayer(), g.PageTokens*g.ChunkPages, tb)
		}
		elems := int64(1)
		for _, d := range p.Shape {
			elems *= d
		}
		if elems*int64(dt.Bytes()) != tb {
			t.Errorf("%s: python shape %v holds %d bytes, kvshape's tensor %d", c.Name, p.Shape, elems*int64(dt.Bytes()), tb)
		}
		for j, pt := range c.Points {
			want, err := g.PageOffset(layout, c.NumPages, pt[0], pt[1], pt[2])
			if err != nil {
				t.Fatal(err)
			}
			if p.Offsets[j] != want {
				t.Errorf("%s: (layer %d, plane %d, page %d): python offset %d, kvshape %d", c.Name, pt[0], pt[1], pt[2], p.Offsets[j], want)
			}
			idx := []int64{int64(pt[1]), int64(pt[2]), 0, 0, 0} // planes, pages, ...
			if layout == kvshape.LayoutCrossLayer {
				idx = []int64{int64(pt[2]), int64(pt[0]), int64(pt[1]), 0, 0, 0} // pages, layers, planes, ...
			}
			if len(p.Shape) != len(idx) {
				t.Fatalf("%s: python shape %v, want %d dims", c.Name, p.Shape, len(idx))
			}
			if got := contiguousOffset(p.Shape, idx, int64(dt.Bytes())); got != want {
				t.Errorf("%s: (layer %d, plane %d, page %d) in python's shape %v is at %d, kvshape's offset %d",
					c.Name, pt[0], pt[1], pt[2], p.Shape, got, want)
			}
		}
	}
}

// TestCHeaderEnumsMatch holds the dtype and layout codes of the C ABI
// (runtime/capi/tutti.h) and of the kernels (kernels/tutti_kernels.h) against
// kvshape's: the C ABI's dtype codes are kvshape.DType's, its layout codes are
// kvshape.Layout + 1 (0 is "unset" there), the kernels' are kvshape.Layout's.
func TestCHeaderEnumsMatch(t *testing.T) {
	r := repoRoot(t)
	hdr, err := abicheck.CHeader(t.TempDir(), filepath.Join(r, "runtime", "capi", "tutti.h"), filepath.Join(r, "kernels", "tutti_kernels.h"))
	skipNoTool(t, err)
	want := map[string]int64{
		"TUTTI_DTYPE_BF16": int64(kvshape.BF16), "TUTTI_DTYPE_FP16": int64(kvshape.FP16),
		"TUTTI_DTYPE_FP8": int64(kvshape.FP8), "TUTTI_DTYPE_FP32": int64(kvshape.FP32),
		"TUTTI_LAYOUT_PER_LAYER": int64(kvshape.LayoutPerLayer) + 1, "TUTTI_LAYOUT_CROSS_LAYER": int64(kvshape.LayoutCrossLayer) + 1,
		"TK_LAYOUT_PER_LAYER": int64(kvshape.LayoutPerLayer), "TK_LAYOUT_CROSS_LAYER": int64(kvshape.LayoutCrossLayer),
	}
	for name, v := range want {
		got, ok := hdr.Consts[name]
		if !ok {
			t.Errorf("%s is in neither header", name)
		} else if got != v {
			t.Errorf("%s = %d in the header, kvshape's value is %d", name, got, v)
		}
	}
}
