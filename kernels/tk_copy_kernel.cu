// tk_copy_kernel.cu — the scatter/gather kernel between a layer's object
// layout (staging or a host buffer) and the engine's paged KV tensors.
#include "tk_ctx.cuh"

// Copies one layer between object layout (src/dst "obj": page i's planes at
// map[i].slot_off) and the paged KV. One block per page; 16-byte vectors, four
// loads in flight per thread. results (may be NULL) gate each page: a page is
// copied only if every entry covering it is OK.
template <bool kToKV>
__global__ void copy_layer_kernel(char *obj, const tk_page_map *map, uint32_t n_pages,
                                  const tk_entry_result *results, const uint64_t *kvp, Geo g,
                                  uint32_t layer) {
  for (uint32_t i = blockIdx.x; i < n_pages; i += gridDim.x) {
    const tk_page_map m = map[i];
    if (results) {
      __shared__ int ok;
      if (threadIdx.x == 0) {
        int good = 1;
        for (uint32_t e = m.first_entry; e <= m.last_entry; e++)
          if (results[e].status != TK_ENTRY_OK) good = 0;
        ok = good;
      }
      __syncthreads();
      const int good = ok;
      __syncthreads();
      if (!good) continue;
    }
    const uint32_t nv = (uint32_t)(g.plane_bytes / 16);
    for (uint32_t p = 0; p < g.planes; p++) {
      uint4 *kv = (uint4 *)plane_ptr(kvp, g, layer, p, m.dst_page);
      uint4 *ob = (uint4 *)(obj + m.slot_off + (uint64_t)p * g.plane_bytes);
      const uint4 *src = kToKV ? ob : kv;
      uint4 *dst = kToKV ? kv : ob;
      uint32_t v = threadIdx.x;
      for (; v + 3 * blockDim.x < nv; v += 4 * blockDim.x) {
        uint4 a = src[v], b = src[v + blockDim.x], c = src[v + 2 * blockDim.x], d = src[v + 3 * blockDim.x];
        dst[v] = a; dst[v + blockDim.x] = b; dst[v + 2 * blockDim.x] = c; dst[v + 3 * blockDim.x] = d;
      }
      for (; v < nv; v += blockDim.x) dst[v] = src[v];
    }
  }
}

static const uint32_t kCopyThreads = 256;

void launch_copy_layer(cudaStream_t s, bool to_kv, char *obj, const tk_page_map *map, uint32_t n_pages,
                       const tk_entry_result *results, const uint64_t *kvp, const Geo &g, uint32_t layer) {
  const uint32_t grid = n_pages < 1024 ? n_pages : 1024;
  if (to_kv)
    copy_layer_kernel<true><<<grid, kCopyThreads, 0, s>>>(obj, map, n_pages, results, kvp, g, layer);
  else
    copy_layer_kernel<false><<<grid, kCopyThreads, 0, s>>>(obj, map, n_pages, results, kvp, g, layer);
}

cudaError_t load_copy_layer(void) {
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, copy_layer_kernel<true>);
  return e != cudaSuccess ? e : cudaFuncGetAttributes(&a, copy_layer_kernel<false>);
}
