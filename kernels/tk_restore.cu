// tk_restore.cu — the GPU-driven restore (tk_restore_*): a request's layers
// go onto the streams in order (the ring kernel, the staging copy when not
// zero copy, the scatter), each layer's readiness is an event, and the wait
// reports every entry's result with both views of the ring on a failure.
#include "tk_ctx.cuh"

#include <stdio.h>
#include <string.h>

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
    launch_io_layer(c->io, c->ring, c->d_state, dq, l, la, c->window, c->timeout_ns);
    CK(cudaGetLastError());
    CK(cudaEventRecord(q.io_done[l], c->io));
    const uint32_t hs = (q.seq0 + l) % c->n_slots;
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
    launch_copy_layer(c->scatter, true, src, q.d_pages, q.n_pages, res, c->d_kvp, c->geo, q.first_layer + l);
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
  for (uint32_t l = 0; l < q->n_layers; l++) {
    if ((s = layer_status(*q, l))) {
      char first[256];
      snprintf(first, sizeof first, "%s", g_err);
      // Read on the ring's own stream, which has finished this request: a
      // cudaMemcpy would go on the legacy stream and wait for an engine's work
      // there (here only on a failure, which reads it for its message).
      DState st;
      CK(cudaMemcpyAsync(&st, c->d_state, sizeof st, cudaMemcpyDeviceToHost, c->io));
      CK(cudaStreamSynchronize(c->io));
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
