// tk_bind.cu — a context's life: tk_bind checks the KV tensors and the
// staging pool, allocates streams, events and request slots, and maps the
// ring into the GPU's view; tk_unbind frees it all. check_map is the page
// map check that restores and host copies share.
#include "tk_ctx.cuh"

#include <stdlib.h>
#include <string.h>

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
  if (p->gather_lanes > TK_MAX_GATHER_LANES)
    return fail(TK_ERR_INVALID, "%u gather lanes (max %d)", p->gather_lanes, TK_MAX_GATHER_LANES);
  if (p->ring && p->staging_slots < p->lookahead + 2)
    return fail(TK_ERR_INVALID, "staging slots %u < lookahead %u + 2", p->staging_slots, p->lookahead);
  CK(cudaSetDevice(p->device));
  CK(load_io_layer());  // before any restore runs: see load_io_layer
  CK(load_copy_layer());
  CK(load_crc_planes());
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
  // Gather lanes at the highest priority too: a save's gather must not wait
  // for the engine's GEMM grids either (they hold the stage workers).
  c->n_lanes = p->gather_lanes ? p->gather_lanes : TK_GATHER_LANES;
  c->lanes = (Lane *)calloc(c->n_lanes, sizeof(Lane));
  if (!c->lanes) TRY(fail(TK_ERR_INVALID, "out of host memory"));
  for (uint32_t i = 0; i < c->n_lanes; i++) {
    Lane &ln = c->lanes[i];
    TRYC(cudaStreamCreateWithPriority(&ln.stream, cudaStreamNonBlocking, prio_high));
    TRYC(cudaHostAlloc(&ln.h_map, sizeof(tk_page_map) * c->max_pages, cudaHostAllocDefault));
    TRYC(cudaMalloc(&ln.d_map, sizeof(tk_page_map) * c->max_pages));
    TRYC(cudaHostAlloc(&ln.h_crc, sizeof(uint32_t) * c->max_pages * c->kv.planes, cudaHostAllocDefault));
    TRYC(cudaMalloc(&ln.d_crc, sizeof(uint32_t) * c->max_pages * c->kv.planes));
    if (!p->zero_copy_gather) {
      const uint64_t pb = c->geo.plane_bytes * c->geo.planes;
      ln.stage_bytes = pb > TK_GATHER_STAGE_BYTES ? pb : TK_GATHER_STAGE_BYTES;
      TRYC(cudaMalloc(&ln.d_stage, ln.stage_bytes));
    }
  }
  {
    tk_crc_plan plan;
    if (tk_crc_plan_make(&plan, c->geo.plane_bytes))
      TRY(fail(TK_ERR_INVALID, "plane bytes %llu: no CRC plan", (unsigned long long)c->geo.plane_bytes));
    TRYC(cudaMalloc(&c->d_crc_plan, sizeof plan));
    TRYC(cudaMemcpy(c->d_crc_plan, &plan, sizeof plan, cudaMemcpyHostToDevice));
  }
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
  for (uint32_t i = 0; c->lanes && i < c->n_lanes; i++) {
    Lane &ln = c->lanes[i];
    if (ln.stream) {
      cudaStreamSynchronize(ln.stream);
      cudaStreamDestroy(ln.stream);
    }
    if (ln.h_map) cudaFreeHost(ln.h_map);
    if (ln.d_map) cudaFree(ln.d_map);
    if (ln.h_crc) cudaFreeHost(ln.h_crc);
    if (ln.d_crc) cudaFree(ln.d_crc);
    if (ln.d_stage) cudaFree(ln.d_stage);
  }
  free(c->lanes);
  if (c->d_crc_plan) cudaFree(c->d_crc_plan);
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
tk_status check_map(const Ctx *c, const tk_page_map *m, uint32_t n, uint32_t epl, uint64_t obj_bytes,
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
