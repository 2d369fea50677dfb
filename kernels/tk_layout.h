/* tk_layout.h — the byte offset of plane p of page i of layer l in the
 * engine's KV tensors (tutti_kernels.h's tk_kv layouts). Plain C, so that a
 * host test can compile it with gcc and hold it to kvshape's PlaneOffset,
 * the layout's one statement; under nvcc the same function also runs on the
 * device (tk_geo.cuh's plane_ptr). */
#ifndef TK_LAYOUT_H
#define TK_LAYOUT_H

#include <stdint.h>

#include "tutti_kernels.h"

#ifdef __CUDACC__
#define TK_HOST_DEVICE __host__ __device__
#else
#define TK_HOST_DEVICE
#endif

/* tk_plane_offset: per-layer layout, the offset inside layer's own tensor
 * [planes, num_pages, ...]; cross-layer, inside the one tensor
 * [num_pages, layers, planes, ...]. Indices are the caller's to check. */
static inline TK_HOST_DEVICE uint64_t tk_plane_offset(uint32_t layout, uint32_t layers, uint32_t planes,
                                                      uint32_t num_pages, uint64_t plane_bytes,
                                                      uint32_t layer, uint32_t plane, uint32_t page) {
  if (layout == TK_LAYOUT_PER_LAYER) return ((uint64_t)plane * num_pages + page) * plane_bytes;
  return (((uint64_t)page * layers + layer) * planes + plane) * plane_bytes;
}

#endif /* TK_LAYOUT_H */
