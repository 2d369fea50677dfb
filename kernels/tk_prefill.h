/*
 * tk_prefill.h — the prefill-compute part of libtutti_testkit's ABI (a
 * companion of tk_testkit.h, same conventions: plain C, tk_status codes,
 * tkt_last_error for the message). It runs the GEMMs of a transformer layer's
 * prefill with cuBLAS on a stream of its own, so the evaluation harness can
 * put real GPU work next to a restore's I/O and measure each layer's time.
 *
 * These entry points came after the restore ABI and change none of its
 * structs or signatures (TK_ABI_VERSION does not cover them): a loader
 * resolves them separately and reports a library built before them by the
 * missing symbol's name. A change below must keep that true or rename.
 *
 * Memory: tk_prefill_create allocates everything (three bf16 buffers filled
 * with pseudo-random values once, a cuBLAS handle with its own workspace, a
 * non-blocking stream, max_layers+1 timing events); tk_prefill_run allocates
 * nothing. A handle is used by one thread at a time.
 */
#ifndef TK_PREFILL_H
#define TK_PREFILL_H

#include "tutti_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One GEMM shape, run `count` times per layer: C[m×n] = A[m×k]·B[k×n],
 * bf16 inputs and output, fp32 accumulation, column-major with leading
 * dimensions rounded up to 8 elements (lda = ldc = round8(m), ldb = round8(k)),
 * so it needs round8(m)*k elements of A, round8(k)*n of B, round8(m)*n of C. */
typedef struct tk_gemm {
	uint32_t m, n, k;
	uint32_t count;
} tk_gemm;

#define TK_PREFILL_MAX_GEMMS 4096        /* descriptors per layer */
#define TK_PREFILL_MAX_LAUNCHES 1000000u /* GEMM launches per run (layers × Σ count) */

typedef struct tk_prefill_params {
	int32_t device;
	uint32_t max_layers;              /* layers per run, 1..65536 */
	uint64_t a_elems, b_elems, c_elems; /* bf16 elements of A, B, C (each ≥ 1) */
} tk_prefill_params;

tk_status tk_prefill_create(const tk_prefill_params *p, uint64_t *handle);
/* Enqueues n_layers layers, each the same list of GEMMs, on the handle's
 * stream with a timing event before the first layer and after each one, and
 * returns without waiting. TK_ERR_BUSY while an earlier run was not waited
 * for; TK_ERR_INVALID (nothing enqueued) for a shape that does not fit the
 * buffers or the limits. */
tk_status tk_prefill_run(uint64_t handle, uint32_t n_layers, const tk_gemm *gemms, uint32_t n_gemms);
/* Waits (blocking, not spinning) for the run and writes each layer's GPU time
 * in ms into layer_ms[0..min(n_layers, n_layer_ms)). */
tk_status tk_prefill_wait(uint64_t handle, float *layer_ms, uint32_t n_layer_ms);
/* Waits for anything enqueued, then frees everything. */
tk_status tk_prefill_destroy(uint64_t handle);

#ifdef __cplusplus
}
#endif
#endif /* TK_PREFILL_H */
