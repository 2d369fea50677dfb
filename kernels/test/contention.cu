// contention.cu — which part of a GPU-driven restore, or of a save's gather,
// slows a prefill's GEMMs running beside it (its figures: BENCHMARKS.md, What a
// serving workload gains, the live check).
//
// The prefill is the harness's stand-in for one docqa question (llama3-8b,
// tokens in cuBLAS's n): per layer the linear GEMM and the attention GEMM.
// It is timed alone, then beside each part of a restore's GPU work, emulated
// with the restore's own shapes and the product's launch parameters:
//   spin      the ring kernel's poll: one block of 128 threads reading a
//             host-mapped word (ld.acquire.sys) and fencing (membar.sys)
//             per lap, one launch per layer period, high-priority stream;
//   spin-nap  the same with __nanosleep between laps that found nothing;
//   h2d       the staging copy: cudaMemcpyAsync of a layer from pinned host
//             memory into device staging, once per layer period;
//   scatter   the copy kernel (one block per page, up to GRID blocks of 256
//             threads, 16-byte vectors) from device staging into the pages;
//   zc        the zero-copy scatter: the same kernel reading pinned host
//             memory over PCIe;
//   gather-zc the save's gather as it was (tk_gather_lane, ABI 5): the copy
//             kernel from the pages into pinned host memory, writing over PCIe;
//   gather-staged  the product's gather (ABI 6): the copy kernel within HBM into
//             device staging, then cudaMemcpyAsync to pinned host memory (the
//             copy engine), the same bytes per period;
// and their combinations. Prints the prefill's time per layer (median of
// REPS) and its ratio to alone.
//
// Build and run on the GPU machine (make -C kernels contention):
//   build/contention [tokens] [layer_mib] [period_us] [reps]
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#define CK(x)                                                                                         \
  do {                                                                                                \
    cudaError_t e_ = (x);                                                                             \
    if (e_ != cudaSuccess) {                                                                          \
      fprintf(stderr, "%s: %s at %s:%d\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__);          \
      exit(1);                                                                                        \
    }                                                                                                 \
  } while (0)

static const int kLayers = 32, kPageBytes = 16 * 128 * 1024 / 32 / 2;  // a 16-token page's plane of one layer

__device__ __forceinline__ uint64_t gtimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// spin_kernel polls *word like the ring kernel polls the CQ tail, for
// dur_ns; nap_ns > 0 sleeps between laps.
__global__ void spin_kernel(const uint32_t *word, uint64_t dur_ns, uint32_t nap_ns, uint32_t *sink) {
  __shared__ uint32_t s_v, s_stop;
  const uint64_t end = gtimer() + dur_ns;
  uint32_t acc = 0;
  for (;;) {
    if (threadIdx.x == 0) {
      uint32_t v;
      asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
      s_v = v;
      __threadfence_system();
      s_stop = gtimer() > end;
    }
    __syncthreads();
    acc += s_v;
    if (s_stop) break;
    if (nap_ns) __nanosleep(nap_ns);
    __syncthreads();
  }
  if (threadIdx.x == 0) *sink = acc;
}

// scatter_kernel: the product's copy kernel's loop (tk_copy_kernel.cu) over
// n_pages pages of page_bytes, src page i to dst page perm[i].
__global__ void scatter_kernel(const char *src, char *dst, const uint32_t *perm, uint32_t n_pages, uint32_t page_bytes) {
  for (uint32_t i = blockIdx.x; i < n_pages; i += gridDim.x) {
    const uint4 *s = (const uint4 *)(src + (uint64_t)i * page_bytes);
    uint4 *d = (uint4 *)(dst + (uint64_t)perm[i] * page_bytes);
    const uint32_t nv = page_bytes / 16;
    uint32_t v = threadIdx.x;
    for (; v + 3 * blockDim.x < nv; v += 4 * blockDim.x) {
      uint4 a = s[v], b = s[v + blockDim.x], c = s[v + 2 * blockDim.x], e = s[v + 3 * blockDim.x];
      d[v] = a; d[v + blockDim.x] = b; d[v + 2 * blockDim.x] = c; d[v + 3 * blockDim.x] = e;
    }
    for (; v < nv; v += blockDim.x) d[v] = s[v];
  }
}

// gather_kernel: the copy kernel's save direction, page perm[i] of src to
// dst page i.
__global__ void gather_kernel(const char *src, char *dst, const uint32_t *perm, uint32_t n_pages, uint32_t page_bytes) {
  for (uint32_t i = blockIdx.x; i < n_pages; i += gridDim.x) {
    const uint4 *s = (const uint4 *)(src + (uint64_t)perm[i] * page_bytes);
    uint4 *d = (uint4 *)(dst + (uint64_t)i * page_bytes);
    for (uint32_t v = threadIdx.x; v < page_bytes / 16; v += blockDim.x) d[v] = s[v];
  }
}

struct Bg {
  bool spin = false, h2d = false, scatter = false, zc = false, gzc = false, gstaged = false;
  uint32_t nap_ns = 0, grid = 1024;
  std::string name;
};

struct World {
  cudaStream_t pf, io, h2d, sc;
  cublasHandle_t blas;
  void *a, *b, *c;
  char *host_stage, *dev_stage, *pool;
  uint32_t *perm, *word, *sink;
  uint32_t n_pages;
  uint64_t layer_bytes;
  int tokens;
  uint32_t period_us;
};

struct Driver {
  World *w;
  Bg bg;
  std::atomic<bool> stop{false};
};

static void *drive(void *arg) {
  Driver *d = (Driver *)arg;
  World *w = d->w;
  CK(cudaSetDevice(0));
  cudaEvent_t copied;
  CK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  const uint32_t grid = std::min(d->bg.grid, w->n_pages);
  while (!d->stop.load()) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (d->bg.spin) spin_kernel<<<1, 128, 0, w->io>>>(w->word, (uint64_t)w->period_us * 1000, d->bg.nap_ns, w->sink);
    if (d->bg.h2d) {
      CK(cudaMemcpyAsync(w->dev_stage, w->host_stage, w->layer_bytes, cudaMemcpyHostToDevice, w->h2d));
      CK(cudaEventRecord(copied, w->h2d));
      CK(cudaStreamWaitEvent(w->sc, copied, 0));
    }
    if (d->bg.scatter)
      scatter_kernel<<<grid, 256, 0, w->sc>>>(w->dev_stage, w->pool, w->perm, w->n_pages, kPageBytes);
    if (d->bg.zc)
      scatter_kernel<<<grid, 256, 0, w->sc>>>(w->host_stage, w->pool, w->perm, w->n_pages, kPageBytes);
    if (d->bg.gzc) gather_kernel<<<grid, 256, 0, w->sc>>>(w->pool, w->host_stage, w->perm, w->n_pages, kPageBytes);
    if (d->bg.gstaged) {
      gather_kernel<<<grid, 256, 0, w->sc>>>(w->pool, w->dev_stage, w->perm, w->n_pages, kPageBytes);
      CK(cudaMemcpyAsync(w->host_stage, w->dev_stage, w->layer_bytes, cudaMemcpyDeviceToHost, w->sc));
    }
    CK(cudaGetLastError());
    // pace: one layer per period, like a restore bound by its devices
    CK(cudaStreamSynchronize(w->sc));
    CK(cudaStreamSynchronize(w->h2d));
    for (;;) {
      struct timespec t;
      clock_gettime(CLOCK_MONOTONIC, &t);
      double us = (t.tv_sec - t0.tv_sec) * 1e6 + (t.tv_nsec - t0.tv_nsec) / 1e3;
      if (us >= w->period_us || d->stop.load()) break;
      usleep(20);
    }
  }
  CK(cudaStreamSynchronize(w->io));
  cudaEventDestroy(copied);
  return nullptr;
}

// prefill times one request's GEMMs: per layer the linear and attention
// GEMMs; returns ms per layer.
static float prefill(World *w) {
  const float alpha = 1, beta = 0;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, w->pf));
  for (int l = 0; l < kLayers; l++) {
    // linear: C[61264 x tokens] = W[61264 x 4096] . X[4096 x tokens]
    cublasGemmEx(w->blas, CUBLAS_OP_N, CUBLAS_OP_N, 61264, w->tokens, 4096, &alpha, w->a, CUDA_R_16BF, 61264, w->b,
                 CUDA_R_16BF, 4096, &beta, w->c, CUDA_R_16BF, 61264, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    // attention over 6016 cached keys, head dim folded (4096)
    cublasGemmEx(w->blas, CUBLAS_OP_N, CUBLAS_OP_N, 6016, w->tokens, 4096, &alpha, w->a, CUDA_R_16BF, 6016, w->b,
                 CUDA_R_16BF, 4096, &beta, w->c, CUDA_R_16BF, 6016, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
  CK(cudaEventRecord(e1, w->pf));
  CK(cudaEventSynchronize(e1));
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / kLayers;
}

static float run(World *w, const Bg &bg, int reps) {
  std::vector<float> t;
  Driver d;
  d.w = w;
  d.bg = bg;
  pthread_t th;
  const bool any = bg.spin || bg.h2d || bg.scatter || bg.zc || bg.gzc || bg.gstaged;
  if (any) {
    pthread_create(&th, nullptr, drive, &d);
    usleep(5000);
  }
  for (int r = 0; r < reps; r++) t.push_back(prefill(w));
  if (any) {
    d.stop = true;
    pthread_join(th, nullptr);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char **argv) {
  World w;
  w.tokens = argc > 1 ? atoi(argv[1]) : 176;
  const uint64_t layer_mib = argc > 2 ? atoi(argv[2]) : 24;
  w.period_us = argc > 3 ? atoi(argv[3]) : 1600;
  const int reps = argc > 4 ? atoi(argv[4]) : 15;
  CK(cudaSetDevice(0));
  CK(cudaSetDeviceFlags(cudaDeviceMapHost));
  int lo, hi;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CK(cudaStreamCreateWithFlags(&w.pf, cudaStreamNonBlocking));
  w.layer_bytes = layer_mib << 20;
  w.n_pages = (uint32_t)(w.layer_bytes / kPageBytes);
  CK(cudaMalloc(&w.a, (size_t)61264 * 4096 * 2));
  CK(cudaMalloc(&w.b, (size_t)4096 * 4096 * 2));
  CK(cudaMalloc(&w.c, (size_t)61264 * 4096 * 2));
  CK(cudaMemset(w.a, 0, (size_t)61264 * 4096 * 2));
  CK(cudaMemset(w.b, 0, (size_t)4096 * 4096 * 2));
  CK(cudaHostAlloc(&w.host_stage, w.layer_bytes, cudaHostAllocMapped));
  memset(w.host_stage, 1, w.layer_bytes);
  CK(cudaMalloc(&w.dev_stage, w.layer_bytes));
  const uint64_t pool_pages = 8 * (uint64_t)w.n_pages;
  CK(cudaMalloc(&w.pool, pool_pages * kPageBytes));
  std::vector<uint32_t> perm(w.n_pages);
  srand(1);
  for (uint32_t i = 0; i < w.n_pages; i++) perm[i] = (uint32_t)(((uint64_t)rand() * pool_pages) / ((uint64_t)RAND_MAX + 1));
  CK(cudaMalloc(&w.perm, w.n_pages * 4));
  CK(cudaMemcpy(w.perm, perm.data(), w.n_pages * 4, cudaMemcpyHostToDevice));
  CK(cudaHostAlloc(&w.word, 64, cudaHostAllocMapped));
  CK(cudaMalloc(&w.sink, 4));
  if (cublasCreate(&w.blas) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(w.blas, w.pf);
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("device %s, %d SMs; prefill %d tokens x %d layers; restore emulated: %llu MiB per layer every %u us (%.1f GB/s), %u pages of %d bytes\n",
         p.name, p.multiProcessorCount, w.tokens, kLayers, (unsigned long long)layer_mib, w.period_us,
         w.layer_bytes / (w.period_us * 1e3), w.n_pages, kPageBytes);
  for (int i = 0; i < 5; i++) prefill(&w);  // warm cuBLAS's heuristics and clocks

  std::vector<Bg> cases;
  auto add = [&](const char *name, bool spin, uint32_t nap, bool h2d, bool sc, bool zc, uint32_t grid, bool) {
    Bg b;
    b.name = name; b.spin = spin; b.nap_ns = nap; b.h2d = h2d; b.scatter = sc; b.zc = zc; b.grid = grid;
    cases.push_back(b);
  };
  add("alone", false, 0, false, false, false, 1024, false);
  add("spin", true, 0, false, false, false, 1024, false);
  add("spin-nap1us", true, 1000, false, false, false, 1024, false);
  add("spin-nap10us", true, 10000, false, false, false, 1024, false);
  add("h2d", false, 0, true, false, false, 1024, false);
  add("h2d+scatter g1024", false, 0, true, true, false, 1024, false);
  add("h2d+scatter g132", false, 0, true, true, false, 132, false);
  add("h2d+scatter g32", false, 0, true, true, false, 32, false);
  add("zc g1024", false, 0, false, false, true, 1024, false);
  add("zc g32", false, 0, false, false, true, 32, false);
  add("product: spin+h2d+scatter g1024", true, 0, true, true, false, 1024, false);
  add("spin-nap1us+h2d+scatter g1024", true, 1000, true, true, false, 1024, false);
  add("spin-nap1us+h2d+scatter g132", true, 1000, true, true, false, 132, false);
  add("spin-nap1us+h2d+scatter g32", true, 1000, true, true, false, 32, false);
  for (uint32_t g : {1024u, 132u}) {
    Bg b;
    b.grid = g;
    b.gzc = true;
    b.name = "gather-zc g" + std::to_string(g);
    cases.push_back(b);
    b.gzc = false;
    b.gstaged = true;
    b.name = "gather-staged g" + std::to_string(g);
    cases.push_back(b);
  }
  float alone = 0;
  for (int prio = 0; prio < 2; prio++) {
    const int pr = prio == 0 ? hi : lo;
    CK(cudaStreamCreateWithPriority(&w.io, cudaStreamNonBlocking, pr));
    CK(cudaStreamCreateWithPriority(&w.h2d, cudaStreamNonBlocking, pr));
    CK(cudaStreamCreateWithPriority(&w.sc, cudaStreamNonBlocking, pr));
    printf("-- restore streams at %s priority (%d; range %d..%d)\n", prio == 0 ? "high" : "the prefill's", pr, lo, hi);
    for (const Bg &b : cases) {
      if (prio == 1 && b.name == "alone") continue;
      float ms = run(&w, b, reps);
      if (b.name == "alone") alone = ms;
      printf("%-36s %8.1f us/layer  %5.2fx alone\n", b.name.c_str(), ms * 1e3, ms / alone);
      fflush(stdout);
    }
    cudaStreamDestroy(w.io);
    cudaStreamDestroy(w.h2d);
    cudaStreamDestroy(w.sc);
  }
  return 0;
}
