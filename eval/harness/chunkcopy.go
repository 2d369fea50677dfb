package harness

// The serialized format of a run of pages (a chain block, or a part of one
// for backends whose chunks are smaller): layer-major, and within a layer
// page by page, each page's planes in order (objmap's object order). The
// dram backend and every file-per-chunk baseline use it.

// pagesOffset is where (layer, page i of n, plane) lies in n pages
// serialized.
func pagesOffset(env *Env, n, layer, page, plane int) int64 {
	g := env.Geometry
	return (int64(layer)*int64(n)*int64(g.Planes) + int64(page)*int64(g.Planes) + int64(plane)) * g.PageBytesPerPlane()
}

// gatherPages copies pages (every layer) from KV memory into dst
// (len(pages) × Layers × PageBytesPerLayer bytes).
func gatherPages(env *Env, dst []byte, pages []int32) {
	g := env.Geometry
	n := g.PageBytesPerPlane()
	for l := 0; l < g.Layers; l++ {
		for i, pg := range pages {
			for p := 0; p < g.Planes; p++ {
				off := pagesOffset(env, len(pages), l, i, p)
				copy(dst[off:off+n], env.KV.Page(l, p, pg))
			}
		}
	}
}

// scatterPagesLayer copies layer l of pages from src (serialized by
// gatherPages) into KV memory.
func scatterPagesLayer(env *Env, src []byte, l int, pages []int32) {
	g := env.Geometry
	n := g.PageBytesPerPlane()
	for i, pg := range pages {
		for p := 0; p < g.Planes; p++ {
			off := pagesOffset(env, len(pages), l, i, p)
			copy(env.KV.Page(l, p, pg), src[off:off+n])
		}
	}
}

// gatherBlock copies one chain block from its KV pages into dst (ChunkBytes).
func gatherBlock(env *Env, dst []byte, pages []int32) { gatherPages(env, dst, pages) }

// scatterLayer copies layer l of one chain block from src into its KV pages.
func scatterLayer(env *Env, src []byte, l int, pages []int32) { scatterPagesLayer(env, src, l, pages) }
