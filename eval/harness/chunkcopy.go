package harness

// chunkOffset is where (layer, page in chunk, plane) lies in a chain block
// serialized layer-major, each layer in objmap's object order (page, then
// plane): the format of the dram and pagecache backends.
func chunkOffset(env *Env, layer, page, plane int) int64 {
	g := env.Geometry
	return int64(layer)*g.ChunkBytesPerLayer() + (int64(page)*int64(g.Planes)+int64(plane))*g.PageBytesPerPlane()
}

// gatherBlock copies one chain block from its KV pages into dst (ChunkBytes).
func gatherBlock(env *Env, dst []byte, pages []int32) {
	g := env.Geometry
	n := g.PageBytesPerPlane()
	for l := 0; l < g.Layers; l++ {
		for i, pg := range pages {
			for p := 0; p < g.Planes; p++ {
				off := chunkOffset(env, l, i, p)
				copy(dst[off:off+n], env.KV.Page(l, p, pg))
			}
		}
	}
}

// scatterLayer copies layer l of one chain block from src into its KV pages.
func scatterLayer(env *Env, src []byte, l int, pages []int32) {
	g := env.Geometry
	n := g.PageBytesPerPlane()
	for i, pg := range pages {
		for p := 0; p < g.Planes; p++ {
			off := chunkOffset(env, l, i, p)
			copy(env.KV.Page(l, p, pg), src[off:off+n])
		}
	}
}
