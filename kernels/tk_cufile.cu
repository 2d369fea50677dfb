// cuFile (GPUDirect Storage) batch reads for gpubench's path (c), part of the
// test kit (tk_testkit.h), loaded with
// dlopen so the library works where libcufile is absent. cufile.h only gives
// the types; every entry point comes from dlsym.
#include "tk_testkit.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


#if __has_include(<cufile.h>)
#include <cufile.h>

namespace {
// Signatures as documented for libcufile (GDS API reference).
struct CuFile {
  bool tried, ok;
  CUfileError_t (*driver_open)(void);
  CUfileError_t (*handle_register)(CUfileHandle_t *, CUfileDescr_t *);
  void (*handle_deregister)(CUfileHandle_t);
  CUfileError_t (*buf_register)(const void *, size_t, int);
  CUfileError_t (*buf_deregister)(const void *);
  CUfileError_t (*batch_setup)(CUfileBatchHandle_t *, unsigned);
  CUfileError_t (*batch_submit)(CUfileBatchHandle_t, unsigned, CUfileIOParams_t *, unsigned int);
  CUfileError_t (*batch_status)(CUfileBatchHandle_t, unsigned, unsigned *, CUfileIOEvents_t *, struct timespec *);
  void (*batch_destroy)(CUfileBatchHandle_t);
  bool driver_open_done;
};
CuFile g_cf;

tk_status load() {
  if (g_cf.tried) return g_cf.ok ? TK_OK : tk_fail_msg(TK_ERR_NOT_SUPPORTED, "libcufile not loadable");
  g_cf.tried = true;
  void *h = dlopen("libcufile.so.0", RTLD_NOW | RTLD_GLOBAL);
  if (!h) h = dlopen("libcufile.so", RTLD_NOW | RTLD_GLOBAL);
  if (!h) h = dlopen("/usr/local/cuda/lib64/libcufile.so.0", RTLD_NOW | RTLD_GLOBAL);
  if (!h) return tk_fail_msg(TK_ERR_NOT_SUPPORTED, "dlopen libcufile: %s", dlerror());
#define SYM(field, name)                                                        \
  *(void **)&g_cf.field = dlsym(h, name);                                      \
  if (!g_cf.field) return tk_fail_msg(TK_ERR_NOT_SUPPORTED, "libcufile lacks %s", name);
  SYM(driver_open, "cuFileDriverOpen");
  SYM(handle_register, "cuFileHandleRegister");
  SYM(handle_deregister, "cuFileHandleDeregister");
  SYM(buf_register, "cuFileBufRegister");
  SYM(buf_deregister, "cuFileBufDeregister");
  SYM(batch_setup, "cuFileBatchIOSetUp");
  SYM(batch_submit, "cuFileBatchIOSubmit");
  SYM(batch_status, "cuFileBatchIOGetStatus");
  SYM(batch_destroy, "cuFileBatchIODestroy");
#undef SYM
  g_cf.ok = true;
  return TK_OK;
}

tk_status open_driver() {
  tk_status s = load();
  if (s) return s;
  if (g_cf.driver_open_done) return TK_OK;
  CUfileError_t e = g_cf.driver_open();
  if (e.err != CU_FILE_SUCCESS) return tk_fail_msg(TK_ERR_NOT_SUPPORTED, "cuFileDriverOpen: error %d (%s)", (int)e.err, CUFILE_ERRSTR(e.err));
  g_cf.driver_open_done = true;
  return TK_OK;
}

tk_status open_handle(const char *path, int *fd, CUfileHandle_t *fh, int32_t *cerr) {
  *fd = open(path, O_RDONLY | O_DIRECT);
  if (*fd < 0) return tk_fail_msg(TK_ERR_INVALID, "open %s O_DIRECT: %s", path, strerror(errno));
  CUfileDescr_t d;
  memset(&d, 0, sizeof d);
  d.handle.fd = *fd;
  d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
  CUfileError_t e = g_cf.handle_register(fh, &d);
  if (e.err != CU_FILE_SUCCESS) {
    if (cerr) *cerr = (int32_t)e.err;
    close(*fd);
    return tk_fail_msg(TK_ERR_NOT_SUPPORTED, "cuFileHandleRegister(%s): error %d (%s)", path, (int)e.err, CUFILE_ERRSTR(e.err));
  }
  return TK_OK;
}
}  // namespace

extern "C" tk_status tk_cufile_probe(const char *path, int32_t *cufile_err) {
  if (cufile_err) *cufile_err = 0;
  tk_status s = open_driver();
  if (s) return s;
  int fd;
  CUfileHandle_t fh;
  s = open_handle(path, &fd, &fh, cufile_err);
  if (s) return s;
  g_cf.handle_deregister(fh);
  close(fd);
  return TK_OK;
}

extern "C" tk_status tk_cufile_batch_read(const char *path, const uint64_t *file_off, const uint64_t *dst_off,
                                          const uint32_t *len, uint32_t n, uint64_t dptr, uint64_t dbytes) {
  for (uint32_t i = 0; i < n; i++)
    if (dst_off[i] + len[i] > dbytes) return tk_fail_msg(TK_ERR_INVALID, "cuFile read %u leaves the device buffer", i);
  tk_status s = open_driver();
  if (s) return s;
  int fd;
  CUfileHandle_t fh;
  int32_t cerr = 0;
  if ((s = open_handle(path, &fd, &fh, &cerr))) return s;
  CUfileError_t e = g_cf.buf_register((void *)dptr, dbytes, 0);
  if (e.err != CU_FILE_SUCCESS) {
    g_cf.handle_deregister(fh);
    close(fd);
    return tk_fail_msg(TK_ERR_NOT_SUPPORTED, "cuFileBufRegister: error %d (%s)", (int)e.err, CUFILE_ERRSTR(e.err));
  }
  const uint32_t kBatch = 128;  // cuFile's default max_batch_io_size
  CUfileBatchHandle_t b;
  CUfileIOParams_t params[kBatch];
  CUfileIOEvents_t ev[kBatch];
  e = g_cf.batch_setup(&b, kBatch);
  if (e.err == CU_FILE_SUCCESS) {
    for (uint32_t base = 0; base < n && s == TK_OK; base += kBatch) {
      const uint32_t m = n - base < kBatch ? n - base : kBatch;
      for (uint32_t i = 0; i < m; i++) {
        memset(&params[i], 0, sizeof params[i]);
        params[i].mode = CUFILE_BATCH;
        params[i].fh = fh;
        params[i].opcode = CUFILE_READ;
        params[i].cookie = (void *)(uintptr_t)(base + i);
        params[i].u.batch.devPtr_base = (void *)dptr;
        params[i].u.batch.devPtr_offset = (off_t)dst_off[base + i];
        params[i].u.batch.file_offset = (off_t)file_off[base + i];
        params[i].u.batch.size = len[base + i];
      }
      e = g_cf.batch_submit(b, m, params, 0);
      if (e.err != CU_FILE_SUCCESS) {
        s = tk_fail_msg(TK_ERR_IO, "cuFileBatchIOSubmit: error %d (%s)", (int)e.err, CUFILE_ERRSTR(e.err));
        break;
      }
      uint32_t got = 0;
      for (int polls = 0; got < m && polls < 1000000; polls++) {
        unsigned nr = kBatch;
        struct timespec to = {1, 0};
        e = g_cf.batch_status(b, 1, &nr, ev, &to);
        if (e.err != CU_FILE_SUCCESS) {
          s = tk_fail_msg(TK_ERR_IO, "cuFileBatchIOGetStatus: error %d", (int)e.err);
          break;
        }
        for (unsigned i = 0; i < nr; i++) {
          const uint32_t k = (uint32_t)(uintptr_t)ev[i].cookie;
          if (ev[i].status != CUFILE_COMPLETE || ev[i].ret != len[k])
            s = tk_fail_msg(TK_ERR_IO, "cuFile read %u: status %d ret %zu", k, (int)ev[i].status, ev[i].ret);
        }
        got += nr;
      }
      if (got < m && s == TK_OK) s = tk_fail_msg(TK_ERR_IO, "cuFile batch: %u of %u completed", got, m);
    }
    g_cf.batch_destroy(b);
  } else {
    s = tk_fail_msg(TK_ERR_NOT_SUPPORTED, "cuFileBatchIOSetUp: error %d (%s)", (int)e.err, CUFILE_ERRSTR(e.err));
  }
  g_cf.buf_deregister((void *)dptr);
  g_cf.handle_deregister(fh);
  close(fd);
  return s;
}

#else  // no cufile.h where this was built

extern "C" tk_status tk_cufile_probe(const char *, int32_t *cufile_err) {
  if (cufile_err) *cufile_err = 0;
  return tk_fail_msg(TK_ERR_NOT_SUPPORTED, "built without cufile.h");
}
extern "C" tk_status tk_cufile_batch_read(const char *, const uint64_t *, const uint64_t *, const uint32_t *, uint32_t,
                                          uint64_t, uint64_t) {
  return tk_fail_msg(TK_ERR_NOT_SUPPORTED, "built without cufile.h");
}
#endif
