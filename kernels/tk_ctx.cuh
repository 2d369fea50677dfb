// tk_ctx.cuh — what the product library's .cu files share about a context
// (one per tk_bind): the device views of the ring and of a request, the host
// Ctx and Req, and the hidden functions one file calls in another:
//   tk_bind.cu         tk_bind/tk_unbind: checks, allocation, the ring's mapping; check_map
//   tk_ring_kernel.cu  the GPU side of the ring: io_layer_kernel submits and reaps a layer's reads
//   tk_copy_kernel.cu  copy_layer_kernel: one layer between object layout and the paged KV
//   tk_crc_kernel.cu   crc_planes_kernel: the CRC32C of each page plane a save gathers
//   tk_restore.cu      tk_restore_*: a request's layers onto the streams, waits, results
//   tk_hostcopy.cu     host-driven scatter/gather (save, CPU-path restores), copy events,
//                      the save's gather lanes (tk_gather_lane)
//   tk_mem.cu          errors, registered host memory, device memory calls
#ifndef TK_CTX_CUH
#define TK_CTX_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "tk_crc.h"
#include "tk_geo.cuh"
#include "tk_internal.cuh"
#include "tutti_kernels.h"

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

// A gather lane (tk_gather_lane): what one call uses alone, so calls on
// different lanes share nothing mutable.
struct Lane {
  cudaStream_t stream;  // non-blocking, the device's highest priority
  tk_page_map *h_map;   // pinned upload buffer, max_pages entries
  tk_page_map *d_map;   // the kernel's copy, max_pages entries
  uint32_t *d_crc;      // crc_planes_kernel's output, max_pages*planes entries
  uint32_t *h_crc;      // pinned download buffer of d_crc
  char *d_stage;        // device staging of stage_bytes (NULL: zero-copy gathers)
  uint64_t stage_bytes;
  uint32_t busy;  // 1 while a call holds the lane (__atomic builtins)
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
  Lane *lanes;  // [n_lanes], immutable after tk_bind but for Lane.busy
  uint32_t n_lanes;
  tk_crc_plan *d_crc_plan;  // the plane size's CRC plan (tk_crc.h), device memory
};

static inline Ctx *as_ctx(uint64_t h) { return (Ctx *)h; }

// check_map validates a page map against the context: no copy can leave the
// KV tensors or an object of obj_bytes (the staging slot). *extent (if not
// NULL) is the end of the farthest page in the object: what a layer copies.
TK_HIDDEN tk_status check_map(const Ctx *c, const tk_page_map *m, uint32_t n, uint32_t epl, uint64_t obj_bytes,
                              uint64_t *extent);

// launch_io_layer puts one io_layer_kernel (tk_ring_kernel.cu) on stream s.
TK_HIDDEN void launch_io_layer(cudaStream_t s, const DRing &r, DState *st, const DReq &q, uint32_t layer,
                               uint32_t lookahead, uint32_t window, uint64_t timeout_ns);

// launch_copy_layer puts one copy_layer_kernel (tk_copy_kernel.cu) on stream
// s: obj to the KV when to_kv, else the KV to obj; one block per page, at
// most 1024.
TK_HIDDEN void launch_copy_layer(cudaStream_t s, bool to_kv, char *obj, const tk_page_map *map, uint32_t n_pages,
                                 const tk_entry_result *results, const uint64_t *kvp, const Geo &g, uint32_t layer);

// launch_crc_planes puts one crc_planes_kernel (tk_crc_kernel.cu) on stream
// s: out[i*planes + p] = CRC32C of plane p of page map[i].dst_page of layer.
TK_HIDDEN void launch_crc_planes(cudaStream_t s, const tk_page_map *map, uint32_t n_pages, const uint64_t *kvp,
                                 const Geo &g, uint32_t layer, const tk_crc_plan *plan, uint32_t *out);

// load_io_layer, load_copy_layer and load_crc_planes load their kernels into the current
// device's context now. Under lazy module loading (CUDA's default) a
// kernel's first launch loads it, and loading may synchronize the whole
// context: a restore's first launch would wait for every kernel an engine
// has queued, and an engine kernel's first launch for the running ring
// kernel. tk_bind calls both, so only the engine's own first launches remain
// (docs/integration.md, the GPU path, says how an engine avoids those).
TK_HIDDEN cudaError_t load_io_layer(void);
TK_HIDDEN cudaError_t load_copy_layer(void);
TK_HIDDEN cudaError_t load_crc_planes(void);

#endif  // TK_CTX_CUH
