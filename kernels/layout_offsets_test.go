package kernels

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

// TestPlaneOffsetMatchesKVShape compiles tk_layout.h (the device's offset
// rule, which plane_ptr uses) into a gcc program that prints the offset of
// every (layer, plane, page) of a table of shapes, and holds each to
// kvshape.Geometry.PlaneOffset, the layout's one statement.
func TestPlaneOffsetMatchesKVShape(t *testing.T) {
	type shape struct {
		g        kvshape.Geometry
		numPages int
	}
	shapes := []shape{
		{kvshape.Geometry{Layers: 4, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}, 5},
		{kvshape.Geometry{Layers: 3, Planes: 1, PageTokens: 16, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16}, 7},
		{kvshape.Geometry{Layers: 2, Planes: 2, PageTokens: 1, KVHeads: 1, HeadDim: 16, DType: kvshape.FP8}, 3},
		{kvshape.Geometry{Layers: 5, Planes: 2, PageTokens: 32, KVHeads: 4, HeadDim: 64, DType: kvshape.FP32}, 1},
		{kvshape.Geometry{Layers: 80, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16}, 40000}, // offsets past 4 GiB
	}
	var prog strings.Builder
	hdr, err := filepath.Abs("tk_layout.h")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&prog, "#include <stdio.h>\n#include %q\nint main(void) {\n", hdr)
	var want []string
	for _, s := range shapes {
		g := s.g
		// Every layer and plane; the first, a middle and the last page.
		pages := []int{0, s.numPages / 2, s.numPages - 1}
		for _, layout := range []kvshape.Layout{kvshape.LayoutPerLayer, kvshape.LayoutCrossLayer} {
			for l := 0; l < g.Layers; l++ {
				for p := 0; p < g.Planes; p++ {
					for _, pg := range pages {
						fmt.Fprintf(&prog, "\tprintf(\"%%llu\\n\", (unsigned long long)tk_plane_offset(%d, %d, %d, %d, %dull, %d, %d, %d));\n",
							layout, g.Layers, g.Planes, s.numPages, g.PageBytesPerPlane(), l, p, pg)
						want = append(want, fmt.Sprintf("%d %v layer %d plane %d page %d: %d", len(want), layout, l, p, pg,
							g.PlaneOffset(layout, s.numPages, l, p, pg)))
					}
				}
			}
		}
	}
	prog.WriteString("\treturn 0;\n}\n")
	got := gccPrint(t, prog.String())
	if len(got) != len(want) {
		t.Fatalf("%d offsets printed, want %d", len(got), len(want))
	}
	for i, w := range want {
		if !strings.HasSuffix(w, ": "+got[i]) {
			t.Errorf("tk_plane_offset %s, gcc printed %s", w, got[i])
		}
	}
}
