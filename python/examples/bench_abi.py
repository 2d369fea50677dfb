#!/usr/bin/env python3
"""What the Python binding costs per call, and the CPU path's round trip as
Python sees it. Standard library only.

Per-call times (wall and the calling thread's CPU time) are medians of 5
rounds of --calls calls, next to the cost of a trivial ctypes call into libc
(getpid) measured in the same run: the floor of any ctypes call.

The round trip saves and loads --blocks chain blocks of a Llama-3-8B-shaped
layer geometry (8 KV heads x 128 dims, bf16, 16-token pages) through the CPU
path into off-heap host memory, checks the bytes, and compares the load's
bandwidth with plain O_DIRECT reads of the same amount from the store's pool
file (8 threads, one piece each) in the same run.

usage: python3 python/examples/bench_abi.py [--calls N] [--blocks N] [--layers N] [--dir DIR]
"""

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tutti  # noqa: E402


def per_call_ns(fn, calls):
    """Median over 5 rounds of (wall ns, this thread's CPU ns) per call. An
    exported Go function runs on the calling thread, so the thread's CPU time
    covers the library's work and excludes what other processes took from
    a shared machine."""
    wall, cpu = [], []
    for _ in range(5):
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(calls):
            fn()
        cpu.append((time.thread_time_ns() - c0) / calls)
        wall.append((time.perf_counter_ns() - t0) / calls)
    return {"wall_ns": round(statistics.median(wall)), "cpu_ns": round(statistics.median(cpu))}


def direct_read_gbps(d, total, ways, reps):
    """The device's own ceiling for the same bytes in the same run: `ways`
    threads each pread one O_DIRECT piece of total/ways bytes from the largest
    file in the store (its pool file) into anonymous-mmap memory, all at once;
    median of `reps`."""
    files = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs]
    path = max(files, key=os.path.getsize)
    piece = (total // ways) & ~4095
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    bufs = [mmap.mmap(-1, piece) for _ in range(ways)]
    try:
        def one(i):
            off = (i * piece) % max(size - piece, 1) & ~4095
            os.preadv(fd, [bufs[i]], off)

        times = []
        for _ in range(reps):
            ts = [threading.Thread(target=one, args=(i,)) for i in range(ways)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            times.append(time.perf_counter() - t0)
        return piece * ways / statistics.median(times) / 1e9
    finally:
        os.close(fd)
        for b in bufs:
            b.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--blocks", type=int, default=64)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir")
    a = p.parse_args()

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    lib = tutti.load_library()
    g = tutti.Geometry(layers=a.layers, kv_heads=8, head_dim=128, dtype="bf16", planes=2, page_tokens=16, chunk_pages=1)
    num_pages = 2 * a.blocks
    d = a.dir or tempfile.mkdtemp(prefix="tutti-bench-")
    out = {"geometry": g.__dict__, "blocks": a.blocks}
    bufs = []
    st = tutti.Store([d], 4 * a.blocks * g.page_bytes_per_layer * g.layers + (64 << 20), g, num_pages,
                     io=tutti.IOOptions(staging_bytes=64 << 20, staging_slot_bytes=16 << 20))
    try:
        n = g.tensor_bytes("per_layer", num_pages)
        for _ in range(g.layers):
            mm = mmap.mmap(-1, n)
            mm[:] = os.urandom(n)
            bufs.append((mm, (ctypes.c_char * n).from_buffer(mm)))
        st.register_kv([(ctypes.addressof(anchor), n) for _, anchor in bufs])
        chain = tutti.chain_from_tokens(list(range(a.blocks * g.block_tokens)), g.block_tokens)
        arr1 = (ctypes.c_uint64 * 1)(chain[0])
        arr32 = (ctypes.c_uint64 * 32)(*chain[:32])
        res = ctypes.c_uint32()
        out["libc_getpid"] = per_call_ns(libc.getpid, a.calls)
        out["abi_version"] = per_call_ns(lib.tutti_abi_version, a.calls)
        out["lookup_1_block_raw"] = per_call_ns(lambda: lib.tutti_lookup(st.handle, arr1, 1, ctypes.byref(res)), a.calls)
        out["lookup_32_blocks_raw"] = per_call_ns(lambda: lib.tutti_lookup(st.handle, arr32, 32, ctypes.byref(res)), a.calls)
        out["lookup_32_blocks_store"] = per_call_ns(lambda: st.lookup(chain[:32]), a.calls // 4)
        toks = list(range(8192))
        out["chain_from_tokens_8192"] = per_call_ns(lambda: tutti.chain_from_tokens(toks, 16), 50)

        src = list(range(a.blocks))
        dst = list(range(a.blocks, 2 * a.blocks))
        t0 = time.perf_counter()
        with st.save(chain, src) as sv:
            sv.wait_gathered()
        st.wait_saves()
        out["save_ms"] = (time.perf_counter() - t0) * 1e3
        load_ms = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            with st.load(chain, dst) as ld:
                blocks = ld.wait()
            load_ms.append((time.perf_counter() - t0) * 1e3)
        out["load_ms"] = load_ms
        out["restored_blocks"] = blocks
        total = a.blocks * g.page_bytes_per_layer * g.layers
        out["bytes_per_load"] = total
        out["load_gbps_median"] = total / (statistics.median(load_ms) / 1e3) / 1e9
        pp = g.page_bytes_per_plane
        same = all(mm[(pl * num_pages + s) * pp:(pl * num_pages + s + 1) * pp] == mm[(pl * num_pages + t) * pp:(pl * num_pages + t + 1) * pp]
                   for mm, _ in bufs for pl in range(2) for s, t in zip(src[:blocks], dst[:blocks]))
        out["bit_exact"] = same
        out["stats"] = st.stats().as_dict()
        out["baseline_direct_read_gbps"] = direct_read_gbps(d, total, 8, a.reps)
    finally:
        st.close()
        for mm, anchor in bufs:
            del anchor
        if not a.dir:
            shutil.rmtree(d, ignore_errors=True)
    out["load_over_direct_read"] = out["load_gbps_median"] / out["baseline_direct_read_gbps"]
    out["lookup_1_block_over_libc_cpu"] = out["lookup_1_block_raw"]["cpu_ns"] / out["libc_getpid"]["cpu_ns"]
    print(json.dumps(out, indent=2))
    return 0 if out["bit_exact"] and out["restored_blocks"] == a.blocks else 1


if __name__ == "__main__":
    sys.exit(main())
