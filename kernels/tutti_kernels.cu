// libtutti_kernels: GPU-driven io_uring restore, paged-KV scatter/gather.
// The ABI is tutti_kernels.h; read it first. Design notes in kernels/doc.go.
#include "tutti_kernels.h"
#include "tk_geo.cuh"
#include "tk_internal.cuh"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


// ---------------------------------------------------------------- device side

struct KVDesc {
  uint64_t ptrs[1024];  // per-layer tensors or [0] = cross-layer base (passed via device copy)
};

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// A plain load after another thread's acquire and a barrier could be served
// from a stale L1 line of the previous lap of the CQ ring: read it strong.
__device__ __forceinline__ unsigned long long ld_relaxed_sys_u64(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Device view of the io_uring: addresses are device aliases of the host ring.
struct DRing {
  uint32_t *sq_head, *sq_tail, *sq_array;
  unsigned long long *sqes;  // 8 words per SQE
  uint32_t *cq_head, *cq_tail;
  const unsigned long long *cqes;  // 2 words per CQE
  uint32_t sq_entries, sq_mask, cq_entries, cq_mask;
};

// Ring state owned by the GPU (device memory), persistent across kernels.
struct DState {
  uint32_t sq_tail, cq_head, inflight, broken;
  uint32_t stray;  // CQEs that belonged to no live request (after a timeout)
};

// A request slot's device view.
struct DReq {
  const tk_io_entry *entries;  // n_layers*epl
  tk_entry_result *results;    // host-mapped, device alias
  uint32_t *done;              // per-layer completions (device memory)
  uint32_t *cursor;            // next entry to submit (device memory)
  uint32_t n_layers, epl, slot_id;
  uint32_t seq0;               // global layer sequence of the request's layer 0 (staging slots)
  uint64_t staging_host;       // host address of the staging pool (SQE addresses are host addresses)
  uint64_t slot_bytes;
  uint32_t n_slots;
};

enum { OP_READ = 22, OP_WRITE = 23, OP_READ_FIXED = 4, OP_WRITE_FIXED = 5 };

// One launch per layer, one block. Submits entries of layers [0, layer+lookahead]
// of the request as SQ space and the window allow, reaps CQEs into per-entry
// results, and returns once every entry of `layer` completed (or timed out).
// Kernels of one context run in order on one stream, so only one touches the ring.
__global__ void io_layer_kernel(DRing r, DState *st, DReq q, uint32_t layer, uint32_t lookahead,
                                uint32_t window, uint64_t timeout_ns) {
  __shared__ uint32_t s_tail, s_n, s_cursor, s_stop, s_head, s_ctail, s_ours, s_stray;
  const uint32_t total_end = min(q.n_layers, layer + 1 + lookahead) * q.epl;
  const uint32_t need_end = (layer + 1) * q.epl;
  if (threadIdx.x == 0) s_stop = 0;
  __syncthreads();
  if (st->broken) {
    // An earlier timeout left I/O in flight: nothing is submitted, nothing is scattered.
    for (uint32_t e = threadIdx.x + layer * q.epl; e < need_end; e += blockDim.x)
      if (q.results[e].status == TK_ENTRY_PENDING) q.results[e].status = TK_ENTRY_SKIPPED;
    if (threadIdx.x == 0) { q.done[layer] = q.epl; *q.cursor = max(*q.cursor, need_end); }
    return;
  }
  uint64_t last_progress = globaltimer_ns();
  for (;;) {
    if (threadIdx.x == 0) {
      uint32_t cur = *q.cursor;
      uint32_t tail = st->sq_tail;
      uint32_t head = ld_acquire_sys(r.sq_head);
      uint32_t sq_free = r.sq_entries - (tail - head);
      uint32_t room = window > st->inflight ? window - st->inflight : 0;
      uint32_t n = total_end > cur ? total_end - cur : 0;
      n = min(n, min(room, sq_free));
      s_tail = tail;
      s_n = n;
      s_cursor = cur;
    }
    __syncthreads();
    const uint32_t n = s_n;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t e = s_cursor + i;
      const tk_io_entry en = q.entries[e];
      const uint32_t l = e / q.epl;
      const uint64_t slot = (uint64_t)((q.seq0 + l) % q.n_slots);
      const uint64_t addr = q.staging_host + slot * q.slot_bytes + en.slot_off;
      const uint32_t idx = (s_tail + i) & r.sq_mask;
      unsigned long long *s = r.sqes + (uint64_t)idx * 8;
      const bool fixed_buf = (en.flags & TK_IO_FIXED_BUF) != 0;
      const uint32_t op = (en.flags & TK_IO_WRITE) ? (fixed_buf ? OP_WRITE_FIXED : OP_WRITE)
                                                   : (fixed_buf ? OP_READ_FIXED : OP_READ);
      const uint32_t sqe_flags = (en.flags & TK_IO_FIXED_FILE) ? 1u : 0u;  // IOSQE_FIXED_FILE
      s[0] = (unsigned long long)op | ((unsigned long long)sqe_flags << 8) |
             ((unsigned long long)(uint32_t)en.fd << 32);
      s[1] = en.offset;
      s[2] = addr;
      s[3] = (unsigned long long)en.len;  // rw_flags = 0
      s[4] = ((unsigned long long)q.slot_id << 32) | e;
      s[5] = fixed_buf ? slot : 0;  // buf_index (u16) = staging slot; personality, file_index 0
      s[6] = 0;
      s[7] = 0;
      if (r.sq_array) r.sq_array[idx] = idx;
      __threadfence_system();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (n) {
        st->sq_tail = s_tail + n;
        st_release_sys(r.sq_tail, s_tail + n);
        *q.cursor = s_cursor + n;
        st->inflight += n;
      }
      s_head = st->cq_head;
      s_ctail = ld_acquire_sys(r.cq_tail);
      s_ours = 0;
      s_stray = 0;
    }
    __syncthreads();
    // Reap every CQE present, one per thread: each CQE is two loads over
    // PCIe, and reaping a wake-up's batch of 32 one after another kept the
    // SQEs that refill the window from being published for tens of µs.
    const uint32_t head0 = s_head, n_cqe = s_ctail - s_head;
    for (uint32_t i = threadIdx.x; i < n_cqe; i += blockDim.x) {
      const unsigned long long *c = r.cqes + (uint64_t)((head0 + i) & r.cq_mask) * 2;
      const unsigned long long ud = ld_relaxed_sys_u64(c);
      const int32_t res = (int32_t)(ld_relaxed_sys_u64(c + 1) & 0xffffffffull);
      const uint32_t e = (uint32_t)ud;
      if ((uint32_t)(ud >> 32) != q.slot_id || e >= q.n_layers * q.epl) {
        atomicAdd(&s_stray, 1u);
        continue;
      }
      atomicAdd(&s_ours, 1u);
      const uint32_t need = q.entries[e].min_len;
      tk_entry_result out;
      out.res = res;
      out.status = res < 0 ? TK_ENTRY_IOERR : ((uint32_t)res >= need ? TK_ENTRY_OK : TK_ENTRY_SHORT);
      q.results[e] = out;
      atomicAdd(&q.done[e / q.epl], 1u);
    }
    if (threadIdx.x < n_cqe) __threadfence_system();  // results out before the head moves
    __syncthreads();  // every CQE read and counted before the head is released
    if (threadIdx.x == 0) {
      const bool progress = n != 0 || n_cqe != 0;
      if (n_cqe) {
        st->inflight -= s_ours;
        st->stray += s_stray;
        st->cq_head = s_ctail;
        st_release_sys(r.cq_head, s_ctail);
      }
      const uint64_t now = globaltimer_ns();
      if (progress) last_progress = now;
      if (q.done[layer] >= q.epl) {
        s_stop = 1;
      } else if (now - last_progress > timeout_ns) {
        // Entries in flight may still land later: the ring is broken from now on.
        st->broken = 1;
        const uint32_t cur = *q.cursor;
        for (uint32_t e = 0; e < q.n_layers * q.epl; e++) {
          if (q.results[e].status != TK_ENTRY_PENDING) continue;
          q.results[e].status = e < cur ? TK_ENTRY_TIMEOUT : TK_ENTRY_SKIPPED;
        }
        for (uint32_t l = 0; l < q.n_layers; l++) q.done[l] = q.epl;
        *q.cursor = q.n_layers * q.epl;
        s_stop = 1;
      }
      __threadfence_system();
    }
    __syncthreads();
    if (s_stop) break;
  }
}

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

// ---------------------------------------------------------------- context

static const uint32_t kCopyThreads = 256;
static const uint32_t kIOThreads = 128;

struct Req {
  bool busy;
  uint32_t n_layers, first_layer, epl, n_pages, seq0;
  uint32_t enqueued;  // layers [0, enqueued) are on the streams
  uint64_t copy_bytes;  // bytes of a staging slot the page map reads (the H2D copy's length)
  tk_io_entry *up_entries;  // pinned upload buffers
  tk_page_map *up_pages;
  tk_io_entry *d_entries;
  tk_page_map *d_pages;
  uint32_t *d_done;  // [layers] + cursor
  tk_entry_result *h_results, *d_results;  // pinned mapped
  cudaEvent_t start;
  cudaEvent_t *io_done, *ready;  // [layers]
};

struct Ctx {
  int device;
  tk_kv kv;
  Geo geo;
  uint64_t *d_kvp;  // device copy of kv pointers
  uint64_t staging_host, staging_dev, staging_bytes, slot_bytes;
  uint32_t n_slots, max_pages, max_entries, max_requests, window, lookahead;
  uint64_t timeout_ns;
  bool has_ring;
  DRing ring;
  volatile uint32_t *h_sq_head, *h_sq_tail, *h_cq_head, *h_cq_tail, *h_sq_flags;  // host view, diagnostics
  uint64_t ring_regions[TK_MAX_RING_REGIONS];
  uint32_t n_ring_regions;
  DState *d_state;
  cudaStream_t io, scatter, copy;
  // Restores without zero copy: the copy engine moves each layer from host
  // staging into one of two device staging slots (h2d stream), the scatter
  // reads it there.
  bool zero_copy;
  cudaStream_t h2d;
  char *d_stage[2];
  cudaEvent_t dstage_ready[2], dstage_free[2];
  cudaEvent_t *slot_free;   // [n_slots]
  cudaEvent_t *copy_events; // [n_slots]
  uint32_t seq;             // global layer sequence (staging slot = seq % n_slots)
  Req *reqs;
  tk_page_map *d_host_map;
  uint32_t host_map_pages;
  uint64_t host_map_end;
  bool staging_ours;
};

static Ctx *as_ctx(uint64_t h) { return (Ctx *)h; }

static tk_status map_ring_field(const Ctx *c, uint64_t host, uint64_t bytes, void **dev) {
  uint64_t d;
  if (!lookup(host, bytes, &d))
    return fail(TK_ERR_INVALID, "ring field %#llx (+%llu) lies in no registered ring region",
                (unsigned long long)host, (unsigned long long)bytes);
  *dev = (void *)d;
  return TK_OK;
}

static tk_status bind_ring(Ctx *c, const tk_ring *r) {
  if (r->sqe_bytes != 64 || r->cqe_bytes != 16)
    return fail(TK_ERR_NOT_SUPPORTED, "ring with %u-byte SQEs / %u-byte CQEs (want 64/16)", r->sqe_bytes, r->cqe_bytes);
  if (!r->sq_entries || (r->sq_entries & (r->sq_entries - 1)) || !r->cq_entries || (r->cq_entries & (r->cq_entries - 1)))
    return fail(TK_ERR_INVALID, "ring sizes %u/%u are not powers of two", r->sq_entries, r->cq_entries);
  if (r->n_regions == 0 || r->n_regions > TK_MAX_RING_REGIONS)
    return fail(TK_ERR_INVALID, "ring regions: %u", r->n_regions);
  for (uint32_t i = 0; i < r->n_regions; i++) {
    tk_status s = region_add(r->region_addr[i], r->region_bytes[i], true);
    if (s) return s;
    c->ring_regions[c->n_ring_regions++] = r->region_addr[i];
  }
  tk_status s;
  void *p;
#define MAPF(field, bytes, dst)                               \
  if ((s = map_ring_field(c, r->field, bytes, &p))) return s; \
  dst = (decltype(dst))p;
  MAPF(sq_head, 4, c->ring.sq_head);
  MAPF(sq_tail, 4, c->ring.sq_tail);
  MAPF(sqes, (uint64_t)r->sq_entries * 64, c->ring.sqes);
  MAPF(cq_head, 4, c->ring.cq_head);
  MAPF(cq_tail, 4, c->ring.cq_tail);
  MAPF(cqes, (uint64_t)r->cq_entries * 16, c->ring.cqes);
  c->ring.sq_array = nullptr;
  if (r->sq_array) { MAPF(sq_array, (uint64_t)r->sq_entries * 4, c->ring.sq_array); }
#undef MAPF
  c->h_sq_head = (volatile uint32_t *)r->sq_head;
  c->h_sq_tail = (volatile uint32_t *)r->sq_tail;
  c->h_cq_head = (volatile uint32_t *)r->cq_head;
  c->h_cq_tail = (volatile uint32_t *)r->cq_tail;
  c->h_sq_flags = (volatile uint32_t *)r->sq_flags;
  c->ring.sq_entries = r->sq_entries;
  c->ring.sq_mask = *(const uint32_t *)r->sq_mask;
  c->ring.cq_entries = r->cq_entries;
  c->ring.cq_mask = *(const uint32_t *)r->cq_mask;
  if (c->ring.sq_mask != r->sq_entries - 1 || c->ring.cq_mask != r->cq_entries - 1)
    return fail(TK_ERR_INVALID, "ring masks %u/%u disagree with sizes %u/%u", c->ring.sq_mask, c->ring.cq_mask,
                r->sq_entries, r->cq_entries);
  // The GPU continues from the ring's current indices.
  DState st{};
  st.sq_tail = *(volatile uint32_t *)r->sq_tail;
  st.cq_head = *(volatile uint32_t *)r->cq_head;
  if (st.sq_tail != *(volatile uint32_t *)r->sq_head || st.cq_head != *(volatile uint32_t *)r->cq_tail)
    return fail(TK_ERR_INVALID, "ring is not idle at bind (sq %u/%u, cq %u/%u)", *(volatile uint32_t *)r->sq_head,
                st.sq_tail, st.cq_head, *(volatile uint32_t *)r->cq_tail);
  CK(cudaMemcpy(c->d_state, &st, sizeof st, cudaMemcpyHostToDevice));
  c->window = c->window ? c->window : 128;
  if (c->window > r->sq_entries) c->window = r->sq_entries;
  if (c->window > r->cq_entries) c->window = r->cq_entries;  // the CQ never overflows
  c->has_ring = true;
  return TK_OK;
}

static void free_ctx(Ctx *c);

static tk_status check_kv(const tk_kv &kv) {
  if (!kv.layers || kv.layers > 1024 || !kv.planes || kv.planes > 2 || !kv.page_tokens || !kv.kv_heads ||
      !kv.head_dim || !kv.dtype_bytes || !kv.num_pages)
    return fail(TK_ERR_INVALID, "kv geometry: layers=%u planes=%u page_tokens=%u kv_heads=%u head_dim=%u dtype=%u pages=%u",
                kv.layers, kv.planes, kv.page_tokens, kv.kv_heads, kv.head_dim, kv.dtype_bytes, kv.num_pages);
  uint64_t pb = (uint64_t)kv.page_tokens * kv.kv_heads * kv.head_dim * kv.dtype_bytes;
  if (pb % 16) return fail(TK_ERR_INVALID, "plane bytes %llu not a multiple of 16", (unsigned long long)pb);
  uint32_t n = kv.layout == TK_LAYOUT_PER_LAYER ? kv.layers : 1;
  if (kv.layout > TK_LAYOUT_CROSS_LAYER) return fail(TK_ERR_INVALID, "layout %u", kv.layout);
  for (uint32_t i = 0; i < n; i++) {
    if (!kv.kv_ptrs[i] || kv.kv_ptrs[i] % 16) return fail(TK_ERR_INVALID, "kv pointer %u is null or not 16-byte aligned", i);
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, (void *)kv.kv_ptrs[i]);
    if (e != cudaSuccess || a.type != cudaMemoryTypeDevice) {
      cudaGetLastError();
      return fail(TK_ERR_INVALID, "kv pointer %u (%#llx) is not device memory", i, (unsigned long long)kv.kv_ptrs[i]);
    }
  }
  return TK_OK;
}

extern "C" tk_status tk_bind(const tk_bind_params *p, uint64_t *out) {
  if (!p || !out) return fail(TK_ERR_INVALID, "tk_bind: null argument");
  if (p->abi_version != TK_ABI_VERSION) return fail(TK_ERR_INVALID, "abi %u, library %d", p->abi_version, TK_ABI_VERSION);
  tk_status s = check_kv(p->kv);
  if (s) return s;
  if (!p->staging_slots || !p->max_pages || !p->max_entries || !p->max_requests || p->max_requests > 64)
    return fail(TK_ERR_INVALID, "slots=%u max_pages=%u max_entries=%u max_requests=%u", p->staging_slots,
                p->max_pages, p->max_entries, p->max_requests);
  if (!p->staging_addr || p->staging_addr % 4096 || p->staging_bytes % p->staging_slots ||
      (p->staging_bytes / p->staging_slots) % 4096)
    return fail(TK_ERR_INVALID, "staging %#llx+%llu in %u slots: want page-aligned slots",
                (unsigned long long)p->staging_addr, (unsigned long long)p->staging_bytes, p->staging_slots);
  if (p->ring && p->staging_slots < p->lookahead + 2)
    return fail(TK_ERR_INVALID, "staging slots %u < lookahead %u + 2", p->staging_slots, p->lookahead);
  CK(cudaSetDevice(p->device));
  Ctx *c = (Ctx *)calloc(1, sizeof(Ctx));
  if (!c) return fail(TK_ERR_INVALID, "out of host memory");
  c->device = p->device;
  c->kv = p->kv;
  c->geo = geo_of(p->kv);
  c->staging_host = p->staging_addr;
  c->staging_bytes = p->staging_bytes;
  c->n_slots = p->staging_slots;
  c->slot_bytes = p->staging_bytes / p->staging_slots;
  c->max_pages = p->max_pages;
  c->max_entries = p->max_entries;
  c->max_requests = p->max_requests;
  c->window = p->io_window;
  c->lookahead = p->lookahead;
  c->timeout_ns = p->poll_timeout_ns ? p->poll_timeout_ns : 5000000000ull;
#define TRY(x)                       \
  do {                               \
    tk_status s_ = (x);              \
    if (s_) { free_ctx(c); return s_; } \
  } while (0)
#define TRYC(call)                                                                                    \
  do {                                                                                                \
    cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) {                                                                          \
      cudaGetLastError();                                                                             \
      tk_status s_ = fail(TK_ERR_CUDA, "%s: %s at %s:%d", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      free_ctx(c);                                                                                    \
      return s_;                                                                                      \
    }                                                                                                 \
  } while (0)
  TRY(region_add(c->staging_host, c->staging_bytes, false));
  c->staging_ours = true;
  if (!lookup(c->staging_host, c->staging_bytes, &c->staging_dev)) TRY(fail(TK_ERR_INVALID, "staging lookup"));
  TRYC(cudaMalloc(&c->d_kvp, sizeof(uint64_t) * 1024));
  TRYC(cudaMemcpy(c->d_kvp, p->kv.kv_ptrs, sizeof(uint64_t) * 1024, cudaMemcpyHostToDevice));
  TRYC(cudaMalloc(&c->d_state, sizeof(DState)));
  TRYC(cudaMemset(c->d_state, 0, sizeof(DState)));
  // The I/O and scatter streams run at the device's highest priority: the
  // I/O kernel is one block that must get an SM while the engine's GEMMs fill
  // every SM, else the reads wait for whole GEMM grids (restores next to a
  // prefill on the default priority slow to a crawl).
  int prio_low = 0, prio_high = 0;
  TRYC(cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high));
  TRYC(cudaStreamCreateWithPriority(&c->io, cudaStreamNonBlocking, prio_high));
  TRYC(cudaStreamCreateWithPriority(&c->scatter, cudaStreamNonBlocking, prio_high));
  TRYC(cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking));
  c->slot_free = (cudaEvent_t *)calloc(c->n_slots, sizeof(cudaEvent_t));
  c->copy_events = (cudaEvent_t *)calloc(c->n_slots, sizeof(cudaEvent_t));
  for (uint32_t i = 0; i < c->n_slots; i++) {
    TRYC(cudaEventCreateWithFlags(&c->slot_free[i], cudaEventDisableTiming));
    TRYC(cudaEventCreateWithFlags(&c->copy_events[i], cudaEventDisableTiming | cudaEventBlockingSync));
  }
  TRYC(cudaMalloc(&c->d_host_map, sizeof(tk_page_map) * c->max_pages));
  const uint32_t L = c->kv.layers;
  c->reqs = (Req *)calloc(c->max_requests, sizeof(Req));
  for (uint32_t i = 0; i < c->max_requests; i++) {
    Req &q = c->reqs[i];
    const uint64_t ne = (uint64_t)L * c->max_entries;
    TRYC(cudaHostAlloc(&q.up_entries, sizeof(tk_io_entry) * ne, cudaHostAllocDefault));
    TRYC(cudaHostAlloc(&q.up_pages, sizeof(tk_page_map) * c->max_pages, cudaHostAllocDefault));
    TRYC(cudaMalloc(&q.d_entries, sizeof(tk_io_entry) * ne));
    TRYC(cudaMalloc(&q.d_pages, sizeof(tk_page_map) * c->max_pages));
    TRYC(cudaMalloc(&q.d_done, sizeof(uint32_t) * (L + 1)));
    TRYC(cudaHostAlloc(&q.h_results, sizeof(tk_entry_result) * ne, cudaHostAllocMapped));
    TRYC(cudaHostGetDevicePointer((void **)&q.d_results, q.h_results, 0));
    TRYC(cudaEventCreateWithFlags(&q.start, cudaEventBlockingSync));
    q.io_done = (cudaEvent_t *)calloc(L, sizeof(cudaEvent_t));
    q.ready = (cudaEvent_t *)calloc(L, sizeof(cudaEvent_t));
    for (uint32_t l = 0; l < L; l++) {
      TRYC(cudaEventCreateWithFlags(&q.io_done[l], cudaEventDisableTiming));
      TRYC(cudaEventCreateWithFlags(&q.ready[l], cudaEventBlockingSync));
    }
  }
  c->zero_copy = p->zero_copy_scatter != 0;
  if (p->ring && !c->zero_copy) {
    TRYC(cudaStreamCreateWithPriority(&c->h2d, cudaStreamNonBlocking, prio_high));
    for (int i = 0; i < 2; i++) {
      TRYC(cudaMalloc(&c->d_stage[i], c->slot_bytes));
      TRYC(cudaEventCreateWithFlags(&c->dstage_ready[i], cudaEventDisableTiming));
      TRYC(cudaEventCreateWithFlags(&c->dstage_free[i], cudaEventDisableTiming));
    }
  }
  if (p->ring) TRY(bind_ring(c, p->ring));
  *out = (uint64_t)c;
  return TK_OK;
#undef TRY
#undef TRYC
}

static void free_ctx(Ctx *c) {
  if (!c) return;
  if (c->io) cudaStreamSynchronize(c->io);
  if (c->scatter) cudaStreamSynchronize(c->scatter);
  if (c->copy) cudaStreamSynchronize(c->copy);
  if (c->h2d) cudaStreamSynchronize(c->h2d);
  for (int i = 0; i < 2; i++) {
    if (c->d_stage[i]) cudaFree(c->d_stage[i]);
    if (c->dstage_ready[i]) cudaEventDestroy(c->dstage_ready[i]);
    if (c->dstage_free[i]) cudaEventDestroy(c->dstage_free[i]);
  }
  if (c->h2d) cudaStreamDestroy(c->h2d);
  if (c->reqs) {
    for (uint32_t i = 0; i < c->max_requests; i++) {
      Req &q = c->reqs[i];
      if (q.up_entries) cudaFreeHost(q.up_entries);
      if (q.up_pages) cudaFreeHost(q.up_pages);
      if (q.d_entries) cudaFree(q.d_entries);
      if (q.d_pages) cudaFree(q.d_pages);
      if (q.d_done) cudaFree(q.d_done);
      if (q.h_results) cudaFreeHost(q.h_results);
      if (q.start) cudaEventDestroy(q.start);
      for (uint32_t l = 0; l < c->kv.layers; l++) {
        if (q.io_done && q.io_done[l]) cudaEventDestroy(q.io_done[l]);
        if (q.ready && q.ready[l]) cudaEventDestroy(q.ready[l]);
      }
      free(q.io_done);
      free(q.ready);
    }
    free(c->reqs);
  }
  for (uint32_t i = 0; c->slot_free && i < c->n_slots; i++) {
    if (c->slot_free[i]) cudaEventDestroy(c->slot_free[i]);
    if (c->copy_events[i]) cudaEventDestroy(c->copy_events[i]);
  }
  free(c->slot_free);
  free(c->copy_events);
  if (c->d_host_map) cudaFree(c->d_host_map);
  if (c->d_kvp) cudaFree(c->d_kvp);
  if (c->d_state) cudaFree(c->d_state);
  if (c->io) cudaStreamDestroy(c->io);
  if (c->scatter) cudaStreamDestroy(c->scatter);
  if (c->copy) cudaStreamDestroy(c->copy);
  for (uint32_t i = 0; i < c->n_ring_regions; i++) region_remove(c->ring_regions[i]);
  if (c->staging_ours) region_remove(c->staging_host);
  cudaGetLastError();
  free(c);
}

extern "C" tk_status tk_unbind(uint64_t h) {
  Ctx *c = as_ctx(h);
  if (!c) return fail(TK_ERR_INVALID, "tk_unbind: null context");
  CK(cudaSetDevice(c->device));
  free_ctx(c);
  return TK_OK;
}

// check_map validates a page map against the context: no copy can leave the
// KV tensors or an object of obj_bytes (the staging slot). *extent (if not
// NULL) is the end of the farthest page in the object: what a layer copies.
static tk_status check_map(const Ctx *c, const tk_page_map *m, uint32_t n, uint32_t epl, uint64_t obj_bytes,
                           uint64_t *extent) {
  const uint64_t page_bytes = c->geo.plane_bytes * c->geo.planes;
  uint64_t end = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (m[i].dst_page >= c->geo.num_pages)
      return fail(TK_ERR_INVALID, "page %u: destination page %u >= %u", i, m[i].dst_page, c->geo.num_pages);
    if ((uint64_t)m[i].slot_off + page_bytes > obj_bytes || m[i].slot_off % 16)
      return fail(TK_ERR_INVALID, "page %u: source offset %u (+%llu) outside %llu bytes or unaligned", i,
                  m[i].slot_off, (unsigned long long)page_bytes, (unsigned long long)obj_bytes);
    if (epl && (m[i].first_entry > m[i].last_entry || m[i].last_entry >= epl))
      return fail(TK_ERR_INVALID, "page %u: entries [%u,%u] of %u", i, m[i].first_entry, m[i].last_entry, epl);
    if (m[i].slot_off + page_bytes > end) end = m[i].slot_off + page_bytes;
  }
  if (extent) *extent = end;
  return TK_OK;
}

// enqueue_layers puts layers [q.enqueued, upto) of request slot on the
// streams, in order (each layer's staging slot is taken in sequence order).
static tk_status enqueue_layers(Ctx *c, Req &q, uint32_t slot, uint32_t upto) {
  DReq dq;
  dq.entries = q.d_entries;
  dq.results = q.d_results;
  dq.done = q.d_done;
  dq.cursor = q.d_done + c->kv.layers;
  dq.n_layers = q.n_layers;
  dq.epl = q.epl;
  dq.slot_id = slot;
  dq.seq0 = q.seq0;
  dq.staging_host = c->staging_host;
  dq.slot_bytes = c->slot_bytes;
  dq.n_slots = c->n_slots;
  const uint32_t la = c->lookahead;
  for (uint32_t l = q.enqueued; l < upto; l++) {
    // The staging slot of the farthest layer this kernel may fill must have
    // been scattered by its previous user (slot_free is recorded in order).
    const uint32_t far = l + la < q.n_layers - 1 ? l + la : q.n_layers - 1;
    const uint32_t far_seq = q.seq0 + far;
    if (far_seq >= c->n_slots) CK(cudaStreamWaitEvent(c->io, c->slot_free[far_seq % c->n_slots], 0));
    io_layer_kernel<<<1, kIOThreads, 0, c->io>>>(c->ring, c->d_state, dq, l, la, c->window, c->timeout_ns);
    CK(cudaGetLastError());
    CK(cudaEventRecord(q.io_done[l], c->io));
    const uint32_t hs = (q.seq0 + l) % c->n_slots;
    const uint32_t grid = q.n_pages < 1024 ? q.n_pages : 1024;
    const tk_entry_result *res = q.d_results + (uint64_t)l * q.epl;
    char *src;              // what the scatter reads
    cudaEvent_t src_free;   // recorded once it has
    if (c->zero_copy) {
      CK(cudaStreamWaitEvent(c->scatter, q.io_done[l], 0));
      src = (char *)(c->staging_dev + (uint64_t)hs * c->slot_bytes);
      src_free = c->slot_free[hs];
    } else {
      // Copy engine: host slot -> device slot d; the host slot is free once
      // copied, the device slot once scattered (the copy two layers on
      // waits for that).
      const uint32_t d = (q.seq0 + l) % 2;
      CK(cudaStreamWaitEvent(c->h2d, q.io_done[l], 0));
      CK(cudaStreamWaitEvent(c->h2d, c->dstage_free[d], 0));
      CK(cudaMemcpyAsync(c->d_stage[d], (const void *)(c->staging_host + (uint64_t)hs * c->slot_bytes), q.copy_bytes,
                         cudaMemcpyHostToDevice, c->h2d));
      CK(cudaEventRecord(c->slot_free[hs], c->h2d));
      CK(cudaEventRecord(c->dstage_ready[d], c->h2d));
      CK(cudaStreamWaitEvent(c->scatter, c->dstage_ready[d], 0));
      src = (char *)c->d_stage[d];
      src_free = c->dstage_free[d];
    }
    copy_layer_kernel<true><<<grid, kCopyThreads, 0, c->scatter>>>(src, q.d_pages, q.n_pages, res, c->d_kvp, c->geo,
                                                                  q.first_layer + l);
    CK(cudaGetLastError());
    CK(cudaEventRecord(q.ready[l], c->scatter));
    CK(cudaEventRecord(src_free, c->scatter));
    q.enqueued = l + 1;
  }
  return TK_OK;
}

extern "C" tk_status tk_restore_submit(uint64_t h, const tk_restore_params *p, uint32_t *req_out) {
  Ctx *c = as_ctx(h);
  if (!c || !p || !req_out) return fail(TK_ERR_INVALID, "tk_restore_submit: null argument");
  if (!c->has_ring) return fail(TK_ERR_NOT_SUPPORTED, "no ring bound");
  if (!p->n_layers || p->first_layer + (uint64_t)p->n_layers > c->kv.layers)
    return fail(TK_ERR_INVALID, "layers [%u,+%u) of %u", p->first_layer, p->n_layers, c->kv.layers);
  if (!p->n_pages || p->n_pages > c->max_pages) return fail(TK_ERR_INVALID, "%u pages (max %u)", p->n_pages, c->max_pages);
  if (!p->entries_per_layer || p->entries_per_layer > c->max_entries)
    return fail(TK_ERR_INVALID, "%u entries per layer (max %u)", p->entries_per_layer, c->max_entries);
  uint64_t copy_bytes;
  tk_status s = check_map(c, p->pages, p->n_pages, p->entries_per_layer, c->slot_bytes, &copy_bytes);
  if (s) return s;
  const uint32_t ne = p->n_layers * p->entries_per_layer;
  for (uint32_t e = 0; e < ne; e++) {
    const tk_io_entry &en = p->entries[e];
    if (!en.len || en.min_len > en.len || !en.min_len || (uint64_t)en.slot_off + en.len > c->slot_bytes || en.fd < 0)
      return fail(TK_ERR_INVALID, "entry %u: fd %d, %u bytes at slot offset %u (slot %llu bytes)", e, en.fd, en.len,
                  en.slot_off, (unsigned long long)c->slot_bytes);
    if (en.flags & ~(TK_IO_FIXED_FILE | TK_IO_WRITE | TK_IO_FIXED_BUF)) return fail(TK_ERR_INVALID, "entry %u: flags %#x", e, en.flags);
  }
  // One request at a time may still have layers to enqueue: staging slots go out in enqueue order.
  int slot = -1;
  for (uint32_t i = 0; i < c->max_requests; i++) {
    const Req &r = c->reqs[i];
    if (r.busy && r.enqueued < r.n_layers)
      return fail(TK_ERR_BUSY, "request %u has %u of %u layers enqueued", i, r.enqueued, r.n_layers);
    if (!r.busy && slot < 0) slot = (int)i;
  }
  if (slot < 0) return fail(TK_ERR_BUSY, "all %u request slots in use", c->max_requests);
  CK(cudaSetDevice(c->device));
  Req &q = c->reqs[slot];
  q.n_layers = p->n_layers;
  q.first_layer = p->first_layer;
  q.epl = p->entries_per_layer;
  q.n_pages = p->n_pages;
  q.seq0 = c->seq;
  memcpy(q.up_entries, p->entries, sizeof(tk_io_entry) * ne);
  memcpy(q.up_pages, p->pages, sizeof(tk_page_map) * p->n_pages);
  memset(q.h_results, 0, sizeof(tk_entry_result) * ne);
  q.copy_bytes = copy_bytes;
  CK(cudaEventRecord(q.start, c->io));
  CK(cudaMemcpyAsync(q.d_entries, q.up_entries, sizeof(tk_io_entry) * ne, cudaMemcpyHostToDevice, c->io));
  CK(cudaMemcpyAsync(q.d_pages, q.up_pages, sizeof(tk_page_map) * p->n_pages, cudaMemcpyHostToDevice, c->io));
  CK(cudaMemsetAsync(q.d_done, 0, sizeof(uint32_t) * (c->kv.layers + 1), c->io));
  q.enqueued = 0;
  tk_status es = enqueue_layers(c, q, (uint32_t)slot, p->enqueue_layers && p->enqueue_layers < q.n_layers ? p->enqueue_layers : q.n_layers);
  c->seq += q.n_layers;  // the slots of layers never enqueued are skipped, not reused out of order
  if (es) {
    // No request: wait for what was enqueued, then free the slot.
    if (q.enqueued) cudaEventSynchronize(q.ready[q.enqueued - 1]);
    cudaGetLastError();
    return es;
  }
  q.busy = true;
  *req_out = (uint32_t)slot;
  return TK_OK;
}

static tk_status get_req(Ctx *c, uint32_t req, Req **out) {
  if (!c || req >= c->max_requests || !c->reqs[req].busy) return fail(TK_ERR_INVALID, "request %u is not live", req);
  *out = &c->reqs[req];
  // The calling thread's current device may be another GPU's (Go moves
  // goroutines between threads; one process binds one context per GPU).
  CK(cudaSetDevice(c->device));
  return TK_OK;
}

extern "C" tk_status tk_restore_enqueue(uint64_t h, uint32_t req, uint32_t upto) {
  Ctx *c = as_ctx(h);
  Req *q;
  tk_status s = get_req(c, req, &q);
  if (s) return s;
  if (upto > q->n_layers) return fail(TK_ERR_INVALID, "enqueue up to layer %u of %u", upto, q->n_layers);
  return enqueue_layers(c, *q, req, upto);
}

static tk_status layer_status(const Req &q, uint32_t l) {
  for (uint32_t e = 0; e < q.epl; e++) {
    const tk_entry_result r = q.h_results[(uint64_t)l * q.epl + e];
    if (r.status != TK_ENTRY_OK)
      return fail(TK_ERR_IO, "layer %u entry %u: status %u res %d", q.first_layer + l, e, r.status, r.res);
  }
  return TK_OK;
}

// enqueued_layer finds live request req and checks that absolute layer is one
// of its layers already on the streams; *rel is its index in the request.
static tk_status enqueued_layer(Ctx *c, uint32_t req, uint32_t layer, Req **q, uint32_t *rel) {
  tk_status s = get_req(c, req, q);
  if (s) return s;
  const Req &r = **q;
  if (layer < r.first_layer || layer >= r.first_layer + r.n_layers) return fail(TK_ERR_INVALID, "layer %u not in request", layer);
  if (layer - r.first_layer >= r.enqueued)
    return fail(TK_ERR_INVALID, "layer %u not enqueued yet (%u of %u)", layer, r.enqueued, r.n_layers);
  *rel = layer - r.first_layer;
  return TK_OK;
}

extern "C" tk_status tk_restore_stream_wait(uint64_t h, uint32_t req, uint32_t layer, uint64_t stream) {
  Req *q;
  uint32_t l;
  tk_status s = enqueued_layer(as_ctx(h), req, layer, &q, &l);
  if (s) return s;
  CK(cudaStreamWaitEvent((cudaStream_t)stream, q->ready[l], 0));
  return TK_OK;
}

extern "C" tk_status tk_restore_wait_layer(uint64_t h, uint32_t req, uint32_t layer) {
  Req *q;
  uint32_t l;
  tk_status s = enqueued_layer(as_ctx(h), req, layer, &q, &l);
  if (s) return s;
  CK(cudaEventSynchronize(q->ready[l]));
  return layer_status(*q, l);
}

extern "C" tk_status tk_restore_wait(uint64_t h, uint32_t req, tk_entry_result *results, uint32_t n_results,
                                     float *layer_ms, uint32_t n_layer_ms) {
  Ctx *c = as_ctx(h);
  Req *q;
  tk_status s = get_req(c, req, &q);
  if (s) return s;
  if (q->enqueued < q->n_layers) return fail(TK_ERR_INVALID, "request %u: %u of %u layers enqueued", req, q->enqueued, q->n_layers);
  CK(cudaEventSynchronize(q->ready[q->n_layers - 1]));
  const uint32_t ne = q->n_layers * q->epl;
  if (results) memcpy(results, q->h_results, sizeof(tk_entry_result) * (n_results < ne ? n_results : ne));
  for (uint32_t l = 0; layer_ms && l < n_layer_ms && l < q->n_layers; l++)
    CK(cudaEventElapsedTime(&layer_ms[l], q->start, q->ready[l]));
  DState st;
  CK(cudaMemcpy(&st, c->d_state, sizeof st, cudaMemcpyDeviceToHost));
  for (uint32_t l = 0; l < q->n_layers; l++) {
    if ((s = layer_status(*q, l))) {
      char first[256];
      snprintf(first, sizeof first, "%s", g_err);
      // Both views of the ring: what the kernel published and what the GPU holds.
      return fail(st.broken ? TK_ERR_RING : TK_ERR_IO,
                  "%s; ring: sq head %u tail %u flags %#x, cq head %u tail %u; gpu: sq tail %u cq head %u inflight %u stray %u",
                  first, *c->h_sq_head, *c->h_sq_tail, *c->h_sq_flags, *c->h_cq_head, *c->h_cq_tail, st.sq_tail, st.cq_head,
                  st.inflight, st.stray);
    }
  }
  return TK_OK;
}

extern "C" tk_status tk_restore_release(uint64_t h, uint32_t req) {
  Ctx *c = as_ctx(h);
  Req *q;
  tk_status s = get_req(c, req, &q);
  if (s) return s;
  // An abandoned request (its enqueue failed) waits for what it enqueued.
  if (q->enqueued) CK(cudaEventSynchronize(q->ready[q->enqueued - 1]));
  q->busy = false;
  return TK_OK;
}

// ---------------------------------------------------------------- host-side copies

extern "C" tk_status tk_host_map(uint64_t h, const tk_page_map *pages, uint32_t n) {
  Ctx *c = as_ctx(h);
  if (!c || !pages || !n || n > c->max_pages) return fail(TK_ERR_INVALID, "tk_host_map: %u pages (max %u)", n, c ? c->max_pages : 0);
  tk_status s = check_map(c, pages, n, 0, ~0ull >> 1, NULL);
  if (s) return s;
  CK(cudaSetDevice(c->device));
  CK(cudaStreamSynchronize(c->copy));
  CK(cudaMemcpy(c->d_host_map, pages, sizeof(tk_page_map) * n, cudaMemcpyHostToDevice));
  c->host_map_pages = n;
  c->host_map_end = 0;
  const uint64_t page_bytes = c->geo.plane_bytes * c->geo.planes;
  for (uint32_t i = 0; i < n; i++)
    if (pages[i].slot_off + page_bytes > c->host_map_end) c->host_map_end = pages[i].slot_off + page_bytes;
  return TK_OK;
}

static tk_status host_copy(Ctx *c, uint32_t layer, uint64_t obj_dev, uint64_t obj_bytes, bool to_kv) {
  if (!c->host_map_pages) return fail(TK_ERR_INVALID, "no page map set (tk_host_map)");
  if (layer >= c->kv.layers) return fail(TK_ERR_INVALID, "layer %u of %u", layer, c->kv.layers);
  // The map was checked against the KV tensors; this checks it against the buffer.
  if (obj_bytes < c->host_map_end)
    return fail(TK_ERR_INVALID, "buffer of %llu bytes, page map reaches %llu", (unsigned long long)obj_bytes,
                (unsigned long long)c->host_map_end);
  const uint32_t n = c->host_map_pages;
  const uint32_t grid = n < 1024 ? n : 1024;
  CK(cudaSetDevice(c->device));
  if (to_kv)
    copy_layer_kernel<true><<<grid, kCopyThreads, 0, c->copy>>>((char *)obj_dev, c->d_host_map, n, nullptr, c->d_kvp, c->geo, layer);
  else
    copy_layer_kernel<false><<<grid, kCopyThreads, 0, c->copy>>>((char *)obj_dev, c->d_host_map, n, nullptr, c->d_kvp, c->geo, layer);
  CK(cudaGetLastError());
  return TK_OK;
}

// registered_copy runs host_copy on registered host memory buf (the source
// when to_kv, else the destination), through its device mapping.
static tk_status registered_copy(uint64_t h, uint32_t layer, uint64_t buf, uint64_t bytes, bool to_kv) {
  Ctx *c = as_ctx(h);
  if (!c) return fail(TK_ERR_INVALID, "null context");
  uint64_t d;
  if (!lookup(buf, bytes, &d))
    return fail(TK_ERR_INVALID, "%s %#llx+%llu is not registered host memory", to_kv ? "source" : "destination",
                (unsigned long long)buf, (unsigned long long)bytes);
  return host_copy(c, layer, d, bytes, to_kv);
}

extern "C" tk_status tk_scatter_host(uint64_t h, uint32_t layer, uint64_t src, uint64_t bytes) {
  return registered_copy(h, layer, src, bytes, true);
}

extern "C" tk_status tk_gather_host(uint64_t h, uint32_t layer, uint64_t dst, uint64_t bytes) {
  return registered_copy(h, layer, dst, bytes, false);
}

extern "C" tk_status tk_scatter_dev(uint64_t h, uint32_t layer, uint64_t dsrc, uint64_t bytes) {
  Ctx *c = as_ctx(h);
  if (!c) return fail(TK_ERR_INVALID, "null context");
  cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, (void *)dsrc);
  if (e != cudaSuccess || a.type != cudaMemoryTypeDevice) {
    cudaGetLastError();
    return fail(TK_ERR_INVALID, "source %#llx is not device memory", (unsigned long long)dsrc);
  }
  return host_copy(c, layer, dsrc, bytes, true);
}

extern "C" tk_status tk_copy_event(uint64_t h, uint32_t i) {
  Ctx *c = as_ctx(h);
  if (!c || i >= c->n_slots) return fail(TK_ERR_INVALID, "copy event %u", i);
  CK(cudaSetDevice(c->device));
  CK(cudaEventRecord(c->copy_events[i], c->copy));
  return TK_OK;
}
extern "C" tk_status tk_copy_event_wait(uint64_t h, uint32_t i) {
  Ctx *c = as_ctx(h);
  if (!c || i >= c->n_slots) return fail(TK_ERR_INVALID, "copy event %u", i);
  CK(cudaSetDevice(c->device));
  CK(cudaEventSynchronize(c->copy_events[i]));
  return TK_OK;
}
extern "C" tk_status tk_sync(uint64_t h) {
  Ctx *c = as_ctx(h);
  if (!c) return fail(TK_ERR_INVALID, "null context");
  CK(cudaSetDevice(c->device));
  CK(cudaStreamSynchronize(c->copy));
  return TK_OK;
}
