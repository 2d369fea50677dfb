#!/usr/bin/env python3
"""Pick warm-start replay windows of a Mooncake-format trace for eval/device-run.sh.

For every window (a timestamp bucket's first request, then N requests) it
estimates what `tutti replay --from-ms START --requests N --warm-ms WARM`
costs on the GPU machine and how much of it the warm start serves:

- warm set: blocks of the history (requests with timestamps in
  [START - WARM, START)) that the window references: the chain up to them
  equals a window chain up to them (hash ids are chained prefix hashes, so an
  equal id is an equal prefix; the walk stops at the first id the window does
  not have, as the harness's planWarm does);
- every caching backend then replays the window from that store, capacity
  holding every distinct block (the replay's default): a request hits its
  leading cached blocks, the rest is prefilled and saved;
- GPU work: each caching backend prefills the tokens it missed, recompute
  prefills everything (model FLOPs as eval/model computes them: 2 FLOPs per
  active parameter per token plus attention over the context);
- distinct bytes: the window's distinct blocks (the warm set is a subset);
- device time: every backend that keeps its blocks on the device (tutti-gpu,
  tutti-cpu, per-block, cufile, pagecache: 5) writes the warm set in its
  warm-up, then reads its hits and writes its misses in the window; at the
  measured rate of the slower storage (the GPU machine's virtio disk: a
  1.9 GB/s read ceiling, restores at 1-2 GB/s in BENCHMARKS.md) that is most
  of a replay's wall time besides the GPU's, and device-run.sh gives each
  replay MAX_RUN_S;
- no request's KV above the replay's default engine memory bound (16 GiB):
  such a request would be left out of the replay.

The window with the most warm hits (window block references served from the
warm set) whose GPU seconds, distinct bytes and estimated run time stay
within the limits wins (ties: more hits overall, then fewer GPU seconds).
Python 3 stdlib only.

    python3 eval/warm-windows.py /work/shared/traces/conversation_trace.jsonl
"""

import argparse
import json
import sys

GIB = 1 << 30

# eval/model profiles: active parameters, layers, query heads, QK and V dims,
# KV bytes per token (bf16), 512-token blocks.
MODELS = {
    "llama3-70b": dict(active=70.6e9, layers=80, qheads=64, qk=128, v=128,
                       kv_per_token=80 * 2 * 8 * 128 * 2, budget_s=40.0),
    "deepseek-v3": dict(active=37e9, layers=61, qheads=128, qk=128 + 64, v=128,
                        kv_per_token=61 * 1 * 1 * 576 * 2, budget_s=25.0),
}


def prefill_flops(m, cached, new):
    """eval/model Profile.PrefillFLOPs."""
    if new <= 0:
        return 0.0
    attn = m["layers"] * m["qheads"] * 2 * (m["qk"] + m["v"])
    ctx = new * cached + new * (new + 1) / 2
    return new * 2 * m["active"] + attn * ctx


def load(path):
    reqs = []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            reqs.append((float(d["timestamp"]), int(d["input_length"]), d["hash_ids"]))
    return reqs


def evaluate(reqs, start, n, warm_ms, m, caching, block_tokens):
    ts0 = reqs[start][0]
    window = reqs[start:start + n]
    if len(window) < n:
        return None
    wids = set()
    for _, _, ids in window:
        wids.update(ids)
    warm = set()
    hist_reqs = used = 0
    i = start - 1
    while i >= 0 and reqs[i][0] >= ts0 - warm_ms:
        hist_reqs += 1
        k = 0
        for bid in reqs[i][2]:
            if bid not in wids:
                break
            warm.add(bid)
            k += 1
        used += k > 0
        i -= 1
    cache = set(warm)
    hits = warm_hits = 0
    miss_flops = full_flops = 0.0
    refs = 0
    for _, tokens, ids in window:
        refs += len(ids)
        h = 0
        while h < len(ids) and ids[h] in cache:
            h += 1
        hits += h
        warm_hits += sum(1 for b in ids[:h] if b in warm)
        cached = min(h * block_tokens, tokens)
        miss_flops += prefill_flops(m, cached, tokens - cached)
        full_flops += prefill_flops(m, 0, tokens)
        cache.update(ids)
    block_bytes = block_tokens * m["kv_per_token"]
    max_blocks = max(len(ids) for _, _, ids in window)
    return dict(max_kv_gib=max_blocks * block_bytes / GIB,
                io_gib=(len(warm) + (len(wids) - len(warm)) + hits) * block_bytes / GIB,
                start=start, line=start + 1, from_ms=ts0, n=n, hist=hist_reqs, used=used,
                warm_blocks=len(warm), warm_gib=len(warm) * block_bytes / GIB,
                distinct=len(wids), distinct_gib=len(wids) * block_bytes / GIB,
                refs=refs, hits=hits, warm_hits=warm_hits, hit_ratio=hits / refs,
                miss_pflop=miss_flops / 1e15, full_pflop=full_flops / 1e15,
                gpu_pflop=(caching * miss_flops + full_flops) / 1e15,
                hit_gib=hits * block_bytes / GIB)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--models", default="llama3-70b,deepseek-v3")
    ap.add_argument("--warm-ms", type=float, default=1800000)
    ap.add_argument("--tflops", type=float, default=600, help="GPU prefill rate assumed (TFLOP/s)")
    ap.add_argument("--caching", type=int, default=6, help="caching backends that prefill their misses "
                    "(tutti-gpu, tutti-cpu, per-block, cufile, pagecache, dram); recompute prefills everything")
    ap.add_argument("--cap-gib", type=float, default=30, help="bound on the window's distinct block bytes")
    ap.add_argument("--kv-mem-gib", type=float, default=16, help="engine KV memory bound (replay's default)")
    ap.add_argument("--device-backends", type=int, default=5, help="backends whose blocks are on the device")
    ap.add_argument("--device-gbps", type=float, default=1.5, help="device rate for the run-time estimate (GB/s)")
    ap.add_argument("--max-run-s", type=float, default=110, help="bound on GPU s + device s of one replay")
    ap.add_argument("--min-requests", type=int, default=5)
    ap.add_argument("--max-requests", type=int, default=15)
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--partial-history", action="store_true",
                    help="also windows whose history reaches back before the trace's first request (a short trace, e.g. the embedded window)")
    ap.add_argument("--top", type=int, default=5, help="candidates printed per model")
    args = ap.parse_args()
    reqs = load(args.trace)
    starts = [i for i in range(len(reqs)) if i == 0 or reqs[i][0] > reqs[i - 1][0]]
    for name in args.models.split(","):
        m = MODELS[name]
        budget_pflop = m["budget_s"] * args.tflops * 1e12 / 1e15
        best = []
        for s in starts:
            if reqs[s][0] - args.warm_ms < reqs[0][0] and not args.partial_history:
                continue  # a full history only
            for n in range(args.min_requests, args.max_requests + 1):
                r = evaluate(reqs, s, n, args.warm_ms, m, args.caching, args.block_tokens)
                if r is None or r["gpu_pflop"] > budget_pflop or r["distinct_gib"] > args.cap_gib or r["max_kv_gib"] > args.kv_mem_gib:
                    continue
                r["gpu_s"] = r["gpu_pflop"] * 1e15 / (args.tflops * 1e12)
                r["io_s"] = args.device_backends * r["io_gib"] * GIB / (args.device_gbps * 1e9)
                if r["gpu_s"] + r["io_s"] > args.max_run_s:
                    continue
                best.append(r)
        best.sort(key=lambda r: (-r["warm_hits"], -r["hits"], r["gpu_pflop"]))
        print(f"== {name}: {len(starts)} window starts, GPU budget {m['budget_s']:.0f} s at {args.tflops:.0f} TFLOP/s "
              f"= {budget_pflop:.1f} PFLOP ({args.caching} caching backends' misses + recompute's full prefill), "
              f"distinct blocks <= {args.cap_gib:.0f} GiB, history {args.warm_ms / 1000:.0f} s, "
              f"GPU s + device s ({args.device_backends} backends at {args.device_gbps} GB/s) <= {args.max_run_s:.0f} s")
        for r in best[:args.top]:
            print(f"--from-ms {r['from_ms']:.0f} --requests {r['n']} (line {r['line']}): history {r['hist']} requests "
                  f"({r['used']} share a prefix), warm set {r['warm_blocks']} blocks ({r['warm_gib']:.1f} GiB); "
                  f"window {r['refs']} block refs, {r['distinct']} distinct ({r['distinct_gib']:.1f} GiB), "
                  f"hits {r['hits']} ({r['warm_hits']} from the warm set), hit ratio {r['hit_ratio']:.2f}, "
                  f"restored per backend {r['hit_gib']:.1f} GiB, largest request {r['max_kv_gib']:.1f} GiB of KV; prefill: full {r['full_pflop']:.2f} PFLOP, "
                  f"misses {r['miss_pflop']:.2f} PFLOP per caching backend, "
                  f"{r['gpu_pflop']:.1f} PFLOP = {r['gpu_s']:.1f} GPU s per storage; "
                  f"device {r['io_gib']:.1f} GiB per backend (warm-up writes, window writes and reads) = {r['io_s']:.0f} s")
        if not best:
            print("no window fits", file=sys.stderr)


if __name__ == "__main__":
    main()
