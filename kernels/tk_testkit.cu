// libtutti_testkit: content fill and verification of the KV tensors in HBM
// (tk_testkit.h). Tests and benchmarks only; the product's library is
// libtutti_kernels.so (tk_ctx.cuh lists its files).
#include "tk_testkit.h"
#include "tk_geo.cuh"

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static thread_local char g_err[512];

extern "C" tk_status tk_fail_msg(tk_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  va_end(ap);
  return code;
}

extern "C" int32_t tkt_last_error(char *buf, int32_t n) {
  if (!buf || n <= 0) return 0;
  snprintf(buf, (size_t)n, "%s", g_err);
  return (int32_t)strlen(buf);
}

extern "C" int32_t tkt_abi_version(void) { return TK_ABI_VERSION; }

#define CK(call)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      cudaGetLastError();                                                                 \
      return tk_fail_msg(e_ == cudaErrorNoDevice || e_ == cudaErrorInsufficientDriver     \
                             ? TK_ERR_NO_GPU : TK_ERR_CUDA,                               \
                         "%s: %s (%d) at %s:%d", #call, cudaGetErrorString(e_), (int)e_,  \
                         __FILE__, __LINE__);                                             \
    }                                                                                     \
  } while (0)

static const uint32_t kThreads = 256;

// internal/kvdata's generator: word w of (block, layer, plane, page) is
// mix(seed(key) + (w+1)*golden).
__device__ __forceinline__ uint64_t kv_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ uint64_t kv_seed(uint64_t block, uint32_t layer, uint32_t plane, uint32_t page) {
  uint64_t s = kv_mix(block ^ 0x7475747469ull);
  s = kv_mix(s ^ ((uint64_t)layer << 32) ^ (uint64_t)plane);
  return kv_mix(s ^ (uint64_t)page);
}

__global__ void verify_kernel(const tk_page_map *map, uint32_t n_pages, const uint64_t *kvp, Geo g,
                              uint32_t first_layer, uint64_t seed, unsigned long long *mismatches) {
  const uint32_t layer = first_layer + blockIdx.y;
  unsigned long long bad = 0;
  const uint32_t words = (uint32_t)(g.plane_bytes / 8);
  for (uint32_t i = blockIdx.x; i < n_pages; i += gridDim.x) {
    for (uint32_t p = 0; p < g.planes; p++) {
      const uint64_t *kv = (const uint64_t *)plane_ptr(kvp, g, layer, p, map[i].dst_page);
      const uint64_t s = kv_seed(seed + i, layer, p, 0);
      for (uint32_t w = threadIdx.x; w < words; w += blockDim.x)
        bad += kv[w] != kv_mix(s + (uint64_t)(w + 1) * 0x9e3779b97f4a7c15ull);
    }
  }
  for (int o = 16; o > 0; o >>= 1) bad += __shfl_down_sync(0xffffffffu, bad, o);
  if ((threadIdx.x & 31) == 0 && bad) atomicAdd(mismatches, bad);
}

// check_desc refuses a descriptor the kernels could not address.
static tk_status check_desc(const tk_kv *kv) {
  if (!kv || !kv->layers || kv->layers > 1024 || !kv->planes || kv->planes > 2 || !kv->num_pages ||
      kv->layout > TK_LAYOUT_CROSS_LAYER)
    return tk_fail_msg(TK_ERR_INVALID, "kv descriptor: null, or layers/planes/pages/layout out of range");
  const Geo g = geo_of(*kv);
  if (!g.plane_bytes || g.plane_bytes % 16) return tk_fail_msg(TK_ERR_INVALID, "plane bytes %llu", (unsigned long long)g.plane_bytes);
  const uint32_t n = kv->layout == TK_LAYOUT_PER_LAYER ? kv->layers : 1;
  for (uint32_t i = 0; i < n; i++)
    if (!kv->kv_ptrs[i] || kv->kv_ptrs[i] % 16) return tk_fail_msg(TK_ERR_INVALID, "kv pointer %u is null or unaligned", i);
  return TK_OK;
}

extern "C" tk_status tkt_kv_fill(const tk_kv *kv, int32_t device, uint32_t v) {
  tk_status s = check_desc(kv);
  if (s) return s;
  CK(cudaSetDevice(device));
  const Geo g = geo_of(*kv);
  const uint64_t per_layer = g.plane_bytes * g.planes * g.num_pages;
  if (kv->layout == TK_LAYOUT_PER_LAYER) {
    for (uint32_t l = 0; l < kv->layers; l++) CK(cudaMemset((void *)kv->kv_ptrs[l], (int)(v & 0xff), per_layer));
  } else {
    CK(cudaMemset((void *)kv->kv_ptrs[0], (int)(v & 0xff), per_layer * kv->layers));
  }
  CK(cudaDeviceSynchronize());
  return TK_OK;
}

// verify_run holds one verify's device memory, freed on every return path.
struct verify_run {
  tk_page_map *d_map = nullptr;
  uint64_t *d_kvp = nullptr;
  unsigned long long *d_count = nullptr;
  ~verify_run() {
    if (d_map) cudaFree(d_map);
    if (d_kvp) cudaFree(d_kvp);
    if (d_count) cudaFree(d_count);
  }
};

extern "C" tk_status tkt_kv_verify(const tk_kv *kv, int32_t device, uint64_t seed, const tk_page_map *pages,
                                   uint32_t n, uint32_t first_layer, uint32_t n_layers, uint64_t *mismatched) {
  tk_status s = check_desc(kv);
  if (s) return s;
  if (!pages || !mismatched || !n || !n_layers || first_layer + (uint64_t)n_layers > kv->layers)
    return tk_fail_msg(TK_ERR_INVALID, "verify %u pages, layers [%u,+%u) of %u", n, first_layer, n_layers, kv->layers);
  for (uint32_t i = 0; i < n; i++)
    if (pages[i].dst_page >= kv->num_pages)
      return tk_fail_msg(TK_ERR_INVALID, "page %u: destination page %u >= %u", i, pages[i].dst_page, kv->num_pages);
  CK(cudaSetDevice(device));
  // The restore under test may still be running on another library's streams
  // only if its caller broke the contract (wait first); a device-wide sync
  // keeps a verify from racing it anyway.
  CK(cudaDeviceSynchronize());
  verify_run r;
  CK(cudaMalloc(&r.d_map, sizeof(tk_page_map) * n));
  CK(cudaMalloc(&r.d_kvp, sizeof(uint64_t) * 1024));
  CK(cudaMalloc(&r.d_count, sizeof(unsigned long long)));
  CK(cudaMemcpy(r.d_map, pages, sizeof(tk_page_map) * n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(r.d_kvp, kv->kv_ptrs, sizeof(uint64_t) * 1024, cudaMemcpyHostToDevice));
  CK(cudaMemset(r.d_count, 0, sizeof(unsigned long long)));
  dim3 grid(n < 256 ? n : 256, n_layers);
  verify_kernel<<<grid, kThreads>>>(r.d_map, n, r.d_kvp, geo_of(*kv), first_layer, seed, r.d_count);
  CK(cudaGetLastError());
  unsigned long long count = 0;
  CK(cudaMemcpy(&count, r.d_count, sizeof count, cudaMemcpyDeviceToHost));
  *mismatched = count;
  return TK_OK;
}

// An engine's work on the legacy default stream (PyTorch's default): one
// block spinning for ns by the GPU's clock, launched and not waited for.
__global__ void legacy_spin_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

extern "C" tk_status tkt_legacy_spin(int32_t device, uint64_t ns) {
  if (!ns || ns > 60ull * 1000000000ull) return tk_fail_msg(TK_ERR_INVALID, "legacy spin of %llu ns (1 ns..60 s)", (unsigned long long)ns);
  CK(cudaSetDevice(device));
  legacy_spin_kernel<<<1, 32, 0, cudaStreamLegacy>>>(ns);
  CK(cudaGetLastError());
  return TK_OK;
}

extern "C" tk_status tkt_legacy_busy(int32_t device, int32_t *busy) {
  if (!busy) return tk_fail_msg(TK_ERR_INVALID, "tkt_legacy_busy: null argument");
  CK(cudaSetDevice(device));
  cudaError_t e = cudaStreamQuery(cudaStreamLegacy);
  if (e == cudaErrorNotReady) {
    *busy = 1;
    return TK_OK;
  }
  CK(e);
  *busy = 0;
  return TK_OK;
}

extern "C" tk_status tkt_kv_fill_after(const tk_kv *kv, int32_t device, uint32_t v, uint64_t ns, uint64_t *event) {
  if (!event) return tk_fail_msg(TK_ERR_INVALID, "tkt_kv_fill_after: null event");
  if (!ns || ns > 60ull * 1000000000ull) return tk_fail_msg(TK_ERR_INVALID, "fill after a spin of %llu ns (1 ns..60 s)", (unsigned long long)ns);
  tk_status s = check_desc(kv);
  if (s) return s;
  CK(cudaSetDevice(device));
  const Geo g = geo_of(*kv);
  const uint64_t per_layer = g.plane_bytes * g.planes * g.num_pages;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t ev = nullptr;
  legacy_spin_kernel<<<1, 32, 0, st>>>(ns);
  cudaError_t e = cudaGetLastError();
  const uint32_t n = kv->layout == TK_LAYOUT_PER_LAYER ? kv->layers : 1;
  const uint64_t bytes = kv->layout == TK_LAYOUT_PER_LAYER ? per_layer : per_layer * kv->layers;
  for (uint32_t l = 0; e == cudaSuccess && l < n; l++) e = cudaMemsetAsync((void *)kv->kv_ptrs[l], (int)(v & 0xff), bytes, st);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ev, st);
  cudaStreamDestroy(st);  // its work still runs; the stream's resources go when it ends
  if (e != cudaSuccess) {
    if (ev) cudaEventDestroy(ev);
    return tk_fail_msg(TK_ERR_CUDA, "tkt_kv_fill_after: %s (%d)", cudaGetErrorString(e), (int)e);
  }
  *event = (uint64_t)ev;
  return TK_OK;
}

extern "C" tk_status tkt_event_done(uint64_t event, int32_t *done) {
  if (!event || !done) return tk_fail_msg(TK_ERR_INVALID, "tkt_event_done: null argument");
  cudaError_t e = cudaEventQuery((cudaEvent_t)event);
  if (e == cudaErrorNotReady) {
    *done = 0;
    return TK_OK;
  }
  CK(e);
  *done = 1;
  return TK_OK;
}

extern "C" tk_status tkt_event_destroy(uint64_t event) {
  if (!event) return tk_fail_msg(TK_ERR_INVALID, "tkt_event_destroy: null event");
  CK(cudaEventDestroy((cudaEvent_t)event));
  return TK_OK;
}
