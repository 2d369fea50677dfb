/*
 * tk_testkit.h — libtutti_testkit.so, the GPU code that only tests and
 * benchmarks load (package kernels/testkit, the C self-test): content fill and
 * verification of the KV tensors in HBM, the cuFile baseline, and the harness's
 * prefill GEMMs (tk_prefill.h). The product's library (tutti_kernels.h) holds
 * only the restore and save path; the engine never loads this one.
 *
 * The functions take the KV descriptor of tutti_kernels.h (tk_kv) rather than
 * a bound context: they share device pointers with the product's library
 * (one process, one primary CUDA context per device) and nothing else. Each
 * call is synchronous and allocates what it needs for its own duration.
 * (tkt_legacy_spin excepted: it returns with its kernel running.)
 * Errors: tk_status codes of tutti_kernels.h; tkt_last_error copies the
 * calling thread's last message of this library.
 */
#ifndef TK_TESTKIT_H
#define TK_TESTKIT_H

#include "tutti_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* TK_ABI_VERSION of the tutti_kernels.h it was built with (its structs). */
int32_t tkt_abi_version(void);
int32_t tkt_last_error(char *buf, int32_t buf_bytes);

/* Poison the KV memory kv describes on GPU device (every byte = byte_value). */
tk_status tkt_kv_fill(const tk_kv *kv, int32_t device, uint32_t byte_value);
/* Count 8-byte words of the restored pages that differ from internal/kvdata's
 * content of Key{Block: seed + i, Layer, Plane, Page: 0}, where i is the page's
 * index in `pages` (its place in the saved object; one page per chain block). */
tk_status tkt_kv_verify(const tk_kv *kv, int32_t device, uint64_t seed, const tk_page_map *pages, uint32_t n_pages,
                        uint32_t first_layer, uint32_t n_layers, uint64_t *mismatched_words);

/* An engine's work on the legacy default stream: tkt_legacy_spin launches a
 * kernel there that runs for ns (1 ns..60 s) and returns at once;
 * tkt_legacy_busy says whether the legacy stream still has work. What a test
 * of "the product's waits do not wait for the engine's stream" uses. */
tk_status tkt_legacy_spin(int32_t device, uint64_t ns);
tk_status tkt_legacy_busy(int32_t device, int32_t *busy);

/* An engine that writes its KV on a stream of its own and records an event
 * after it: tkt_kv_fill_after enqueues, on a new stream of device, a kernel
 * that runs for spin_ns (1 ns..60 s) and then sets every byte of the KV
 * memory to byte_value, records an event behind them and returns at once
 * with the event (a cudaEvent_t) in *event. tkt_event_done says whether it
 * completed; tkt_event_destroy frees it. What a test of a save ordered after
 * the engine's writes (tk_gather_lane's after_event) uses. */
tk_status tkt_kv_fill_after(const tk_kv *kv, int32_t device, uint32_t byte_value, uint64_t spin_ns, uint64_t *event);
tk_status tkt_event_done(uint64_t event, int32_t *done);
tk_status tkt_event_destroy(uint64_t event);

/* ---- cuFile (GDS), loaded with dlopen ---- */
/* Opens the cuFile driver and registers path; returns TK_OK, or the error with
 * cuFile's code in *cufile_err and its text in tkt_last_error. */
tk_status tk_cufile_probe(const char *path, int32_t *cufile_err);
/* Reads n extents of one file with cuFile's batch API into device memory at
 * dptr + dst_off[i]. */
tk_status tk_cufile_batch_read(const char *path, const uint64_t *file_off, const uint64_t *dst_off,
                               const uint32_t *len, uint32_t n, uint64_t dptr, uint64_t dbytes);

/* The other translation units of this library (cuFile, prefill) set the message. */
tk_status tk_fail_msg(tk_status code, const char *fmt, ...);

#ifdef __cplusplus
}
#endif
#endif /* TK_TESTKIT_H */
