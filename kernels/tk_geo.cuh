// tk_geo.cuh — the device side of the KV layout (tutti_kernels.h's tk_kv):
// where plane p of page i of layer l lies in the engine's tensors. Included by
// both libraries (the product's scatter/gather and the test kit's verify), so
// the address rule has one home on the device.
#ifndef TK_GEO_CUH
#define TK_GEO_CUH

#include <stdint.h>

#include "tk_layout.h"
#include "tutti_kernels.h"

struct Geo {
  uint32_t layers, planes, num_pages, layout;
  uint64_t plane_bytes;
};

// geo_of derives the device geometry from a checked tk_kv.
static inline Geo geo_of(const tk_kv &kv) {
  Geo g;
  g.layers = kv.layers;
  g.planes = kv.planes;
  g.num_pages = kv.num_pages;
  g.layout = kv.layout;
  g.plane_bytes = (uint64_t)kv.page_tokens * kv.kv_heads * kv.head_dim * kv.dtype_bytes;
  return g;
}

// plane_ptr: the offset rule is tk_layout.h's (held to kvshape's PlaneOffset
// by a host test); the tensor is layer's own (per-layer) or the one (cross-layer).
__device__ __forceinline__ char *plane_ptr(const uint64_t *kvp, const Geo &g, uint32_t layer,
                                           uint32_t plane, uint32_t page) {
  const uint64_t off = tk_plane_offset(g.layout, g.layers, g.planes, g.num_pages, g.plane_bytes, layer, plane, page);
  return (char *)kvp[g.layout == TK_LAYOUT_PER_LAYER ? layer : 0] + off;
}

#endif  // TK_GEO_CUH
