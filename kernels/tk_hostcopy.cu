// tk_hostcopy.cu — copies the host drives on a context's copy stream: one
// layer between a registered host (or device) buffer in object layout and
// the paged KV, through the page map tk_host_map set (the save's gather, the
// CPU path's scatter), and the events that order them; and the save's gather
// lanes (tk_gather_lane), which use none of that.
#include "tk_ctx.cuh"

#include <string.h>

extern "C" tk_status tk_host_map(uint64_t h, const tk_page_map *pages, uint32_t n) {
  Ctx *c = as_ctx(h);
  if (!c || !pages || !n || n > c->max_pages) return fail(TK_ERR_INVALID, "tk_host_map: %u pages (max %u)", n, c ? c->max_pages : 0);
  tk_status s = check_map(c, pages, n, 0, ~0ull >> 1, NULL);
  if (s) return s;
  CK(cudaSetDevice(c->device));
  // On the copy stream, after the copies that read the previous map (a
  // cudaMemcpy would go on the legacy stream and wait for an engine's work there).
  CK(cudaMemcpyAsync(c->d_host_map, pages, sizeof(tk_page_map) * n, cudaMemcpyHostToDevice, c->copy));
  CK(cudaStreamSynchronize(c->copy));
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

// ---------------------------------------------------------------- gather lanes

// staged_layer copies one layer of the n pages of the lane's uploaded map
// (slot offsets relative to their part: lane_gather) into the lane's device
// staging a part at a time, and the copy engine moves each part to dst (host
// memory, registered): page i to dst + pages[i].slot_off, pages adjacent
// there in one copy. No SM waits on PCIe (a zero-copy gather's kernel does,
// beside the engine's GEMMs). Stream order lets a part's kernel overwrite
// the staging only after the previous part's copy read it.
static cudaError_t staged_layer(Ctx *c, Lane &ln, const tk_page_map *pages, uint32_t n, uint32_t layer, char *dst) {
  const uint64_t pb = c->geo.plane_bytes * c->geo.planes;
  const uint32_t part = (uint32_t)(ln.stage_bytes / pb);
  for (uint32_t k = 0; k < n; k += part) {
    const uint32_t m = n - k < part ? n - k : part;
    launch_copy_layer(ln.stream, false, ln.d_stage, ln.d_map + k, m, nullptr, c->d_kvp, c->geo, layer);
    cudaError_t e = cudaGetLastError();
    for (uint32_t j = 0; e == cudaSuccess && j < m;) {
      const uint64_t off = pages[k + j].slot_off;
      uint32_t r = 1;
      while (j + r < m && pages[k + j + r].slot_off == off + r * pb) r++;
      e = cudaMemcpyAsync(dst + off, ln.d_stage + (uint64_t)j * pb, r * pb, cudaMemcpyDeviceToHost, ln.stream);
      j += r;
    }
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// lane_gather is tk_gather_lane's work once its arguments are checked and
// the lane is held: dst is the host destination, dst_dev its device mapping
// (a zero-copy gather's kernel writes there). Whatever fails, the lane's
// stream is drained before it returns: the next call on the lane overwrites
// ln.h_map, which an unfinished upload would still read.
static tk_status lane_gather(Ctx *c, Lane &ln, const tk_page_map *pages, uint32_t n, uint32_t first_layer,
                             uint32_t layers, uint64_t dst, uint64_t dst_dev, uint64_t layer_stride,
                             uint32_t *plane_crcs, uint64_t after_event) {
  CK(cudaSetDevice(c->device));
  memcpy(ln.h_map, pages, sizeof(tk_page_map) * n);
  if (ln.d_stage) {  // the kernel writes each part from the staging's start
    const uint64_t pb = c->geo.plane_bytes * c->geo.planes;
    const uint32_t part = (uint32_t)(ln.stage_bytes / pb);
    for (uint32_t i = 0; i < n; i++) ln.h_map[i].slot_off = (uint32_t)((i % part) * pb);
  }
  cudaError_t e = cudaSuccess;
  if (after_event) e = cudaStreamWaitEvent(ln.stream, (cudaEvent_t)after_event, 0);  // the engine wrote the pages
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(ln.d_map, ln.h_map, sizeof(tk_page_map) * n, cudaMemcpyHostToDevice, ln.stream);
  for (uint32_t l = 0; e == cudaSuccess && l < layers; l++) {
    if (ln.d_stage) {
      e = staged_layer(c, ln, pages, n, first_layer + l, (char *)(dst + l * layer_stride));
    } else {
      launch_copy_layer(ln.stream, false, (char *)(dst_dev + l * layer_stride), ln.d_map, n, nullptr, c->d_kvp, c->geo,
                        first_layer + l);
      e = cudaGetLastError();  // the runtime's error state is per thread: this launch's
    }
    if (e != cudaSuccess || !plane_crcs) continue;
    // The layer's checksums, from the same pages in HBM (the map's
    // dst_page); one layer's fit the lane's buffers, so each is downloaded
    // before the next.
    const uint64_t nc = (uint64_t)n * c->geo.planes;
    launch_crc_planes(ln.stream, ln.d_map, n, c->d_kvp, c->geo, first_layer + l, c->d_crc_plan, ln.d_crc);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpyAsync(ln.h_crc, ln.d_crc, sizeof(uint32_t) * nc, cudaMemcpyDeviceToHost, ln.stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ln.stream);
    if (e == cudaSuccess) memcpy(plane_crcs + l * nc, ln.h_crc, sizeof(uint32_t) * nc);
  }
  const cudaError_t se = cudaStreamSynchronize(ln.stream);
  if (e == cudaSuccess) e = se;
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(TK_ERR_CUDA, "tk_gather_lane: %s (%d), layers [%u,+%u) of %u pages", cudaGetErrorString(e), (int)e,
                first_layer, layers, n);
  }
  return TK_OK;
}

// tk_gather_lane reads only what tk_bind set (geometry, KV pointers, the
// lane's buffers) and the lane it holds, so calls on different lanes need
// no lock; lookup's table has its own.
extern "C" tk_status tk_gather_lane(uint64_t h, uint32_t lane, const tk_page_map *pages, uint32_t n,
                                    uint32_t first_layer, uint32_t layers, uint64_t dst, uint64_t layer_stride,
                                    uint32_t *plane_crcs, uint64_t after_event) {
  Ctx *c = as_ctx(h);
  if (!c) return fail(TK_ERR_INVALID, "tk_gather_lane: null context");
  if (lane >= c->n_lanes) return fail(TK_ERR_INVALID, "tk_gather_lane: lane %u of %u", lane, c->n_lanes);
  if (!pages || !n || n > c->max_pages)
    return fail(TK_ERR_INVALID, "tk_gather_lane: %u pages (max %u)", n, c->max_pages);
  if (!layers || first_layer >= c->kv.layers || layers > c->kv.layers - first_layer)
    return fail(TK_ERR_INVALID, "tk_gather_lane: layers [%u,+%u) of %u", first_layer, layers, c->kv.layers);
  // 16-byte vectors go to dst + l*layer_stride + slot_off (check_map holds
  // slot_off to 16): a misaligned store into mapped host memory is a sticky
  // fault of the whole CUDA context, so it is refused here.
  if (!layer_stride || dst % 16 || layer_stride % 16 || layer_stride > (~0ull) / layers)
    return fail(TK_ERR_INVALID, "tk_gather_lane: destination %#llx, layer stride %llu: want both 16-byte aligned",
                (unsigned long long)dst, (unsigned long long)layer_stride);
  tk_status s = check_map(c, pages, n, 0, layer_stride, NULL);
  if (s) return s;
  uint64_t d;
  if (!lookup(dst, layers * layer_stride, &d))
    return fail(TK_ERR_INVALID, "tk_gather_lane: destination %#llx+%llu is not registered host memory",
                (unsigned long long)dst, (unsigned long long)(layers * layer_stride));
  Lane &ln = c->lanes[lane];
  if (__atomic_exchange_n(&ln.busy, 1u, __ATOMIC_ACQUIRE))
    return fail(TK_ERR_BUSY, "tk_gather_lane: lane %u is in another call", lane);
  s = lane_gather(c, ln, pages, n, first_layer, layers, dst, d, layer_stride, plane_crcs, after_event);
  __atomic_store_n(&ln.busy, 0u, __ATOMIC_RELEASE);
  return s;
}
