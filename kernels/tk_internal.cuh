// tk_internal.cuh — what the product library's .cu files share on the host:
// the error slot and fail(), the CK check, the registered host memory table.
// Hidden, so the library exports only tutti_kernels.h's functions.
#ifndef TK_INTERNAL_CUH
#define TK_INTERNAL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "tutti_kernels.h"

#define TK_HIDDEN __attribute__((visibility("hidden")))

// g_err is the calling thread's last error message (tk_last_error).
extern thread_local char g_err[512] TK_HIDDEN;

// fail formats the thread's error message and returns code.
TK_HIDDEN tk_status fail(tk_status code, const char *fmt, ...);

// lookup finds the device alias of registered host memory [addr, addr+bytes).
TK_HIDDEN bool lookup(uint64_t addr, uint64_t bytes, uint64_t *dptr);
TK_HIDDEN tk_status region_add(uint64_t addr, uint64_t bytes, bool allow_existing);
TK_HIDDEN tk_status region_remove(uint64_t addr);

#define CK(call)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      cudaGetLastError();                                                                 \
      return fail(e_ == cudaErrorNoDevice || e_ == cudaErrorInsufficientDriver            \
                      ? TK_ERR_NO_GPU : TK_ERR_CUDA,                                      \
                  "%s: %s (%d) at %s:%d", #call, cudaGetErrorString(e_), (int)e_,         \
                  __FILE__, __LINE__);                                                    \
    }                                                                                     \
  } while (0)

#endif  // TK_INTERNAL_CUH
