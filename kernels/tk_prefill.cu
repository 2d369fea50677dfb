// Prefill compute for the evaluation harness: one layer's GEMMs (cuBLAS,
// bf16 in, fp32 accumulate) on a stream of its own, timed per layer with CUDA
// events, so the GPU work of a prefill contends with a restore for real. The
// ABI is tk_prefill.h.
#include "tk_prefill.h"
#include "tk_testkit.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Pseudo-random bf16 values in (-1, 1): real GEMMs on zeros draw less power
// and clock higher than on data.
__global__ void tkp_fill_bf16(uint16_t *p, uint64_t n, uint64_t seed) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull + seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float f = (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    p[i] = (uint16_t)(__float_as_uint(f) >> 16);
  }
}

namespace {

#define PCK(call)                                                                         \
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

#define BCK(call)                                                                         \
  do {                                                                                    \
    cublasStatus_t s_ = (call);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                      \
      return tk_fail_msg(TK_ERR_CUDA, "%s: cuBLAS status %d at %s:%d", #call, (int)s_,    \
                         __FILE__, __LINE__);                                             \
  } while (0)

const size_t kWorkspaceBytes = 32u << 20;  // cuBLAS's recommendation for Hopper
const uint32_t kMaxLayers = 65536;

struct Prefill {
  int device;
  uint32_t max_layers;
  uint64_t a_elems, b_elems, c_elems;
  void *a, *b, *c, *ws;
  cublasHandle_t blas;
  cudaStream_t stream;
  cudaEvent_t *ev;  // max_layers+1
  uint32_t n_events;
  uint32_t pending;  // layers of the run not waited for; 0 = idle
};

uint64_t round8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }

tk_status fill(void *p, uint64_t n, uint64_t seed, cudaStream_t s) {
  tkp_fill_bf16<<<1024, 256, 0, s>>>((uint16_t *)p, n, seed);
  PCK(cudaGetLastError());
  return TK_OK;
}

// release frees whatever create got to; safe on a partly built handle.
void release(Prefill *h) {
  if (h->stream) cudaStreamSynchronize(h->stream);
  if (h->blas) cublasDestroy(h->blas);
  if (h->ev) {
    for (uint32_t i = 0; i < h->n_events; i++) cudaEventDestroy(h->ev[i]);
    free(h->ev);
  }
  if (h->stream) cudaStreamDestroy(h->stream);
  if (h->a) cudaFree(h->a);
  if (h->b) cudaFree(h->b);
  if (h->c) cudaFree(h->c);
  if (h->ws) cudaFree(h->ws);
  cudaGetLastError();
  free(h);
}

tk_status build(Prefill *h) {
  PCK(cudaSetDevice(h->device));
  PCK(cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking));
  h->ev = (cudaEvent_t *)calloc(h->max_layers + 1, sizeof(cudaEvent_t));
  if (!h->ev) return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_create: no host memory for %u events", h->max_layers + 1);
  for (uint32_t i = 0; i <= h->max_layers; i++) {
    // Timing events; host waits block in the driver instead of spinning, so
    // the harness's CPU backends keep their cores.
    PCK(cudaEventCreateWithFlags(&h->ev[i], cudaEventBlockingSync));
    h->n_events = i + 1;
  }
  PCK(cudaMalloc(&h->a, h->a_elems * 2));
  PCK(cudaMalloc(&h->b, h->b_elems * 2));
  PCK(cudaMalloc(&h->c, h->c_elems * 2));
  PCK(cudaMalloc(&h->ws, kWorkspaceBytes));
  tk_status s;
  if ((s = fill(h->a, h->a_elems, 0x41, h->stream)) != TK_OK) return s;
  if ((s = fill(h->b, h->b_elems, 0x42, h->stream)) != TK_OK) return s;
  PCK(cudaMemsetAsync(h->c, 0, h->c_elems * 2, h->stream));
  BCK(cublasCreate(&h->blas));
  BCK(cublasSetStream(h->blas, h->stream));
  // After SetStream (which resets the workspace): our own, so no GEMM
  // allocates on the hot path.
  BCK(cublasSetWorkspace(h->blas, h->ws, kWorkspaceBytes));
  PCK(cudaStreamSynchronize(h->stream));
  return TK_OK;
}

Prefill *get(uint64_t handle) { return (Prefill *)(uintptr_t)handle; }

}  // namespace

extern "C" tk_status tk_prefill_create(const tk_prefill_params *p, uint64_t *handle) {
  if (!p || !handle) return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_create: NULL argument");
  *handle = 0;
  if (p->max_layers < 1 || p->max_layers > kMaxLayers)
    return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_create: max_layers %u not in 1..%u", p->max_layers, kMaxLayers);
  const uint64_t lim = (uint64_t)1 << 40;  // 2 TiB of bf16: a typo, not a shape
  if (p->a_elems < 1 || p->b_elems < 1 || p->c_elems < 1 || p->a_elems > lim || p->b_elems > lim ||
      p->c_elems > lim)
    return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_create: buffer elements %llu/%llu/%llu not in 1..2^40",
                       (unsigned long long)p->a_elems, (unsigned long long)p->b_elems,
                       (unsigned long long)p->c_elems);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    return tk_fail_msg(TK_ERR_NO_GPU, "no CUDA device: %s", e == cudaSuccess ? "count is 0" : cudaGetErrorString(e));
  }
  if (p->device < 0 || p->device >= n) return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_create: device %d of %d", p->device, n);
  Prefill *h = (Prefill *)calloc(1, sizeof(Prefill));
  if (!h) return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_create: no host memory");
  h->device = p->device;
  h->max_layers = p->max_layers;
  h->a_elems = p->a_elems;
  h->b_elems = p->b_elems;
  h->c_elems = p->c_elems;
  tk_status s = build(h);
  if (s != TK_OK) {
    char msg[512];
    tkt_last_error(msg, (int32_t)sizeof msg);
    release(h);
    return tk_fail_msg(s, "%s", msg);  // release's CUDA calls must not hide the cause
  }
  *handle = (uint64_t)(uintptr_t)h;
  return TK_OK;
}

extern "C" tk_status tk_prefill_run(uint64_t handle, uint32_t n_layers, const tk_gemm *gemms, uint32_t n_gemms) {
  Prefill *h = get(handle);
  if (!h) return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_run: no handle");
  if (h->pending) return tk_fail_msg(TK_ERR_BUSY, "tk_prefill_run: the previous run (%u layers) was not waited for", h->pending);
  if (n_layers < 1 || n_layers > h->max_layers)
    return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_run: %u layers, handle holds 1..%u", n_layers, h->max_layers);
  if (!gemms || n_gemms < 1 || n_gemms > TK_PREFILL_MAX_GEMMS)
    return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_run: %u GEMM descriptors (1..%u)", n_gemms, (unsigned)TK_PREFILL_MAX_GEMMS);
  // Check everything before enqueueing anything.
  uint64_t launches = 0;
  for (uint32_t i = 0; i < n_gemms; i++) {
    const tk_gemm &g = gemms[i];
    if (g.m < 1 || g.n < 1 || g.k < 1 || g.count < 1 || g.m > 0x7ffffff8u || g.n > 0x7ffffff8u || g.k > 0x7ffffff8u)
      return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_run: GEMM %u is %ux%ux%u ×%u", i, g.m, g.n, g.k, g.count);
    uint64_t lda = round8(g.m), ldb = round8(g.k);
    if (lda * g.k > h->a_elems || ldb * g.n > h->b_elems || lda * g.n > h->c_elems)
      return tk_fail_msg(TK_ERR_INVALID,
                         "tk_prefill_run: GEMM %u (%ux%ux%u) needs %llu/%llu/%llu elements, buffers hold %llu/%llu/%llu", i,
                         g.m, g.n, g.k, (unsigned long long)(lda * g.k), (unsigned long long)(ldb * g.n),
                         (unsigned long long)(lda * g.n), (unsigned long long)h->a_elems,
                         (unsigned long long)h->b_elems, (unsigned long long)h->c_elems);
    launches += g.count;
  }
  if (launches * n_layers > TK_PREFILL_MAX_LAUNCHES)
    return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_run: %llu GEMM launches, at most %u",
                       (unsigned long long)(launches * n_layers), TK_PREFILL_MAX_LAUNCHES);
  PCK(cudaSetDevice(h->device));  // the calling thread may not be the creating one
  const float alpha = 1.0f, beta = 0.0f;
  PCK(cudaEventRecord(h->ev[0], h->stream));
  for (uint32_t l = 0; l < n_layers; l++) {
    for (uint32_t i = 0; i < n_gemms; i++) {
      const tk_gemm &g = gemms[i];
      int lda = (int)round8(g.m), ldb = (int)round8(g.k);
      for (uint32_t r = 0; r < g.count; r++) {
        cublasStatus_t s = cublasGemmEx(h->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)g.m, (int)g.n, (int)g.k, &alpha,
                                        h->a, CUDA_R_16BF, lda, h->b, CUDA_R_16BF, ldb, &beta, h->c, CUDA_R_16BF,
                                        lda, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) {
          // Layers before this one are enqueued: wait for them so the
          // handle is idle again, then report.
          cudaStreamSynchronize(h->stream);
          cudaGetLastError();
          return tk_fail_msg(TK_ERR_CUDA, "cublasGemmEx layer %u GEMM %u (%ux%ux%u): cuBLAS status %d", l, i, g.m,
                             g.n, g.k, (int)s);
        }
      }
    }
    cudaError_t e = cudaEventRecord(h->ev[l + 1], h->stream);
    if (e != cudaSuccess) {
      cudaStreamSynchronize(h->stream);
      cudaGetLastError();
      return tk_fail_msg(TK_ERR_CUDA, "cudaEventRecord after layer %u: %s", l, cudaGetErrorString(e));
    }
  }
  h->pending = n_layers;
  return TK_OK;
}

extern "C" tk_status tk_prefill_wait(uint64_t handle, float *layer_ms, uint32_t n_layer_ms) {
  Prefill *h = get(handle);
  if (!h) return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_wait: no handle");
  if (!h->pending) return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_wait: nothing enqueued");
  if (n_layer_ms > 0 && !layer_ms) return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_wait: NULL layer_ms");
  uint32_t n = h->pending;
  h->pending = 0;  // waited for, whatever the outcome: the handle can run again
  PCK(cudaSetDevice(h->device));
  PCK(cudaEventSynchronize(h->ev[n]));
  for (uint32_t l = 0; l < n && l < n_layer_ms; l++) PCK(cudaEventElapsedTime(&layer_ms[l], h->ev[l], h->ev[l + 1]));
  return TK_OK;
}

extern "C" tk_status tk_prefill_destroy(uint64_t handle) {
  Prefill *h = get(handle);
  if (!h) return tk_fail_msg(TK_ERR_INVALID, "tk_prefill_destroy: no handle");
  cudaSetDevice(h->device);
  release(h);
  return TK_OK;
}
