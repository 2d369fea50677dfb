#define _GNU_SOURCE
// selftest: drives libtutti_kernels through its C ABI with an SQPOLL io_uring
// set up here (as package uring does), on the GPU machine. It checks, bit for
// bit, GPU-driven restores into both KV layouts with a ring smaller than the
// request (wrap-around, SQ-full back-pressure), and per-entry errors for a read
// past the end of the file and a bad descriptor. Exit status 0 = all passed.
// Build: gcc -O2 -o selftest selftest.c -ldl -lpthread (dlopens the library
// under test and the test kit's, for fill and verify).
// Usage: selftest [libtutti_kernels.so [dir [libtutti_testkit.so]]].
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../tutti_kernels.h"
#include "../tk_testkit.h"
#include "../tk_crc.h"

#define F(name) static __typeof__(&name) p_##name
F(tk_abi_version); F(tk_init); F(tk_last_error); F(tk_dev_alloc); F(tk_dev_free); F(tk_bind); F(tk_unbind);
F(tk_restore_submit); F(tk_restore_wait); F(tk_restore_release); F(tkt_kv_fill); F(tkt_kv_verify);
F(tkt_abi_version);
F(tk_host_map); F(tk_scatter_host); F(tk_sync); F(tk_host_register); F(tk_host_unregister); F(tk_gather_host);
F(tk_restore_wait_layer); F(tk_gather_lane);
#undef F

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)
static void tkerr(const char *what, int s) { char b[512]; p_tk_last_error(b, sizeof b); printf("  %s -> %d: %s\n", what, s, b); }

// internal/kvdata's generator (one page per chain block, block = seed + page).
static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; z = (z ^ (z >> 27)) * 0x94d049bb133111ebull; return z ^ (z >> 31);
}
static uint64_t kvword(uint64_t block, unsigned layer, unsigned plane, uint64_t w) {
  uint64_t s = mix(block ^ 0x7475747469ull);
  s = mix(s ^ ((uint64_t)layer << 32) ^ plane);
  s = mix(s ^ 0);
  return mix(s + (w + 1) * 0x9e3779b97f4a7c15ull);
}

// ---- ring
static struct io_uring_params P;
static int ring_fd;
static char *sq, *cq, *sqes;
static size_t sqsz, cqsz, sqesz;
static atomic_int stop_waker;
static atomic_long wakes;

static void *waker(void *arg) {
  (void)arg;
  unsigned *flags = (unsigned *)(sq + P.sq_off.flags);
  while (!atomic_load(&stop_waker)) {
    if (__atomic_load_n(flags, __ATOMIC_ACQUIRE) & IORING_SQ_NEED_WAKEUP) {
      syscall(__NR_io_uring_enter, ring_fd, 0, 0, IORING_ENTER_SQ_WAKEUP, NULL, 0);
      atomic_fetch_add(&wakes, 1);
    }
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static int setup_ring(unsigned entries) {
  memset(&P, 0, sizeof P);
  P.flags = IORING_SETUP_SQPOLL;
  P.sq_thread_idle = 10;
  ring_fd = (int)syscall(__NR_io_uring_setup, entries, &P);
  if (ring_fd < 0) { perror("io_uring_setup"); return -1; }
  sqsz = P.sq_off.array + P.sq_entries * sizeof(unsigned);
  cqsz = P.cq_off.cqes + P.cq_entries * sizeof(struct io_uring_cqe);
  if (P.features & IORING_FEAT_SINGLE_MMAP) { if (cqsz > sqsz) sqsz = cqsz; cqsz = sqsz; }
  sq = mmap(0, sqsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_SQ_RING);
  cq = (P.features & IORING_FEAT_SINGLE_MMAP) ? sq : mmap(0, cqsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_CQ_RING);
  sqesz = P.sq_entries * sizeof(struct io_uring_sqe);
  sqes = mmap(0, sqesz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_SQES);
  if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED) { perror("mmap ring"); return -1; }
  return 0;
}

static void ring_desc(tk_ring *r) {
  memset(r, 0, sizeof *r);
  r->sq_head = (uint64_t)(sq + P.sq_off.head); r->sq_tail = (uint64_t)(sq + P.sq_off.tail);
  r->sq_mask = (uint64_t)(sq + P.sq_off.ring_mask); r->sq_flags = (uint64_t)(sq + P.sq_off.flags);
  r->sq_array = (uint64_t)(sq + P.sq_off.array); r->sqes = (uint64_t)sqes;
  r->cq_head = (uint64_t)(cq + P.cq_off.head); r->cq_tail = (uint64_t)(cq + P.cq_off.tail);
  r->cq_mask = (uint64_t)(cq + P.cq_off.ring_mask); r->cqes = (uint64_t)(cq + P.cq_off.cqes);
  r->sq_entries = P.sq_entries; r->cq_entries = P.cq_entries; r->sqe_bytes = 64; r->cqe_bytes = 16; r->ring_fd = ring_fd;
  // mmap'd ring memory is page aligned; register whole mappings.
  r->region_addr[r->n_regions] = (uint64_t)sq; r->region_bytes[r->n_regions++] = (sqsz + 4095) & ~4095ul;
  if (cq != sq) { r->region_addr[r->n_regions] = (uint64_t)cq; r->region_bytes[r->n_regions++] = (cqsz + 4095) & ~4095ul; }
  r->region_addr[r->n_regions] = (uint64_t)sqes; r->region_bytes[r->n_regions++] = (sqesz + 4095) & ~4095ul;
}

// ---- the test object file: layer l's object at l*obj_bytes, page i (src) at i*page_bytes.
typedef struct { unsigned layers, planes, tokens, heads, dim; } Shape;

static int write_file(const char *path, Shape s, unsigned pages, uint64_t seed, uint64_t *obj_bytes) {
  const uint64_t plane = (uint64_t)s.tokens * s.heads * s.dim * 2, page = plane * s.planes;
  const uint64_t obj = (pages * page + 4095) & ~4095ull;
  *obj_bytes = obj;
  uint64_t *buf = calloc(1, obj);
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) { perror(path); return -1; }
  for (unsigned l = 0; l < s.layers; l++) {
    for (unsigned i = 0; i < pages; i++)
      for (uint64_t w = 0; w < page / 8; w++)
        buf[(i * page) / 8 + w] = kvword(seed + i, l, (unsigned)(w / (plane / 8)), w % (plane / 8));
    if (pwrite(fd, buf, obj, (off_t)(l * obj)) != (ssize_t)obj) { perror("pwrite"); return -1; }
  }
  fsync(fd);
  close(fd);
  free(buf);
  return 0;
}

// run one restore case; returns entries that failed.
static int restore_case(const char *name, Shape s, unsigned layout, unsigned pages, unsigned max_io, const char *path,
                        uint64_t seed, int corrupt) {
  printf("case %s: layers=%u planes=%u pages=%u layout=%u max_io=%u\n", name, s.layers, s.planes, pages, layout, max_io);
  const uint64_t plane = (uint64_t)s.tokens * s.heads * s.dim * 2, page = plane * s.planes;
  uint64_t obj = (pages * page + 4095) & ~4095ull;
  const unsigned num_pages = pages * 2 + 3;
  tk_bind_params bp;
  memset(&bp, 0, sizeof bp);
  bp.abi_version = TK_ABI_VERSION;
  bp.kv.layers = s.layers; bp.kv.planes = s.planes; bp.kv.page_tokens = s.tokens; bp.kv.kv_heads = s.heads;
  bp.kv.head_dim = s.dim; bp.kv.dtype_bytes = 2; bp.kv.layout = layout; bp.kv.num_pages = num_pages;
  uint64_t per_layer = page * num_pages;
  int st;
  if (layout == TK_LAYOUT_PER_LAYER) {
    for (unsigned l = 0; l < s.layers; l++) if ((st = p_tk_dev_alloc(per_layer, &bp.kv.kv_ptrs[l]))) { tkerr("dev_alloc", st); return -1; }
  } else if ((st = p_tk_dev_alloc(per_layer * s.layers, &bp.kv.kv_ptrs[0]))) { tkerr("dev_alloc", st); return -1; }
  const unsigned slots = 4;
  bp.staging_slots = slots;
  bp.staging_bytes = obj * slots;
  void *staging = mmap(0, bp.staging_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  bp.staging_addr = (uint64_t)staging;
  bp.max_pages = pages;
  unsigned epl = (unsigned)((obj + max_io - 1) / max_io);
  bp.max_entries = epl;
  bp.max_requests = 2;
  bp.io_window = 48;
  bp.lookahead = 1;
  bp.poll_timeout_ns = 3000000000ull;
  tk_ring r;
  ring_desc(&r);
  bp.ring = &r;
  uint64_t ctx;
  if ((st = p_tk_bind(&bp, &ctx))) { tkerr("bind", st); failures++; return -1; }
  p_tkt_kv_fill(&bp.kv, 0, 0xA5);
  int fd = open(path, O_RDONLY | O_DIRECT);
  tk_io_entry *en = calloc((size_t)s.layers * epl, sizeof *en);
  for (unsigned l = 0; l < s.layers; l++)
    for (unsigned e = 0; e < epl; e++) {
      tk_io_entry *x = &en[l * epl + e];
      x->fd = fd; x->offset = l * obj + (uint64_t)e * max_io;
      uint64_t len = obj - (uint64_t)e * max_io; x->len = (uint32_t)(len < max_io ? len : max_io);
      x->slot_off = e * max_io; x->min_len = x->len;
    }
  unsigned bad_layer = s.layers / 2;
  if (corrupt == 1) en[bad_layer * epl].offset = 1ull << 40;  // past the end of the file: short (0 bytes)
  if (corrupt == 2) en[bad_layer * epl + epl - 1].fd = 999;   // not an open descriptor: EBADF
  tk_page_map *pm = calloc(pages, sizeof *pm);
  for (unsigned i = 0; i < pages; i++) {
    pm[i].dst_page = (i * 7 + 1) % num_pages;  // a scattered block table
    pm[i].slot_off = (uint32_t)(i * page);
    pm[i].first_entry = (uint32_t)(i * page / max_io);
    pm[i].last_entry = (uint32_t)(((i + 1) * page - 1) / max_io);
  }
  // a descriptor that points outside the KV tensors must be refused before launch
  if (corrupt == 0) {
    tk_page_map saved = pm[0];
    pm[0].dst_page = num_pages;
    tk_restore_params rp0 = {pages, pm, 0, s.layers, epl, en};
    uint32_t rq0;
    st = p_tk_restore_submit(ctx, &rp0, &rq0);
    CHECK(st == TK_ERR_INVALID, "out-of-range page accepted: %d", st);
    pm[0] = saved;
  }
  tk_restore_params rp = {pages, pm, 0, s.layers, epl, en};
  uint32_t req;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if ((st = p_tk_restore_submit(ctx, &rp, &req))) { tkerr("submit", st); failures++; return -1; }
  tk_entry_result *res = calloc((size_t)s.layers * epl, sizeof *res);
  float *lms = calloc(s.layers, sizeof(float));
  st = p_tk_restore_wait(ctx, req, res, s.layers * epl, lms, s.layers);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  if (st) tkerr("wait", st);
  int failed = 0;
  for (unsigned e = 0; e < s.layers * epl; e++) if (res[e].status != TK_ENTRY_OK) {
    failed++;
    if (failed <= 3) printf("  entry %u (layer %u): status %u res %d\n", e, e / epl, res[e].status, res[e].res);
  }
  p_tk_restore_release(ctx, req);
  uint64_t mism = 0, mism_bad = 0;
  if (corrupt) {
    // every layer except the bad one must verify; the bad one's affected pages stay poisoned
    if (bad_layer > 0) { p_tkt_kv_verify(&bp.kv, 0, seed, pm, pages, 0, bad_layer, &mism); }
    uint64_t m2 = 0;
    if (bad_layer + 1 < s.layers) p_tkt_kv_verify(&bp.kv, 0, seed, pm, pages, bad_layer + 1, s.layers - bad_layer - 1, &m2);
    mism += m2;
    p_tkt_kv_verify(&bp.kv, 0, seed, pm, pages, bad_layer, 1, &mism_bad);
  } else {
    st = p_tkt_kv_verify(&bp.kv, 0, seed, pm, pages, 0, s.layers, &mism);
    if (st) tkerr("verify", st);
  }
  printf("  %.1f MB in %.3f s = %.1f MB/s, failed entries %d, mismatched words %llu (bad layer %llu), layer0 %.2f ms last %.2f ms\n",
         (double)obj * s.layers / 1e6, secs, (double)obj * s.layers / 1e6 / secs, failed, (unsigned long long)mism,
         (unsigned long long)mism_bad, lms[0], lms[s.layers - 1]);
  if (corrupt == 0) {
    CHECK(st == TK_OK && failed == 0 && mism == 0, "%s: clean restore failed", name);
    // gather round trip: KV -> host, compare with the file's bytes
    void *g = mmap(0, obj, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    CHECK(p_tk_host_register((uint64_t)g, obj) == 0, "register gather buffer");
    CHECK(p_tk_host_map(ctx, pm, pages) == 0, "host map");
    CHECK(p_tk_gather_host(ctx, 1, (uint64_t)g, obj) == 0, "gather");
    CHECK(p_tk_sync(ctx) == 0, "sync");
    uint64_t gbad = 0;
    for (uint64_t w = 0; w < pages * page / 8; w++) {
      uint64_t i = (w * 8) / page, ww = w - i * page / 8;
      if (((uint64_t *)g)[w] != kvword(seed + i, 1, (unsigned)(ww / (plane / 8)), ww % (plane / 8))) gbad++;
    }
    CHECK(gbad == 0, "gather mismatched %llu words", (unsigned long long)gbad);
    p_tk_host_unregister((uint64_t)g);
    munmap(g, obj);
    // the same through a gather lane (the last one), layers 1 and 2 at once
    void *g2 = mmap(0, 2 * obj, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    CHECK(p_tk_host_register((uint64_t)g2, 2 * obj) == 0, "register lane gather buffer");
    const unsigned planes = (unsigned)(page / plane);
    uint32_t *crcs = calloc((size_t)2 * pages * planes, sizeof(uint32_t));
    st = p_tk_gather_lane(ctx, TK_GATHER_LANES - 1, pm, pages, 1, 2, (uint64_t)g2, obj, crcs, 0);
    if (st) tkerr("gather lane", st);
    CHECK(st == TK_OK, "gather lane");
    CHECK(p_tk_gather_lane(ctx, TK_GATHER_LANES, pm, pages, 1, 1, (uint64_t)g2, obj, NULL, 0) == TK_ERR_INVALID,
          "gather on a lane past the last accepted");
    // the lane's plane CRCs against a bitwise CRC32C of the gathered bytes
    uint64_t cbad = 0;
    for (unsigned l = 0; l < 2; l++)
      for (uint64_t i = 0; i < pages; i++)
        for (unsigned p = 0; p < planes; p++) {
          const unsigned char *b = (const unsigned char *)g2 + l * obj + pm[i].slot_off + (uint64_t)p * plane;
          uint32_t c = 0xFFFFFFFFu;
          for (uint64_t k = 0; k < plane; k++) {
            c ^= b[k];
            for (int j = 0; j < 8; j++) c = (c & 1) ? (c >> 1) ^ TK_CRC_POLY : c >> 1;
          }
          if (~c != crcs[(l * pages + i) * planes + p]) cbad++;
        }
    CHECK(cbad == 0, "gather lane: %llu of %llu plane CRCs differ from the gathered bytes'", (unsigned long long)cbad,
          (unsigned long long)(2 * pages * planes));
    free(crcs);
    gbad = 0;
    for (unsigned l = 0; l < 2; l++)
      for (uint64_t w = 0; w < pages * page / 8; w++) {
        uint64_t i = (w * 8) / page, ww = w - i * page / 8;
        if (((uint64_t *)((char *)g2 + l * obj))[w] != kvword(seed + i, 1 + l, (unsigned)(ww / (plane / 8)), ww % (plane / 8))) gbad++;
      }
    CHECK(gbad == 0, "lane gather mismatched %llu words", (unsigned long long)gbad);
    p_tk_host_unregister((uint64_t)g2);
    munmap(g2, 2 * obj);
  } else {
    CHECK(failed >= 1, "%s: the bad entry did not fail", name);
    CHECK(st == TK_ERR_IO, "%s: wait returned %d, want TK_ERR_IO", name, st);
    CHECK(mism == 0, "%s: good layers mismatched %llu words", name, (unsigned long long)mism);
    CHECK(mism_bad > 0, "%s: pages of the failed entry were scattered", name);
    // poisoned words are 0xA5A5..: all mismatches in the bad layer must be poison, never other data
  }
  close(fd);
  p_tk_unbind(ctx);
  if (layout == TK_LAYOUT_PER_LAYER) { for (unsigned l = 0; l < s.layers; l++) p_tk_dev_free(bp.kv.kv_ptrs[l]); }
  else p_tk_dev_free(bp.kv.kv_ptrs[0]);
  munmap(staging, bp.staging_bytes);
  free(en); free(pm); free(res); free(lms);
  return failed;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  const char *lib = argc > 1 ? argv[1] : "kernels/build/libtutti_kernels.so";
  const char *dir = argc > 2 ? argv[2] : "/tmp";
  const char *testkit = argc > 3 ? argv[3] : "kernels/build/libtutti_testkit.so";
  void *h = dlopen(lib, RTLD_NOW);
  if (!h) { printf("dlopen %s: %s\n", lib, dlerror()); return 2; }
  void *tk = dlopen(testkit, RTLD_NOW);
  if (!tk) { printf("dlopen %s: %s\n", testkit, dlerror()); return 2; }
#define L(name) if (!(p_##name = (__typeof__(p_##name))dlsym(h, #name))) { printf("missing %s\n", #name); return 2; }
#define LT(name) if (!(p_##name = (__typeof__(p_##name))dlsym(tk, #name))) { printf("missing %s in %s\n", #name, testkit); return 2; }
  L(tk_abi_version); L(tk_init); L(tk_last_error); L(tk_dev_alloc); L(tk_dev_free); L(tk_bind); L(tk_unbind);
  L(tk_restore_submit); L(tk_restore_wait); L(tk_restore_release); LT(tkt_kv_fill); LT(tkt_kv_verify); LT(tkt_abi_version);
  L(tk_host_map); L(tk_scatter_host); L(tk_sync); L(tk_host_register); L(tk_host_unregister); L(tk_gather_host);
  L(tk_restore_wait_layer); L(tk_gather_lane);
  if (p_tk_abi_version() != TK_ABI_VERSION) { printf("abi %d != %d\n", p_tk_abi_version(), TK_ABI_VERSION); return 2; }
  if (p_tkt_abi_version() != TK_ABI_VERSION) { printf("testkit abi %d != %d\n", p_tkt_abi_version(), TK_ABI_VERSION); return 2; }
  int st = p_tk_init(0);
  if (st) { tkerr("init", st); return 2; }
  if (setup_ring(64)) return 2;  // small on purpose: requests are far larger than the ring
  pthread_t w;
  pthread_create(&w, NULL, waker, NULL);
  char path[512];
  snprintf(path, sizeof path, "%s/tk_selftest.dat", dir);
  Shape gqa = {12, 2, 16, 8, 128}, mla = {9, 1, 16, 1, 576};
  const unsigned pages = 40;
  uint64_t obj;
  if (write_file(path, gqa, pages, 42, &obj)) return 2;
  restore_case("gqa-per-layer", gqa, TK_LAYOUT_PER_LAYER, pages, 128 << 10, path, 42, 0);
  restore_case("gqa-cross-layer", gqa, TK_LAYOUT_CROSS_LAYER, pages, 256 << 10, path, 42, 0);
  restore_case("gqa-past-eof", gqa, TK_LAYOUT_PER_LAYER, pages, 128 << 10, path, 42, 1);
  restore_case("gqa-bad-fd", gqa, TK_LAYOUT_PER_LAYER, pages, 128 << 10, path, 42, 2);
  restore_case("gqa-after-faults", gqa, TK_LAYOUT_PER_LAYER, pages, 64 << 10, path, 42, 0);
  if (write_file(path, mla, pages, 7, &obj)) return 2;
  restore_case("mla-per-layer", mla, TK_LAYOUT_PER_LAYER, pages, 64 << 10, path, 7, 0);
  atomic_store(&stop_waker, 1);
  pthread_join(w, NULL);
  // Diagnostic, not counted: a 256-entry ring whose kernel-allocated rings
  // span several pages (package uring uses NO_MMAP memory for GPU rings).
  if (setup_ring(256) == 0) {
    atomic_store(&stop_waker, 0);
    pthread_create(&w, NULL, waker, NULL);
    int before = failures;
    restore_case("diagnostic-mmap-ring-256", mla, TK_LAYOUT_PER_LAYER, pages, 64 << 10, path, 7, 0);
    printf("diagnostic: multi-page mmap'd ring %s\n", failures == before ? "works" : "FAILS (GPU does not see the kernel's ring pages)");
    failures = before;
    atomic_store(&stop_waker, 1);
    pthread_join(w, NULL);
  }
  unlink(path);
  printf("selftest: %s (%d failures, %ld wake-ups)\n", failures ? "FAIL" : "PASS", failures, atomic_load(&wakes));
  return failures ? 1 : 0;
}
