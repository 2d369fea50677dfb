/* tk_crc.h — CRC32C (Castagnoli, reflected polynomial 0x82F63B78: objmap's
 * chunk CRCs, Go's crc32.Update(0, castagnoli, b)) of one page plane, cut
 * into segments that threads checksum at once and then combine. Plain C, so
 * that a host test compiles it with gcc and holds a block's work, thread by
 * thread, to hash/crc32; under nvcc the same functions run on the device
 * (tk_crc_kernel.cu).
 *
 * The algebra (zlib's crc32_combine): raw(c, M) is the table loop from
 * register c over M, with no inversions, so CRC32C(M) = ~raw(~0, M). It is
 * linear: raw(c, A||B) = shift(raw(c, A), |B|) ^ raw(0, B), where shift(c, n)
 * multiplies c by x^(8n) mod P. Segment t of a plane, raw(0, seg_t), is
 * shifted by the bytes after it and the results are XORed (order-free);
 * shift(~0, plane bytes) adds the initial register. */
#ifndef TK_CRC_H
#define TK_CRC_H

#include <stdint.h>

#ifdef __CUDACC__
#define TK_CRC_HD __host__ __device__
#else
#define TK_CRC_HD
#endif

#define TK_CRC_POLY 0x82F63B78u
/* Threads of a plane's CRC: at most this many segments. */
#define TK_CRC_THREADS 256

/* A plane size's segmentation and constants, made once per bind. */
typedef struct {
  uint32_t plane_bytes;
  uint32_t seg;   /* bytes per segment: a multiple of 16 */
  uint32_t segs;  /* segments: ceil(plane_bytes / seg) <= TK_CRC_THREADS */
  uint32_t init;  /* shift(0xFFFFFFFF, plane_bytes) */
  /* shift[t]: x^(8 * bytes after segment t) mod P, for t < segs */
  uint32_t shift[TK_CRC_THREADS];
} tk_crc_plan;

/* a*b mod P, both reflected (bit 31 is x^0). */
static inline TK_CRC_HD uint32_t tk_crc_mul(uint32_t a, uint32_t b) {
  uint32_t p = 0;
  for (int i = 0; i < 32; i++) {
    if (a & (0x80000000u >> i)) p ^= b;
    b = (b & 1) ? (b >> 1) ^ TK_CRC_POLY : b >> 1;
  }
  return p;
}

/* x^(8n) mod P: shifting a register over n zero bytes. */
static inline TK_CRC_HD uint32_t tk_crc_x8n(uint64_t n) {
  uint32_t r = 0x80000000u, sq = 0x80000000u >> 8; /* x^0, x^8 */
  for (; n; n >>= 1) {
    if (n & 1) r = tk_crc_mul(sq, r);
    sq = tk_crc_mul(sq, sq);
  }
  return r;
}

/* Entry i of the byte-at-a-time table. */
static inline TK_CRC_HD uint32_t tk_crc_table_entry(uint32_t i) {
  uint32_t c = i;
  for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ TK_CRC_POLY : c >> 1;
  return c;
}

/* raw(c, w): the table loop over the four bytes of little-endian word w. */
static inline TK_CRC_HD uint32_t tk_crc_word(const uint32_t *table, uint32_t c, uint32_t w) {
  for (int k = 0; k < 4; k++, w >>= 8) c = table[(c ^ w) & 0xff] ^ (c >> 8);
  return c;
}

/* tk_crc_plan_make fills plan for planes of plane_bytes (a positive multiple
 * of 16, at most 1 GiB); -1 otherwise. */
static inline int tk_crc_plan_make(tk_crc_plan *plan, uint64_t plane_bytes) {
  if (!plane_bytes || plane_bytes % 16 || plane_bytes > (1u << 30)) return -1;
  const uint64_t per = (plane_bytes + TK_CRC_THREADS - 1) / TK_CRC_THREADS;
  plan->plane_bytes = (uint32_t)plane_bytes;
  plan->seg = (uint32_t)((per + 15) / 16 * 16);
  plan->segs = (uint32_t)((plane_bytes + plan->seg - 1) / plan->seg);
  plan->init = tk_crc_mul(tk_crc_x8n(plane_bytes), 0xFFFFFFFFu);
  for (uint32_t t = 0; t < TK_CRC_THREADS; t++) {
    const uint64_t end = (uint64_t)(t + 1) * plan->seg;
    plan->shift[t] = t < plan->segs ? tk_crc_x8n(end < plane_bytes ? plane_bytes - end : 0) : 0;
  }
  return 0;
}

/* tk_crc_segment is thread t's share of a plane at src (4-byte aligned):
 * raw(0, its segment) shifted by the bytes after it; 0 for t >= segs. The
 * XOR of every thread's share is tk_crc_finish's x. */
static inline TK_CRC_HD uint32_t tk_crc_segment(const tk_crc_plan *plan, const uint32_t *table, const char *src,
                                                uint32_t t) {
  if (t >= plan->segs) return 0;
  const uint32_t off = t * plan->seg;
  const uint32_t len = plan->plane_bytes - off < plan->seg ? plan->plane_bytes - off : plan->seg;
  const uint32_t *w = (const uint32_t *)(src + off);
  uint32_t c = 0;
  for (uint32_t i = 0; i < len / 4; i++) c = tk_crc_word(table, c, w[i]);
  return tk_crc_mul(plan->shift[t], c);
}

/* The plane's CRC32C from the XOR x of every segment's share. */
static inline TK_CRC_HD uint32_t tk_crc_finish(const tk_crc_plan *plan, uint32_t x) { return ~(x ^ plan->init); }

#endif /* TK_CRC_H */
