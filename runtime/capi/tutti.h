/*
 * tutti.h — the C ABI of libtutti, the tutti KV-cache runtime.
 *
 * Built with `go build -buildmode=c-shared -o bin/libtutti.so ./runtime/capi`.
 * This header is the checked-in contract; the header cgo generates next to the
 * library (bin/libtutti.h) includes it, and TestHeaderMatchesGenerated fails
 * when the exported signatures of the two drift apart.
 *
 * Conventions
 *  - Every function returns a tutti_status (0 = TUTTI_OK) except
 *    tutti_abi_version and tutti_last_error.
 *  - On failure the calling thread's last-error message says what was wrong
 *    (naming the argument or the operation); read it with tutti_last_error.
 *    Success leaves the message of an earlier failure untouched.
 *  - Handles are opaque non-zero integers into tables inside the library; no
 *    library memory is ever handed out. 0 is never a valid handle. A handle
 *    of the wrong kind, a released or closed one, or one never issued gives
 *    TUTTI_ERR_BAD_HANDLE, never a crash.
 *  - Arrays passed in (chains, page ids, regions, directory names, tokens)
 *    are read during the call only (copied where the library needs them
 *    later); the library keeps no pointer into caller memory except the
 *    registered KV memory (see tutti_register_kv).
 *  - Every pointer and length is checked: NULL where data is needed, a zero or
 *    oversize count, an address range that overflows, a length that does not
 *    match the geometry: TUTTI_ERR_INVALID_ARGUMENT or TUTTI_ERR_GEOMETRY.
 *    Limits: chain_len <= 2^20 blocks, num_pages (per call) <= 2^24,
 *    num_dirs <= 64 (paths < 4096 bytes), num_regions <= 65536. The library
 *    cannot check that a non-NULL pointer is valid: it must point to the
 *    counted elements.
 *  - All functions are safe to call from several threads; a load or save
 *    handle must not be released while another thread waits on it.
 *  - Structs that may grow start with struct_size (= sizeof as the caller
 *    was compiled). The library reads or writes only the first struct_size
 *    bytes; fields past it are taken as zero (config) or left unwritten
 *    (stats). A struct_size below the version-1 size is TUTTI_ERR_VERSION.
 */
#ifndef TUTTI_H
#define TUTTI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version: a caller built for major M works with any library of major M
 * and minor >= the minor it needs. tutti_abi_version() returns
 * (major << 16) | minor. */
#define TUTTI_ABI_MAJOR 1
#define TUTTI_ABI_MINOR 10

typedef enum tutti_status {
	TUTTI_OK = 0,
	TUTTI_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, zero/oversize count, overflow, bad enum */
	TUTTI_ERR_BAD_HANDLE = 2,       /* unknown, released, closed, or wrong kind of handle */
	TUTTI_ERR_VERSION = 3,          /* abi_major or struct_size not supported */
	TUTTI_ERR_GEOMETRY = 4,         /* lengths or shapes do not match the store's geometry */
	TUTTI_ERR_OUT_OF_RANGE = 5,     /* page id, layer or block outside its range */
	TUTTI_ERR_NOT_REGISTERED = 6,   /* load or save before tutti_register_kv */
	TUTTI_ERR_BUFFER_TOO_SMALL = 7, /* an output array is too short; *out_len says the need */
	TUTTI_ERR_NO_GPU = 8,           /* GPU path asked for, no GPU or no kernels library */
	TUTTI_ERR_NOT_SUPPORTED = 9,    /* the kernel or device lacks a needed feature */
	TUTTI_ERR_LOCKED = 10,          /* a store directory is held by another open store */
	TUTTI_ERR_CLOSED = 11,          /* the store was closed while the call ran */
	TUTTI_ERR_NO_SPACE = 12,        /* the store cannot hold what was asked */
	TUTTI_ERR_IO = 13,              /* a read, write or sync failed (message names it) */
	TUTTI_ERR_CORRUPT = 14,         /* stored data failed a checksum or header check */
	TUTTI_ERR_BUSY = 15,            /* too many loads in flight; release some and retry */
	TUTTI_ERR_INTERNAL = 16,        /* a bug in the library; the message says where */
	/* ABI 1.4 (TUTTI_ERR_INTERNAL before): tutti_open found a store created with other
	 * settings (its capacity), or not all of its directories (one does not exist or holds
	 * no part of it, or it spans more than were given); the message names what differs */
	TUTTI_ERR_SETTINGS_MISMATCH = 17
} tutti_status;

typedef enum tutti_path {
	TUTTI_PATH_CPU = 1, /* io_uring from the library's threads, KV memory in host RAM */
	TUTTI_PATH_GPU = 2  /* GPU-driven io_uring + CUDA scatter/gather, KV memory in HBM */
} tutti_path;

typedef enum tutti_dtype {
	TUTTI_DTYPE_BF16 = 1,
	TUTTI_DTYPE_FP16 = 2,
	TUTTI_DTYPE_FP8 = 3, /* e4m3 or e5m2: the library moves bytes, it never converts */
	TUTTI_DTYPE_FP32 = 4
} tutti_dtype;

typedef enum tutti_layout {
	/* one region per layer, each [planes, num_pages, page_tokens, kv_heads, head_dim] (vLLM) */
	TUTTI_LAYOUT_PER_LAYER = 1,
	/* one region, [num_pages, layers, planes, page_tokens, kv_heads, head_dim] */
	TUTTI_LAYOUT_CROSS_LAYER = 2
} tutti_layout;

typedef enum tutti_memory {
	TUTTI_MEMORY_HOST = 1, /* host virtual addresses (CPU path) */
	TUTTI_MEMORY_CUDA = 2  /* CUDA device pointers on the store's device (GPU path) */
} tutti_memory;

/* Bits of tutti_config.gpu_flags (ABI 1.1). A bit this library does not know
 * is TUTTI_ERR_INVALID_ARGUMENT. */
typedef enum tutti_gpu_flags {
	/* Accepted and changes nothing: gpu_io_window, gpu_max_io_bytes and
	 * gpu_lookahead left 0 are sized to the disks under dirs whether it is
	 * set or not (see those fields). Kept so that 1.1 callers still open. */
	TUTTI_GPU_READS_FROM_DEVICES = 1
} tutti_gpu_flags;

/* Store configuration. Zero means "library default" for the tuning fields. */
typedef struct tutti_config {
	uint32_t struct_size;     /* sizeof(tutti_config) */
	uint32_t abi_major;       /* TUTTI_ABI_MAJOR */
	const char *const *dirs;  /* num_dirs NUL-terminated paths (each < 4096 bytes) */
	uint32_t num_dirs;        /* 1..64 */
	uint32_t path;            /* tutti_path */
	int64_t capacity_bytes;   /* on-disk capacity over all dirs, > 0 */
	/* geometry of the engine's KV cache */
	int32_t layers;
	int32_t kv_heads;
	int32_t head_dim;
	uint32_t dtype;           /* tutti_dtype */
	int32_t planes;           /* 2 = K and V, 1 = one latent plane (MLA) */
	int32_t page_tokens;      /* tokens per engine page (vLLM block) */
	int32_t chunk_pages;      /* pages per chain block (hash granularity) */
	uint32_t layout;          /* tutti_layout */
	int64_t num_pages;        /* pages in the engine's KV memory */
	/* tuning: 0 = default */
	int32_t queue_depth;        /* I/Os in flight per engine */
	int32_t save_bound_ms;      /* longest a save may be deferred behind loads */
	int64_t staging_bytes;      /* off-heap staging memory; bounds bytes in flight */
	int64_t staging_slot_bytes; /* largest single I/O; divides staging_bytes */
	int32_t max_loads;          /* loads in flight at once (more: TUTTI_ERR_BUSY) */
	uint32_t tp_rank;           /* ABI 1.2: this store's tensor-parallel rank, < tp_size (was reserved, 0) */
	/* Scheduler models. All compute fields 0: no compute profile, every
	 * stored block is loaded. All device fields 0: a conservative SSD
	 * (2 GB/s reads). Otherwise the group is used as given and checked. */
	double compute_fixed_ns;               /* per layer and chain block */
	double compute_per_token_ns;           /* per computed token, per layer */
	double compute_per_pair_ns;            /* per (query, key) token pair, per layer */
	double device_read_bytes_per_sec;      /* large O_DIRECT reads, deep queue */
	double device_write_bytes_per_sec;
	double device_read_iops;               /* small reads, deep queue */
	double device_write_iops;
	double device_read_latency_ns;         /* first completion on an idle device */
	double device_read_share_under_writes; /* read bandwidth with writes running / alone, (0, 1] */
	double device_write_share_under_reads; /* write bandwidth with reads running / alone, (0, 1] */
	int64_t save_budget_bytes;             /* save bytes admitted and not yet written, per device
	                                          (a save beyond it is stored in part); 0 = none: the save bound alone limits saves */
	/* GPU path */
	int32_t gpu_device;    /* CUDA ordinal of the KV tensors */
	int32_t gpu_max_pages; /* pages one restore moves (a longer load is cut, the rest recomputed);
	                          0 = min(num_pages, 4096) */
	int32_t gpu_max_runs;  /* runs (extents per layer) of one restore; 0 = 64 */
	uint32_t tp_size;      /* ABI 1.2: tensor-parallel degree; 0 or 1 = none (was reserved2, 0).
	                          With tp_size = N > 1 the geometry above is the whole model's and the
	                          store holds rank tp_rank's shard (KV heads split evenly; MLA's one
	                          latent plane replicated), the dirs are this rank's own, and a dir
	                          that another rank or degree stored into is refused at open
	                          (TUTTI_ERR_GEOMETRY). */
	/* ABI 1.1: the GPU path's reads (runtime.GPUConfig's IOWindow, MaxIOBytes,
	 * Lookahead). Each left 0 is sized at tutti_open to the disks under dirs:
	 * the window by runtime.GPUReadWindow of their request queues (the one
	 * rule: its doc says how), the largest read the largest every disk takes
	 * unsplit, the lookahead by runtime.GPULookaheadToFill of that window. A
	 * value set wins. A 1.0 caller's shorter struct leaves them 0. */
	int32_t gpu_io_window;    /* reads in flight; 0 = sized to the disks */
	int32_t gpu_max_io_bytes; /* largest read, a multiple of 4096 up to 16 MiB; 0 = sized to the disks */
	int32_t gpu_lookahead;    /* layers in flight beyond the one waited for (staging: lookahead+3
	                             layer slots); 0 = enough to fill the window */
	uint32_t gpu_flags;       /* tutti_gpu_flags bits; 0 = none */
	/* ABI 1.3 (a 1.2 caller's shorter struct leaves it 0) */
	int32_t save_writes_per_device; /* save writes in flight per device, 0..256; 0 = the default
	                                   (runtime.DefaultSaveWritesPerDevice) */
	uint32_t reserved3;             /* must be 0 (TUTTI_ERR_INVALID_ARGUMENT otherwise) */
} tutti_config;

/* One contiguous range of KV memory. */
typedef struct tutti_kv_region {
	uint64_t addr;      /* first byte; aligned to at least the dtype size */
	uint64_t len_bytes; /* exactly the bytes the layout gives this region */
} tutti_kv_region;

/* The first counters since open (runtime.Stats), flat, as ABI 1.0 defined
 * them; blocks are chain blocks. This struct does not grow: every counter
 * and state, these included, is in tutti_get_stats_json. */
typedef struct tutti_stats {
	uint32_t struct_size; /* sizeof(tutti_stats), set by the caller */
	uint32_t reserved;
	uint64_t lookups;         /* tutti_lookup calls */
	uint64_t lookup_blocks;   /* blocks asked for by lookups */
	uint64_t hit_blocks;      /* blocks lookups found stored */
	uint64_t loads;           /* loads that started a restore */
	uint64_t cached_blocks;   /* blocks stored at load time (pinned) */
	uint64_t planned_blocks;  /* blocks the scheduler chose to load (the rest: recompute) */
	uint64_t restored_blocks; /* blocks restored and verified */
	uint64_t restored_bytes;  /* payload bytes written into KV memory */
	uint64_t read_ios;        /* reads submitted */
	uint64_t split_ios;       /* reads beyond the first of a (layer, run) */
	uint64_t overread_bytes;  /* bytes read only to verify a checksum or for alignment */
	uint64_t miss_blocks;     /* planned blocks not restored (I/O error, checksum, ...) */
	uint64_t saves;           /* tutti_save calls */
	uint64_t save_blocks;     /* blocks asked to be saved */
	uint64_t saved_blocks;    /* blocks committed */
	uint64_t saved_bytes;     /* payload bytes written for committed blocks */
	uint64_t write_ios;       /* payload writes submitted */
	uint64_t committed_runs;
	uint64_t corrupt_dropped; /* runs dropped after a checksum mismatch */
	uint64_t skipped_blocks;  /* blocks of saves not stored (already stored, no space, ...) */
	uint64_t fallbacks;       /* times a slower path was taken (counted, never silent) */
} tutti_stats;

/* What tutti_open recovered from the directories. */
typedef struct tutti_recovery {
	uint32_t struct_size;    /* sizeof(tutti_recovery), set by the caller */
	uint32_t reserved;
	uint64_t indexed_runs;   /* committed runs served (hits for tutti_lookup) */
	uint64_t indexed_blocks; /* chain blocks in them */
	uint64_t dropped_runs;   /* runs found but not served (unknown parent, bad header, no room): freed */
} tutti_recovery;

/* (TUTTI_ABI_MAJOR << 16) | TUTTI_ABI_MINOR of the library. */
uint32_t tutti_abi_version(void);

/* Copies the calling thread's last error message, NUL-terminated and truncated
 * to len-1 bytes, into buf; returns the message's full length (0 if none). buf
 * may be NULL when len is 0, to ask for the length. */
int64_t tutti_last_error(char *buf, uint64_t len);

/* Opens (creating if empty) the store in cfg->dirs, locking each directory and
 * recovering committed runs. *out_store receives the handle. */
int32_t tutti_open(tutti_config *cfg, uint64_t *out_store);

/* tutti_open, and the store publishes what it serves as vLLM KV events for
 * cache-aware routers (docs/routers.md). kv_events (NUL-terminated, < 4096
 * bytes) is "tcp://HOST:PORT[?replay=tcp://HOST:PORT][&topic=T][&dp_rank=N]
 * [&format=F][&medium=M]": the ZeroMQ PUB endpoint, the ROUTER replay
 * endpoint, the topic (llm-d: "kv@<pod>@<model>"), the format (vllm-0.26, the
 * default, or vllm-0.11); or "engine[?format=F]": no sockets, the engine
 * takes the events (ABI 1.5, tutti_take_kv_events). A bad spec is
 * TUTTI_ERR_INVALID_ARGUMENT; an endpoint that cannot be bound fails the open. */
int32_t tutti_open_kv_events(tutti_config *cfg, char *kv_events, uint64_t *out_store);

/* ABI 1.7: tutti_open for an engine on a node whose store is served by
 * `tutti serve --dir D1,D2 --socket PATH` (one store shared by the node's
 * engines). socket (NUL-terminated) is PATH; cfg is checked as tutti_open
 * checks it, but cfg->dirs, num_dirs and capacity_bytes are ignored (the
 * service's; dirs may be NULL). The engine moves its own bytes (cfg->path:
 * host memory or HBM) through the pool files, which it opens; the service
 * keeps the index, allocation, commits, KV events and etcd membership, so
 * tutti_take_kv_events fails. Saves and loads work as on an opened store and
 * see every engine's saves; tutti_close closes the connection, and the
 * service releases whatever the store held. tp_size > 1 is
 * TUTTI_ERR_INVALID_ARGUMENT. No service at socket, or one serving another
 * geometry, fails the call. */
int32_t tutti_connect(char *socket, tutti_config *cfg, uint64_t *out_store);

/* Waits for deferred saves, releases the store's loads and saves, unlocks the
 * directories. The handle and its load/save handles are invalid afterwards. */
int32_t tutti_close(uint64_t store);

/* Registers the engine's KV memory, once per store, before the first load or
 * save: regions[i] is layer i (PER_LAYER, then num_regions == layers) or the
 * whole cache (CROSS_LAYER, num_regions == 1); each len_bytes is exactly the
 * layout's size and each addr is 16-byte aligned. The memory must stay mapped
 * and unmoved until tutti_close returns: the library reads it inside a save
 * (until tutti_save_wait_gathered) and writes it inside a load (until the
 * load is waited for or released), and never touches it after tutti_close. */
int32_t tutti_register_kv(uint64_t store, uint32_t memory, tutti_kv_region *regions, uint32_t num_regions);

/* *out_blocks = how many leading blocks of chain are stored and loadable. */
int32_t tutti_lookup(uint64_t store, uint64_t *chain, uint32_t chain_len, uint32_t *out_blocks);

/* Starts restoring the leading stored blocks of chain into pages (chunk_pages
 * page ids per chain block, num_pages == chain_len * chunk_pages). Returns at
 * once with *out_load; layers arrive in order. Blocks not restored (a miss, a
 * failed read, or cheaper to recompute) are reported by tutti_load_plan and
 * tutti_load_wait; their pages hold unspecified bytes and must be recomputed. */
int32_t tutti_load(uint64_t store, uint64_t *chain, uint32_t chain_len, int32_t *pages, uint32_t num_pages, uint64_t *out_load);

/* Blocks the calling thread until layer `layer` of the load is in KV memory
 * (GPU path: its scatter has completed on the device, so work enqueued after
 * the return sees it; tutti_load_stream_wait_layer avoids the host wait). */
int32_t tutti_load_wait_layer(uint64_t load, int32_t layer);

/* GPU path: makes CUDA stream `stream` (a cudaStream_t; 0 = the legacy
 * default stream) wait until layer `layer` of the load is in the KV tensors,
 * without blocking the calling thread. Kernels the engine enqueues on that
 * stream afterwards see the layer. TUTTI_ERR_NOT_SUPPORTED on the CPU path.
 * A failed read leaves its pages unwritten: tutti_load_wait says how many
 * blocks really arrived. */
int32_t tutti_load_stream_wait_layer(uint64_t load, int32_t layer, uint64_t stream);

/* Blocks until the whole load is done; *out_blocks (may be NULL) = leading
 * blocks restored, the rest are to be recomputed. */
int32_t tutti_load_wait(uint64_t load, uint32_t *out_blocks);

/* ABI 1.8: *out_done = 1 once the load ended (tutti_load_wait would not
 * block; GPU path: its pages are written on the device, so work enqueued after
 * the return sees them), else 0. Never blocks: an engine that runs other
 * requests while a load is in flight polls it (vLLM's asynchronous loads). */
int32_t tutti_load_done(uint64_t load, int32_t *out_done);

/* Why a load restored fewer blocks than planned, for diagnostics: *out_status
 * = the status class of the first error that turned a run into a miss (e.g.
 * TUTTI_ERR_IO, TUTTI_ERR_CORRUPT), or TUTTI_OK when none did. When there is
 * one, the calling thread's last-error message is set to its text. The call
 * itself returns TUTTI_OK unless its arguments are wrong. */
int32_t tutti_load_failure(uint64_t load, int32_t *out_status);

/* The load's plan, fixed when tutti_load returned: *out_cached = leading
 * blocks stored at that time (pinned for the load), *out_planned = blocks it
 * restores unless an I/O fails (the scheduler may leave a stored tail to be
 * recomputed when that is faster). Either pointer may be NULL. */
int32_t tutti_load_plan(uint64_t load, uint32_t *out_cached, uint32_t *out_planned);

/* Waits for the load if it still runs, then frees its handle and unpins it. */
int32_t tutti_load_release(uint64_t load);

/* ABI 1.2: bits of tutti_load_with's flags. */
typedef enum tutti_load_flags {
	/* The blocks were promised by tutti_match: the planner loads every cached
	 * block it can admit instead of trading some for recompute. */
	TUTTI_LOAD_PROMISED = 1
} tutti_load_flags;

/* ABI 1.2: tutti_load after the engine's own first `skip` blocks of chain (its
 * local prefix-cache hits, skip < chain_len): they are neither read nor
 * written, pages is the block table of chain[skip:] only (num_pages ==
 * (chain_len - skip) * chunk_pages), and tutti_load_plan / tutti_load_wait
 * count blocks after the skipped ones. */
int32_t tutti_load_with(uint64_t store, uint64_t *chain, uint32_t chain_len, uint32_t skip, uint32_t flags,
                        int32_t *pages, uint32_t num_pages, uint64_t *out_load);

/* ABI 1.2: the lookup of an engine that commits to a hit before it loads.
 * *out_blocks = blocks after the first `skip` (skip <= chain_len) that a
 * TUTTI_LOAD_PROMISED tutti_load_with of the same chain restores unless a
 * read fails: blocks not stored, blocks the planner would recompute, and on
 * the GPU path blocks past gpu_max_pages / gpu_max_runs are left out. They
 * stay stored (pinned against eviction) until tutti_hold_release of
 * *out_hold, or for ttl_ms (> 0) at most; a hold is released by
 * tutti_close too. */
int32_t tutti_match(uint64_t store, uint64_t *chain, uint32_t chain_len, uint32_t skip, uint32_t ttl_ms,
                    uint64_t *out_hold, uint32_t *out_blocks);

/* ABI 1.2: ends a hold (after its load started, or when the request is
 * dropped); a hold whose ttl ran out is released as well. */
int32_t tutti_hold_release(uint64_t hold);

/* Starts saving chain's blocks from pages (num_pages == chain_len * chunk_pages).
 * Blocks already stored are skipped. The pages must stay unchanged until
 * tutti_save_wait_gathered returns; durability comes later (tutti_wait_saves). */
int32_t tutti_save(uint64_t store, uint64_t *chain, uint32_t chain_len, int32_t *pages, uint32_t num_pages, uint64_t *out_save);

/* Blocks until the save has copied its pages out of KV memory. */
int32_t tutti_save_wait_gathered(uint64_t save);

/* ABI 1.9: *out_gathered = 1 once the save has copied its pages out of KV
 * memory (tutti_save_wait_gathered would not block; the pages may change),
 * else 0. Never blocks: an engine that lets a finished request's pages wait
 * until they are reused polls it. */
int32_t tutti_save_gathered(uint64_t save, int32_t *out_gathered);

/* Waits for gathering if needed, then frees the save handle (the write itself
 * continues; tutti_wait_saves waits for it). */
int32_t tutti_save_release(uint64_t save);

/* Blocks until every save started so far has ended: committed (durable, and
 * a hit for tutti_lookup) or skipped (counted in tutti_stats). Returns
 * TUTTI_ERR_IO when saves since the last call lost blocks to a failed write
 * or journal append (a full disk: the last-error text names it); the store
 * stays usable, and saves resume once the disk has room. */
int32_t tutti_wait_saves(uint64_t store);

/* Fills the first out->struct_size bytes of *out. */
int32_t tutti_get_stats(uint64_t store, tutti_stats *out);

/* ABI 1.6: all of runtime.Stats as one JSON object, nested by subsystem
 * (path, lookups, holds, loads, saves, index, map, sched, events, gpu,
 * devices, prewrite; docs/integration.md lists them), each key the Go
 * field's json tag: snake_case, never renamed within a major. Counts are
 * integers, states strings (an enum's name) with their reasons in fields
 * beside them, counts by cause objects keyed by cause; a minor may add
 * keys, which a reader ignores. Copies it NUL-terminated into buf (len
 * bytes) and sets *out_len to its length without the NUL;
 * TUTTI_ERR_BUFFER_TOO_SMALL (nothing copied) when len <= that length. buf
 * may be NULL when len is 0, to ask for the length; the counters may grow
 * between two calls, so ask again on TUTTI_ERR_BUFFER_TOO_SMALL.
 *
 * Why text and not a struct: a struct needs a field, a header line and a
 * binding line per counter and version, for ever; the stats are read at
 * monitoring rates, where encoding them costs nothing that matters, and a
 * self-describing object lets a counter added in Go reach C and Python
 * with no change on either side. */
int32_t tutti_get_stats_json(uint64_t store, char *buf, uint64_t len, uint64_t *out_len);

/* Fills the first out->struct_size bytes of *out with what tutti_open recovered. */
int32_t tutti_get_recovery(uint64_t store, tutti_recovery *out);

/* ABI 1.1: the GPU read settings tutti_open chose, as text: the window,
 * largest read and lookahead used (set values included) and, after "not
 * read:", each device fact that could not be read and what was assumed for
 * it. Copies it NUL-terminated into
 * buf (len bytes) and sets *out_len to its length without the NUL;
 * TUTTI_ERR_BUFFER_TOO_SMALL (nothing copied) when len <= that length. buf
 * may be NULL when len is 0, to ask for the length. */
int32_t tutti_get_gpu_reads(uint64_t store, char *buf, uint64_t len, uint64_t *out_len);

/* tutti_save, with the token ids of the chain's blocks (num_tokens =
 * chain_len * page_tokens * chunk_pages, block by block): a store opened with
 * tutti_open_kv_events publishes them with the blocks and keeps them across
 * restarts; otherwise they are checked and dropped. */
int32_t tutti_save_tokens(uint64_t store, uint64_t *chain, uint32_t chain_len, int32_t *pages, uint32_t num_pages,
                          uint32_t *tokens, uint64_t num_tokens, uint64_t *out_save);

/* tutti_save with each block's metadata for KV events: token ids as in
 * tutti_save_tokens (tokens may be NULL with num_tokens 0: hashes only) and
 * the engine's own hash of each block (hashes: chain_len hashes of hash_bytes
 * each, 1..64; NULL with hash_bytes 0: the chain ids are published), e.g.
 * vLLM's block hash bytes, published instead of the chain ids. Both are
 * copied before the call returns. */
int32_t tutti_save_meta(uint64_t store, uint64_t *chain, uint32_t chain_len, int32_t *pages, uint32_t num_pages,
                        uint32_t *tokens, uint64_t num_tokens, uint8_t *hashes, uint32_t hash_bytes, uint64_t *out_save);

/* ABI 1.10: tutti_save_meta (tokens and hashes may both be NULL with 0)
 * whose gathers copy the pages only once after_event completed: a
 * cudaEvent_t of the store's device (as an integer), recorded on the
 * engine's stream behind its writes of the pages, so that the engine's host
 * need not wait for its stream before saving. 0 is tutti_save_meta. GPU path
 * only (TUTTI_ERR_NOT_SUPPORTED otherwise). The caller keeps the event
 * alive, and does not record it again, until tutti_save_wait_gathered
 * returned (or tutti_save_gathered said 1). */
int32_t tutti_save_after(uint64_t store, uint64_t *chain, uint32_t chain_len, int32_t *pages, uint32_t num_pages,
                         uint32_t *tokens, uint64_t num_tokens, uint8_t *hashes, uint32_t hash_bytes, uint64_t after_event,
                         uint64_t *out_save);

/* ABI 1.5: hands the events of a store opened with kv_events "engine" to the
 * engine that publishes them itself (vLLM: its workers report them and vLLM
 * publishes what every rank holds; docs/routers.md), oldest first: buf (cap
 * bytes) gets one msgpack array of events in the spec's format (vLLM 0.26's
 * maps by default), *out_len its bytes, *out_events how many, *out_more 1
 * when more wait (call again before acting on them). The first call, and the
 * first after the store's queue overflowed, begins with AllBlocksCleared,
 * then lists what the store serves (parents first): it means "this store's
 * blocks are the ones that follow" and must not be forwarded to a router.
 * TUTTI_ERR_BUFFER_TOO_SMALL (nothing taken) when the next event alone
 * exceeds cap: *out_len is what it needs. TUTTI_ERR_INVALID_ARGUMENT for a
 * store opened without "engine". */
int32_t tutti_take_kv_events(uint64_t store, uint8_t *buf, uint64_t cap, uint64_t *out_len, uint32_t *out_events,
                             uint32_t *out_more);

/* Derives the block-hash chain of a token sequence with the Go prefix
 * package's ChainFromTokens: one id per full block of block_tokens tokens (a
 * trailing partial block has none), id[i] = XXH64(LE64(id[i-1]) ||
 * LE32(tokens of block i), seed) with id[-1] = 0. The seed separates
 * namespaces (e.g. one per model). out_chain gets the ids; *out_len =
 * num_tokens / block_tokens; TUTTI_ERR_BUFFER_TOO_SMALL if cap is less. */
int32_t tutti_chain_from_tokens(uint32_t *tokens, uint64_t num_tokens, uint32_t block_tokens, uint64_t seed, uint64_t *out_chain, uint32_t cap, uint32_t *out_len);

#ifdef __cplusplus
}
#endif

#endif /* TUTTI_H */
