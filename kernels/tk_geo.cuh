// tk_geo.cuh — the device side of the KV layout (tutti_kernels.h's tk_kv):
// where plane p of page i of layer l lies in the engine's tensors. Included by
// both libraries (the product's scatter/gather and the test kit's verify), so
// the address rule has one home on the device.
#ifndef TK_GEO_CUH
#define TK_GEO_CUH

#include <stdint.h>

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

__device__ __forceinline__ char *plane_ptr(const uint64_t *kvp, const Geo &g, uint32_t layer,
                                           uint32_t plane, uint32_t page) {
  if (g.layout == TK_LAYOUT_PER_LAYER)
    return (char *)kvp[layer] + ((uint64_t)plane * g.num_pages + page) * g.plane_bytes;
  return (char *)kvp[0] + (((uint64_t)page * g.layers + layer) * g.planes + plane) * g.plane_bytes;
}

#endif  // TK_GEO_CUH
