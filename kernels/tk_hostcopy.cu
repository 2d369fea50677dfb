// tk_hostcopy.cu — copies the host drives on a context's copy stream: one
// layer between a registered host (or device) buffer in object layout and
// the paged KV, through the page map tk_host_map set (the save's gather, the
// CPU path's scatter), and the events that order them.
#include "tk_ctx.cuh"

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
  CK(cudaSetDevice(c->device));
  launch_copy_layer(c->copy, to_kv, (char *)obj_dev, c->d_host_map, n, nullptr, c->d_kvp, c->geo, layer);
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
