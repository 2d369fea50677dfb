// tk_crc_kernel.cu — the save's checksums on the GPU: the CRC32C of every
// page plane a gather copies, read from the KV tensors in HBM, so that the
// CPU never reads the gathered bytes (tk_crc.h has the algebra and its host
// test).
#include "tk_crc.h"
#include "tk_ctx.cuh"

// One block per (page, plane) of map, TK_CRC_THREADS threads, thread t on
// segment t of the plane; the shares are XORed through shuffles and shared
// memory. out[i*planes + p] is page i's plane p.
__global__ void __launch_bounds__(TK_CRC_THREADS)
    crc_planes_kernel(const tk_page_map *map, uint32_t n_pages, const uint64_t *kvp, Geo g, uint32_t layer,
                      const tk_crc_plan *plan, uint32_t *out) {
  __shared__ uint32_t table[256];
  __shared__ uint32_t warp_x[TK_CRC_THREADS / 32];
  for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x) table[i] = tk_crc_table_entry(i);
  __syncthreads();
  const uint32_t items = n_pages * g.planes;
  for (uint32_t w = blockIdx.x; w < items; w += gridDim.x) {
    const uint32_t page = w / g.planes, p = w % g.planes;
    const char *src = plane_ptr(kvp, g, layer, p, map[page].dst_page);
    uint32_t x = tk_crc_segment(plan, table, src, threadIdx.x);
    for (int o = 16; o; o >>= 1) x ^= __shfl_xor_sync(0xffffffffu, x, o);
    if ((threadIdx.x & 31) == 0) warp_x[threadIdx.x / 32] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t t = 0;
      for (uint32_t k = 0; k < TK_CRC_THREADS / 32; k++) t ^= warp_x[k];
      out[w] = tk_crc_finish(plan, t);
    }
    __syncthreads();
  }
}

// At most this many blocks: the checksums of a save write take a few SMs
// for microseconds, beside the engine's kernels.
static const uint32_t kCRCBlocks = 128;

void launch_crc_planes(cudaStream_t s, const tk_page_map *map, uint32_t n_pages, const uint64_t *kvp, const Geo &g,
                       uint32_t layer, const tk_crc_plan *plan, uint32_t *out) {
  const uint32_t items = n_pages * g.planes;
  const uint32_t grid = items < kCRCBlocks ? items : kCRCBlocks;
  crc_planes_kernel<<<grid, TK_CRC_THREADS, 0, s>>>(map, n_pages, kvp, g, layer, plan, out);
}

cudaError_t load_crc_planes(void) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, crc_planes_kernel);
}
