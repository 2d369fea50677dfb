// tk_ring_kernel.cu — the GPU side of the GPU-driven io_uring: the kernel
// that writes a layer's SQEs, publishes the SQ tail and reaps the CQ.
#include "tk_ctx.cuh"

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// A plain load after another thread's acquire and a barrier could be served
// from a stale L1 line of the previous lap of the CQ ring: read it strong.
__device__ __forceinline__ unsigned long long ld_relaxed_sys_u64(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

enum { OP_READ = 22, OP_WRITE = 23, OP_READ_FIXED = 4, OP_WRITE_FIXED = 5 };

// One launch per layer, one block. Submits entries of layers [0, layer+lookahead]
// of the request as SQ space and the window allow, reaps CQEs into per-entry
// results, and returns once every entry of `layer` completed (or timed out).
// Kernels of one context run in order on one stream, so only one touches the ring.
__global__ void io_layer_kernel(DRing r, DState *st, DReq q, uint32_t layer, uint32_t lookahead,
                                uint32_t window, uint64_t timeout_ns) {
  __shared__ uint32_t s_tail, s_n, s_cursor, s_stop, s_head, s_ctail, s_ours, s_stray;
  const uint32_t total_end = min(q.n_layers, layer + 1 + lookahead) * q.epl;
  const uint32_t need_end = (layer + 1) * q.epl;
  if (threadIdx.x == 0) s_stop = 0;
  __syncthreads();
  if (st->broken) {
    // An earlier timeout left I/O in flight: nothing is submitted, nothing is scattered.
    for (uint32_t e = threadIdx.x + layer * q.epl; e < need_end; e += blockDim.x)
      if (q.results[e].status == TK_ENTRY_PENDING) q.results[e].status = TK_ENTRY_SKIPPED;
    if (threadIdx.x == 0) { q.done[layer] = q.epl; *q.cursor = max(*q.cursor, need_end); }
    return;
  }
  uint64_t last_progress = globaltimer_ns();
  for (;;) {
    if (threadIdx.x == 0) {
      uint32_t cur = *q.cursor;
      uint32_t tail = st->sq_tail;
      uint32_t head = ld_acquire_sys(r.sq_head);
      uint32_t sq_free = r.sq_entries - (tail - head);
      uint32_t room = window > st->inflight ? window - st->inflight : 0;
      uint32_t n = total_end > cur ? total_end - cur : 0;
      n = min(n, min(room, sq_free));
      s_tail = tail;
      s_n = n;
      s_cursor = cur;
    }
    __syncthreads();
    const uint32_t n = s_n;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t e = s_cursor + i;
      const tk_io_entry en = q.entries[e];
      const uint32_t l = e / q.epl;
      const uint64_t slot = (uint64_t)((q.seq0 + l) % q.n_slots);
      const uint64_t addr = q.staging_host + slot * q.slot_bytes + en.slot_off;
      const uint32_t idx = (s_tail + i) & r.sq_mask;
      unsigned long long *s = r.sqes + (uint64_t)idx * 8;
      const bool fixed_buf = (en.flags & TK_IO_FIXED_BUF) != 0;
      const uint32_t op = (en.flags & TK_IO_WRITE) ? (fixed_buf ? OP_WRITE_FIXED : OP_WRITE)
                                                   : (fixed_buf ? OP_READ_FIXED : OP_READ);
      const uint32_t sqe_flags = (en.flags & TK_IO_FIXED_FILE) ? 1u : 0u;  // IOSQE_FIXED_FILE
      s[0] = (unsigned long long)op | ((unsigned long long)sqe_flags << 8) |
             ((unsigned long long)(uint32_t)en.fd << 32);
      s[1] = en.offset;
      s[2] = addr;
      s[3] = (unsigned long long)en.len;  // rw_flags = 0
      s[4] = ((unsigned long long)q.slot_id << 32) | e;
      s[5] = fixed_buf ? slot : 0;  // buf_index (u16) = staging slot; personality, file_index 0
      s[6] = 0;
      s[7] = 0;
      if (r.sq_array) r.sq_array[idx] = idx;
      __threadfence_system();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (n) {
        st->sq_tail = s_tail + n;
        st_release_sys(r.sq_tail, s_tail + n);
        *q.cursor = s_cursor + n;
        st->inflight += n;
      }
      s_head = st->cq_head;
      s_ctail = ld_acquire_sys(r.cq_tail);
      s_ours = 0;
      s_stray = 0;
    }
    __syncthreads();
    // Reap every CQE present, one per thread: each CQE is two loads over
    // PCIe, and reaping a wake-up's batch of 32 one after another kept the
    // SQEs that refill the window from being published for tens of µs.
    const uint32_t head0 = s_head, n_cqe = s_ctail - s_head;
    for (uint32_t i = threadIdx.x; i < n_cqe; i += blockDim.x) {
      const unsigned long long *c = r.cqes + (uint64_t)((head0 + i) & r.cq_mask) * 2;
      const unsigned long long ud = ld_relaxed_sys_u64(c);
      const int32_t res = (int32_t)(ld_relaxed_sys_u64(c + 1) & 0xffffffffull);
      const uint32_t e = (uint32_t)ud;
      if ((uint32_t)(ud >> 32) != q.slot_id || e >= q.n_layers * q.epl) {
        atomicAdd(&s_stray, 1u);
        continue;
      }
      atomicAdd(&s_ours, 1u);
      const uint32_t need = q.entries[e].min_len;
      tk_entry_result out;
      out.res = res;
      out.status = res < 0 ? TK_ENTRY_IOERR : ((uint32_t)res >= need ? TK_ENTRY_OK : TK_ENTRY_SHORT);
      q.results[e] = out;
      atomicAdd(&q.done[e / q.epl], 1u);
    }
    if (threadIdx.x < n_cqe) __threadfence_system();  // results out before the head moves
    __syncthreads();  // every CQE read and counted before the head is released
    if (threadIdx.x == 0) {
      const bool progress = n != 0 || n_cqe != 0;
      if (n_cqe) {
        st->inflight -= s_ours;
        st->stray += s_stray;
        st->cq_head = s_ctail;
        st_release_sys(r.cq_head, s_ctail);
      }
      const uint64_t now = globaltimer_ns();
      if (progress) last_progress = now;
      if (q.done[layer] >= q.epl) {
        s_stop = 1;
      } else if (now - last_progress > timeout_ns) {
        // Entries in flight may still land later: the ring is broken from now on.
        st->broken = 1;
        const uint32_t cur = *q.cursor;
        for (uint32_t e = 0; e < q.n_layers * q.epl; e++) {
          if (q.results[e].status != TK_ENTRY_PENDING) continue;
          q.results[e].status = e < cur ? TK_ENTRY_TIMEOUT : TK_ENTRY_SKIPPED;
        }
        for (uint32_t l = 0; l < q.n_layers; l++) q.done[l] = q.epl;
        *q.cursor = q.n_layers * q.epl;
        s_stop = 1;
      }
      __threadfence_system();
    }
    __syncthreads();
    if (s_stop) break;
  }
}

static const uint32_t kIOThreads = 128;

void launch_io_layer(cudaStream_t s, const DRing &r, DState *st, const DReq &q, uint32_t layer, uint32_t lookahead,
                     uint32_t window, uint64_t timeout_ns) {
  io_layer_kernel<<<1, kIOThreads, 0, s>>>(r, st, q, layer, lookahead, window, timeout_ns);
}

cudaError_t load_io_layer(void) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, io_layer_kernel);
}
