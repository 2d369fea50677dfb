/*
 * tutti_kernels.h — the one ABI between libtutti_kernels.so (CUDA, built by
 * nvcc on the GPU machine) and its loaders (package kernels, through dlopen and
 * a table of function pointers; the C self-test). Plain C, no CUDA types, so a
 * loader needs no CUDA headers to build. The library holds the product's
 * restore and save path only; test fill/verify, the cuFile baseline and the
 * harness's prefill GEMMs are libtutti_testkit.so (tk_testkit.h).
 *
 * Versioning: tk_abi_version() returns TK_ABI_VERSION of the library; a loader
 * refuses a library whose version differs from the header it was built with.
 * Any change to a struct or a signature below bumps TK_ABI_VERSION.
 *
 * Addresses cross the ABI as uint64_t (host virtual addresses or CUDA device
 * pointers, as each field says). Every function returns tk_status: TK_OK, or a
 * negative code; tk_last_error copies the calling thread's last message.
 *
 * Memory ownership: the library never frees what it did not allocate. The
 * caller keeps host memory passed to tk_bind (staging pool, ring memory) alive
 * and mapped until tk_unbind returned. Everything a hot-path call needs
 * (device descriptor tables, events, result arrays) is allocated in tk_bind.
 */
#ifndef TUTTI_KERNELS_H
#define TUTTI_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TK_ABI_VERSION 6

/* Gather lanes (tk_gather_lane) a context has when tk_bind_params.gather_lanes
 * is 0, and the most it may ask for. */
#define TK_GATHER_LANES 8
#define TK_MAX_GATHER_LANES 64
/* Each gather lane's device staging (tk_bind_params.zero_copy_gather 0), or
 * one page of one layer where that is larger. */
#define TK_GATHER_STAGE_BYTES (4u << 20)

typedef int32_t tk_status;
enum {
	TK_OK = 0,
	TK_ERR_NO_GPU = -1,        /* no CUDA device or driver */
	TK_ERR_CUDA = -2,          /* a CUDA call failed; tk_last_error names it */
	TK_ERR_INVALID = -3,       /* an argument or descriptor was rejected before launch */
	TK_ERR_BUSY = -4,          /* every request slot is in use */
	TK_ERR_RING = -5,          /* the ring is unusable: an earlier poll timed out with I/O in flight */
	TK_ERR_NOT_SUPPORTED = -6, /* e.g. no ring bound, stream memory ops missing, cuFile absent */
	TK_ERR_PENDING = -7,       /* tk_restore_query: not finished yet */
	TK_ERR_IO = -8             /* a restore finished with at least one failed entry */
};

/* Per-entry status, written by the GPU ring driver. */
enum {
	TK_ENTRY_PENDING = 0,
	TK_ENTRY_OK = 1,
	TK_ENTRY_IOERR = 2,   /* res = -errno */
	TK_ENTRY_SHORT = 3,   /* res = bytes transferred, < len (e.g. read past end of file) */
	TK_ENTRY_TIMEOUT = 4, /* no completion within the poll bound; the ring is then broken */
	TK_ENTRY_SKIPPED = 5  /* not submitted: the ring was already broken */
};

typedef struct tk_entry_result {
	uint32_t status; /* TK_ENTRY_* */
	int32_t res;     /* CQE res: bytes, or -errno */
} tk_entry_result;

/*
 * tk_ring: an io_uring set up by the caller with IORING_SETUP_SQPOLL (package
 * uring), described by host addresses. The GPU is its only producer: nobody
 * else may submit to this ring while it is bound. bind cudaHostRegisters the
 * regions (mapped) and derives device addresses for every field; regions that
 * are already registered are used as they are.
 */
#define TK_MAX_RING_REGIONS 4
typedef struct tk_ring {
	uint64_t sq_head, sq_tail, sq_mask, sq_flags; /* host addresses of uint32 */
	uint64_t sq_array;                            /* host address of uint32[sq_entries]; 0 with NO_SQARRAY */
	uint64_t sqes;                                /* host address of the SQE array */
	uint64_t cq_head, cq_tail, cq_mask;           /* host addresses of uint32 */
	uint64_t cqes;                                /* host address of the CQE array */
	uint32_t sq_entries, cq_entries;
	uint32_t sqe_bytes, cqe_bytes; /* 64 and 16 (SQE128/CQE32 are refused) */
	int32_t ring_fd;
	uint32_t n_regions;
	uint64_t region_addr[TK_MAX_RING_REGIONS];
	uint64_t region_bytes[TK_MAX_RING_REGIONS];
} tk_ring;

enum { TK_LAYOUT_PER_LAYER = 0, TK_LAYOUT_CROSS_LAYER = 1 };

/*
 * tk_kv: the engine's paged KV memory in HBM.
 *  per-layer  : kv_ptrs[l] is layer l's tensor [planes, num_pages, page_tokens, kv_heads, head_dim]
 *  cross-layer: kv_ptrs[0] is one tensor [num_pages, layers, planes, page_tokens, kv_heads, head_dim]
 * plane_bytes = page_tokens*kv_heads*head_dim*dtype_bytes must be a multiple of 16.
 */
typedef struct tk_kv {
	uint32_t layers, planes, page_tokens, kv_heads, head_dim, dtype_bytes;
	uint32_t layout, num_pages;
	uint64_t kv_ptrs[1024]; /* device pointers; kv_ptrs[0..layers) or kv_ptrs[0] */
} tk_kv;

typedef struct tk_bind_params {
	uint32_t abi_version; /* TK_ABI_VERSION */
	int32_t device;
	tk_kv kv;
	uint64_t staging_addr;  /* host memory, page aligned, registered by bind (mapped) */
	uint64_t staging_bytes; /* staging_slots * slot_bytes */
	uint32_t staging_slots; /* layer slots: a layer's bytes land in one slot */
	uint32_t max_pages;     /* pages per request */
	uint32_t max_entries;   /* I/O entries per layer per request */
	uint32_t max_requests;  /* request slots in flight */
	uint32_t io_window;     /* SQEs in flight at most (capped by ring sizes) */
	uint32_t lookahead;     /* layers ahead of the one being waited for that may be in flight */
	uint64_t poll_timeout_ns; /* no completion for this long: in-flight entries time out */
	const tk_ring *ring;    /* NULL: scatter/gather only, no GPU-driven I/O */
	/* 0: a restored layer goes from host staging to HBM by the copy engine
	 * (two device staging slots of slot_bytes, allocated here), then is
	 * scattered within HBM; 1: the scatter kernel reads host staging itself
	 * (zero copy: no device staging, but its SMs wait on PCIe while the
	 * engine computes). ABI 2. */
	uint32_t zero_copy_scatter;
	/* Gather lanes: independent tk_gather_lane callers (0: TK_GATHER_LANES;
	 * at most TK_MAX_GATHER_LANES). Each has its own stream and page map
	 * buffers for max_pages pages. ABI 4. */
	uint32_t gather_lanes;
	/* 0: a gather copies its pages within HBM into the lane's device staging
	 * (TK_GATHER_STAGE_BYTES, allocated here), a part at a time, and the copy
	 * engine moves each part to the host destination; 1: the gather kernel
	 * writes the host destination itself (zero copy: no device staging, but
	 * its SMs wait on PCIe while the engine computes). ABI 6. */
	uint32_t zero_copy_gather;
} tk_bind_params;

/* One read (or write) of a restore. offset/len are bytes in the file; slot_off
 * is the destination's byte offset inside the layer's staging slot; the entry
 * is OK when at least min_len bytes arrived (len may be rounded up to the
 * O_DIRECT alignment past the object's last byte). 32 bytes. */
/* TK_IO_FIXED_BUF: the staging pool is registered with the ring slot by slot
 * (buffer index = staging slot), so the SQE is READ_FIXED/WRITE_FIXED and the
 * kernel skips pinning the pages on every I/O. */
enum { TK_IO_FIXED_FILE = 1u, TK_IO_WRITE = 2u, TK_IO_FIXED_BUF = 4u };
typedef struct tk_io_entry {
	int32_t fd;     /* fd, or registered file index with TK_IO_FIXED_FILE */
	uint32_t flags; /* TK_IO_* */
	uint64_t offset;
	uint32_t len;
	uint32_t slot_off;
	uint32_t min_len;
	uint32_t reserved; /* 0 */
} tk_io_entry;

/* Where page i of the request lives in a layer's staging slot (its planes
 * contiguous, plane p at slot_off + p*plane_bytes), which engine page it goes
 * to, and which of the layer's entries [first_entry, last_entry] cover it. The
 * same map serves every layer of the request. */
typedef struct tk_page_map {
	uint32_t dst_page;
	uint32_t slot_off;
	uint32_t first_entry, last_entry;
} tk_page_map;

typedef struct tk_restore_params {
	uint32_t n_pages;
	const tk_page_map *pages;
	uint32_t first_layer, n_layers;   /* layers restored: [first_layer, first_layer+n_layers) */
	uint32_t entries_per_layer;
	const tk_io_entry *entries;       /* n_layers*entries_per_layer, layer-major */
	uint32_t enqueue_layers;          /* layers enqueued by submit (0: all); tk_restore_enqueue the rest (ABI 2) */
} tk_restore_params;

/* ---- library and device ---- */
int32_t tk_abi_version(void);
tk_status tk_init(int32_t device); /* sets blocking sync; TK_ERR_NO_GPU without a device */
int32_t tk_last_error(char *buf, int32_t buf_bytes);
tk_status tk_device_name(int32_t device, char *buf, int32_t buf_bytes, int32_t *sm_count);

/* ---- plain memory helpers (tests, benchmarks; engines bring their own tensors) ---- */
tk_status tk_dev_alloc(uint64_t bytes, uint64_t *dptr);
/* tk_dev_alloc_on: on GPU device (made current on the calling thread). */
tk_status tk_dev_alloc_on(int32_t device, uint64_t bytes, uint64_t *dptr);
tk_status tk_dev_free(uint64_t dptr);
tk_status tk_memcpy_htod(uint64_t dptr, uint64_t host, uint64_t bytes);
tk_status tk_memcpy_dtoh(uint64_t host, uint64_t dptr, uint64_t bytes);
tk_status tk_memset_dev(uint64_t dptr, uint32_t byte_value, uint64_t bytes);
tk_status tk_host_register(uint64_t addr, uint64_t bytes); /* pinned + mapped */
tk_status tk_host_unregister(uint64_t addr);

/* ---- bound context ---- */
tk_status tk_bind(const tk_bind_params *p, uint64_t *ctx);
tk_status tk_unbind(uint64_t ctx);

/* GPU-driven restore: enqueues, per layer, the I/O kernel (io stream) and the
 * scatter kernel (scatter stream), and returns with a request id. Enqueueing
 * blocks once the GPU's command queue is full (about 60 layers), so a long
 * request enqueues its first p->enqueue_layers layers here and the rest with
 * tk_restore_enqueue, in layer order, as earlier layers finish. While a live
 * request has layers left to enqueue, submit refuses another (TK_ERR_BUSY):
 * the staging slots are handed out in enqueue order. */
tk_status tk_restore_submit(uint64_t ctx, const tk_restore_params *p, uint32_t *req);
/* Enqueue layers of req up to (not including) request-relative layer `upto`. */
tk_status tk_restore_enqueue(uint64_t ctx, uint32_t req, uint32_t upto);
/* Make `stream` (a cudaStream_t; 0 = legacy default) wait until layer l of req
 * is scattered; no host round trip. The waits (this, tk_restore_wait_layer,
 * tk_restore_wait) refuse layers not enqueued yet (TK_ERR_INVALID): an
 * unrecorded event would not wait at all. */
tk_status tk_restore_stream_wait(uint64_t ctx, uint32_t req, uint32_t layer, uint64_t stream);
/* Host wait for one layer. TK_OK, or TK_ERR_IO if an entry of it failed. */
tk_status tk_restore_wait_layer(uint64_t ctx, uint32_t req, uint32_t layer);
/* Host wait for the whole request; copies per-entry results (n_layers*entries_per_layer,
 * layer-major) and per-layer completion times in ms since submit (may be NULL). */
tk_status tk_restore_wait(uint64_t ctx, uint32_t req, tk_entry_result *results, uint32_t n_results,
                          float *layer_ms, uint32_t n_layer_ms);
tk_status tk_restore_release(uint64_t ctx, uint32_t req);

/* Host-side copies (CPU-issued I/O paths, saves). tk_host_map waits for the
 * earlier host copies, then uploads the page map they use (n_pages <= max_pages).
 * tk_scatter_host enqueues the scatter of one layer from host memory holding it
 * in object layout (src..src+src_bytes inside tk_host_register'ed memory or the
 * staging pool); tk_gather_host the reverse (paged KV -> host, object layout).
 * Both are ordered on the context's copy stream; tk_copy_event records an event
 * (index < staging_slots) after them, tk_copy_event_wait waits for it on the host. */
tk_status tk_host_map(uint64_t ctx, const tk_page_map *pages, uint32_t n_pages);
tk_status tk_scatter_host(uint64_t ctx, uint32_t layer, uint64_t src, uint64_t src_bytes);
tk_status tk_gather_host(uint64_t ctx, uint32_t layer, uint64_t dst, uint64_t dst_bytes);
tk_status tk_copy_event(uint64_t ctx, uint32_t index);
tk_status tk_copy_event_wait(uint64_t ctx, uint32_t index);
/* Scatter one layer from device memory holding it in object layout (the cuFile
 * path reads into a device buffer); same map and stream as tk_scatter_host. */
tk_status tk_scatter_dev(uint64_t ctx, uint32_t layer, uint64_t dsrc, uint64_t src_bytes);
/* Wait for everything enqueued on the copy stream. */
tk_status tk_sync(uint64_t ctx);

/* Save gather on a lane (lane < the context's gather lanes): copies layers
 * [first_layer, first_layer+layers) of the n pages of map (n <= max_pages;
 * page i's object bytes at pages[i].slot_off, entries unused) from the KV
 * tensors into dst in object layout, layer first_layer+l at
 * dst + l*layer_stride, and returns once the bytes are in dst: through the
 * lane's device staging and the copy engine (ABI 6), or written by the copy
 * kernel itself with tk_bind_params.zero_copy_gather.
 * dst..dst+layers*layer_stride must lie in tk_host_register'ed memory (or the
 * staging pool); dst and layer_stride are multiples of 16, and every page of
 * the map fits in layer_stride. The map is copied before the call returns
 * (the caller keeps ownership). Calls on different lanes run at once, each
 * on its own stream and map buffers, from any threads; a lane already in a
 * call is refused (TK_ERR_BUSY). Independent of tk_host_map and the copy
 * stream. (ABI 4.)
 * plane_crcs, if not NULL, gets the CRC32C (Castagnoli, objmap's chunk CRC)
 * of every page plane gathered, computed on the GPU from the KV tensors:
 * plane_crcs[(l*n + i)*planes + p] for layer first_layer+l, page i, plane p
 * (layers*n*planes entries of host memory the caller owns; written before
 * the call returns, undefined after a failure). (ABI 5.)
 * after_event, if not 0, is a cudaEvent_t of the same device (an engine's,
 * recorded on the stream that writes the pages): the lane's copies start
 * once it completed, so the engine's host need not wait for its own stream
 * before a save; the call still returns only when the bytes are in dst. The
 * caller keeps the event alive until the call returned. (ABI 6.) */
tk_status tk_gather_lane(uint64_t ctx, uint32_t lane, const tk_page_map *pages, uint32_t n, uint32_t first_layer,
                         uint32_t layers, uint64_t dst, uint64_t layer_stride, uint32_t *plane_crcs,
                         uint64_t after_event);

#ifdef __cplusplus
}
#endif
#endif /* TUTTI_KERNELS_H */
