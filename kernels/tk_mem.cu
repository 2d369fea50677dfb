// tk_mem.cu — libtutti_kernels' error reporting, registered host memory
// and device memory calls (tutti_kernels.h).
#include "tutti_kernels.h"
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tk_internal.cuh"

// ---------------------------------------------------------------- errors

thread_local char g_err[512];

static tk_status vfail(tk_status code, const char *fmt, va_list ap) {
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  return code;
}

tk_status fail(tk_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tk_status s = vfail(code, fmt, ap);
  va_end(ap);
  return s;
}


extern "C" int32_t tk_last_error(char *buf, int32_t n) {
  if (!buf || n <= 0) return 0;
  snprintf(buf, (size_t)n, "%s", g_err);
  return (int32_t)strlen(buf);
}

extern "C" int32_t tk_abi_version(void) { return TK_ABI_VERSION; }

// ---------------------------------------------------------------- registered host memory

// Every host range the GPU may touch is in this table with its device alias, so
// a copy's source or destination is checked against it before launch.
struct Region { uint64_t addr, bytes, dptr; bool ours; };
static const int kMaxRegions = 256;
static Region g_regions[kMaxRegions];
static int g_nregions;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

// lookup returns the device alias of [addr, addr+bytes) if it lies in one registered region.
bool lookup(uint64_t addr, uint64_t bytes, uint64_t *dptr) {
  pthread_mutex_lock(&g_mu);
  bool ok = false;
  for (int i = 0; i < g_nregions; i++) {
    Region &r = g_regions[i];
    if (addr >= r.addr && bytes <= r.bytes && addr - r.addr <= r.bytes - bytes) {
      *dptr = r.dptr + (addr - r.addr);
      ok = true;
      break;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return ok;
}

tk_status region_add(uint64_t addr, uint64_t bytes, bool allow_existing) {
  uint64_t d;
  if (lookup(addr, bytes, &d)) return TK_OK;
  cudaError_t e = cudaHostRegister((void *)addr, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  bool ours = true;
  if (e == cudaErrorHostMemoryAlreadyRegistered && allow_existing) {
    cudaGetLastError();
    ours = false;
  } else if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(TK_ERR_CUDA, "cudaHostRegister(%#llx, %llu): %s", (unsigned long long)addr,
                (unsigned long long)bytes, cudaGetErrorString(e));
  }
  void *dp = nullptr;
  e = cudaHostGetDevicePointer(&dp, (void *)addr, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (ours) cudaHostUnregister((void *)addr);
    return fail(TK_ERR_CUDA, "cudaHostGetDevicePointer(%#llx): %s", (unsigned long long)addr,
                cudaGetErrorString(e));
  }
  pthread_mutex_lock(&g_mu);
  if (g_nregions == kMaxRegions) {
    pthread_mutex_unlock(&g_mu);
    if (ours) cudaHostUnregister((void *)addr);
    return fail(TK_ERR_INVALID, "more than %d registered host regions", kMaxRegions);
  }
  g_regions[g_nregions++] = Region{addr, bytes, (uint64_t)dp, ours};
  pthread_mutex_unlock(&g_mu);
  return TK_OK;
}

tk_status region_remove(uint64_t addr) {
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < g_nregions; i++) {
    if (g_regions[i].addr == addr) {
      Region r = g_regions[i];
      g_regions[i] = g_regions[--g_nregions];
      pthread_mutex_unlock(&g_mu);
      if (r.ours) CK(cudaHostUnregister((void *)addr));
      return TK_OK;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return fail(TK_ERR_INVALID, "host region %#llx is not registered", (unsigned long long)addr);
}

// ---------------------------------------------------------------- device and memory

extern "C" tk_status tk_init(int32_t device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    return fail(TK_ERR_NO_GPU, "no CUDA device: %s", e == cudaSuccess ? "count is 0" : cudaGetErrorString(e));
  }
  if (device < 0 || device >= n) return fail(TK_ERR_INVALID, "device %d of %d", device, n);
  CK(cudaSetDevice(device));
  // Host waits block in the driver instead of spinning, so CPU time measures work.
  // Refused once the context is active with other flags; the events that the
  // waits use are created with cudaEventBlockingSync either way.
  e = cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync | cudaDeviceMapHost);
  if (e != cudaSuccess) cudaGetLastError();
  CK(cudaFree(0));  // create the context now, not on the hot path
  return TK_OK;
}

extern "C" tk_status tk_device_name(int32_t device, char *buf, int32_t n, int32_t *sm_count) {
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, device));
  if (buf && n > 0) snprintf(buf, (size_t)n, "%s", p.name);
  if (sm_count) *sm_count = p.multiProcessorCount;
  return TK_OK;
}

extern "C" tk_status tk_dev_alloc(uint64_t bytes, uint64_t *dptr) {
  void *p = nullptr;
  CK(cudaMalloc(&p, bytes));
  *dptr = (uint64_t)p;
  return TK_OK;
}
// tk_dev_alloc_on allocates on a given device (and leaves it current on the
// calling thread), for processes that drive several GPUs.
extern "C" tk_status tk_dev_alloc_on(int32_t device, uint64_t bytes, uint64_t *dptr) {
  void *p = nullptr;
  CK(cudaSetDevice(device));
  CK(cudaMalloc(&p, bytes));
  *dptr = (uint64_t)p;
  return TK_OK;
}
extern "C" tk_status tk_dev_free(uint64_t dptr) { CK(cudaFree((void *)dptr)); return TK_OK; }
extern "C" tk_status tk_memcpy_htod(uint64_t d, uint64_t h, uint64_t n) {
  CK(cudaMemcpy((void *)d, (void *)h, n, cudaMemcpyHostToDevice));
  return TK_OK;
}
extern "C" tk_status tk_memcpy_dtoh(uint64_t h, uint64_t d, uint64_t n) {
  CK(cudaMemcpy((void *)h, (void *)d, n, cudaMemcpyDeviceToHost));
  return TK_OK;
}
extern "C" tk_status tk_memset_dev(uint64_t d, uint32_t v, uint64_t n) {
  CK(cudaMemset((void *)d, (int)(v & 0xff), n));
  CK(cudaDeviceSynchronize());
  return TK_OK;
}
extern "C" tk_status tk_host_register(uint64_t addr, uint64_t bytes) {
  if (!addr || !bytes) return fail(TK_ERR_INVALID, "tk_host_register: empty range");
  return region_add(addr, bytes, false);
}
extern "C" tk_status tk_host_unregister(uint64_t addr) { return region_remove(addr); }
