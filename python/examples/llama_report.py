"""What llama_loop.py measures and reports: marks on the compute stream,
what the timed loads read (O_DIRECT pool files, not the page cache), the
per-layer breakdowns and the text a reader gets."""

import ctypes
import mmap
import os
import statistics
import time

try:
    import torch
except ImportError:
    torch = None


class Marks:
    """Timestamps in stream order: CUDA events recorded on torch's current
    stream (read after a synchronize), or host clock readings on the CPU,
    where every op has finished when it returns."""

    def __init__(self, dev):
        self.cuda = dev.type == "cuda"
        self.t = {}

    def mark(self, key):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.t[key] = e
        else:
            self.t[key] = time.perf_counter()

    def ms(self, a, b):
        """Milliseconds from mark a to mark b (the device must be synchronized)."""
        if self.cuda:
            return self.t[a].elapsed_time(self.t[b])
        return (self.t[b] - self.t[a]) * 1e3

    def has(self, key):
        return key in self.t


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def rounded(xs, nd=3):
    return [round(x, nd) for x in xs]


def median(xs):
    return statistics.median(xs) if xs else 0.0


# -- what the timed loads read: O_DIRECT pool files, not the page cache -------

def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def page_cache_bytes(path):
    """Bytes of the file at `path` in the page cache (mmap + mincore; the
    mapping is never touched, so it faults nothing in), or None if unknown."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = _libc()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            n = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * n)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return (n - bytes(vec).count(0)) * mmap.PAGESIZE
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def pool_files(dirs):
    """The store's pool files (objmap names them pool-NNNN.dat)."""
    out = []
    for d in dirs:
        for root, _, files in os.walk(d):
            out += [os.path.join(root, f) for f in sorted(files) if f.startswith("pool-") and f.endswith(".dat")]
    return out


def open_flags_direct(paths):
    """{pool file: [O_DIRECT set?] for each of this process's descriptors of it}
    (from /proc/self/fdinfo: what the library really opened)."""
    real = {os.path.realpath(p): p for p in paths}
    out = {p: [] for p in paths}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target not in real:
                continue
            with open(f"/proc/self/fdinfo/{fd}") as f:
                flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
        except (OSError, StopIteration, ValueError):
            continue
        out[real[target]].append(bool(flags & os.O_DIRECT))
    return out


def drop_page_cache(paths):
    """Drops clean cached pages of the pool files (O_DIRECT should have left
    none: this only guards against another reader having cached them)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def tutti_breakdown(m, L):
    """Where request 2's TTFT went, from its marks over L layers."""
    stall = [m.ms(("wait0", l), ("wait1", l)) for l in range(L)]
    h2d = [m.ms(("wait1", l), ("copy", l)) if m.has(("copy", l)) else 0.0 for l in range(L)]
    total = [m.ms(("start", l), ("end", l)) for l in range(L)]
    compute = [t - s - c for t, s, c in zip(total, stall, h2d)]
    ready = [m.ms("t0", ("wait1", l)) for l in range(L)]
    # Where the stream waited, it went on when the layer's KV landed:
    # the gaps between those moments are the load's pace per layer.
    paced = [ready[l] - ready[l - 1] for l in range(1, L) if stall[l] > 0.05 and stall[l - 1] > 0.05]
    return dict(before_first_layer_ms=m.ms("t0", ("start", 0)), stream_wait_ms=sum(stall),
                compute_ms=sum(compute), h2d_ms=sum(h2d), head_ms=m.ms(("end", L - 1), "head"),
                layers_waited=sum(s > 0.05 for s in stall),
                load_ms_per_layer=median(paced) if paced else None,
                last_layer_ready_ms=ready[-1],
                per_layer=dict(stream_wait_ms=rounded(stall), compute_ms=rounded(compute),
                               h2d_ms=rounded(h2d), ready_at_ms=rounded(ready)))

def recompute_breakdown(m, L):
    """Where a recomputation's TTFT went, from its marks over L layers."""
    per = [m.ms(("start", l), ("end", l)) for l in range(L)]
    return dict(before_first_layer_ms=m.ms("t0", ("start", 0)), compute_ms=sum(per),
                compute_ms_per_layer=median(per), head_ms=m.ms(("end", L - 1), "head"),
                per_layer_compute_ms=rounded(per))


def breakdown_text(rep):
    """Where the TTFT of request 2 goes, for a reader."""
    L = rep["model"]["layers"]
    out = [f"\nTTFT breakdown ({rep['path']} path, layer wait: {rep['layer_wait']}; "
           f"{rep['prefix_tokens']}-token prefix, {L} layers, {rep['prefix_kv_bytes'] / 2**20:.0f} MiB of KV per request)"]
    for k, r in enumerate(rep["tutti_runs"]):
        pl = r["load_ms_per_layer"]
        out.append(f"  tutti rep {k}: TTFT {r['ttft_ms']:.1f} ms = start of the load (keys+lookup+plan+enqueue) "
                   f"{r['start_load_ms']:.1f} ms, then on the stream: waited for KV {r['stream_wait_ms']:.1f} ms "
                   f"({r['layers_waited']}/{L} layers), computed {r['compute_ms']:.1f} ms"
                   + (f", copied from the host mirror {r['h2d_ms']:.1f} ms" if r["h2d_ms"] else "")
                   + f", LM head {r['head_ms']:.1f} ms; last layer's KV ready at {r['last_layer_ready_ms']:.1f} ms"
                   + ("" if pl is None else f"; load pace {pl:.2f} ms/layer")
                   + f"; host launch {r['host_launch_ms']:.1f} ms")
    for k, r in enumerate(rep["recompute_runs"]):
        out.append(f"  recompute rep {k}: TTFT {r['ttft_ms']:.1f} ms = {r['compute_ms']:.1f} ms over {L} layers "
                   f"({r['compute_ms_per_layer']:.2f} ms/layer), LM head {r['head_ms']:.1f} ms")
    out.append(f"  host: hash {rep['host_hash_ms']:.2f} ms, lookup {rep['host_lookup_ms']:.2f} ms (of the start of the load)")
    odir = [all(v["o_direct_fds"]) and bool(v["o_direct_fds"]) for v in rep["pool_files"].values()]
    cached = [v["page_cache_bytes_before_loads"] for v in rep["pool_files"].values()]
    out.append(f"  pool files: {len(odir)}, opened O_DIRECT: {all(odir) if odir else None}; "
               f"page-cache bytes before the loads: {cached}, after: "
               f"{[v['page_cache_bytes'] for v in rep['pool_files_after'].values()]}")
    return "\n".join(out)
