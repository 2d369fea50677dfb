"""The headline in a real engine: vLLM 0.26 serving docqa through each KV
backend, Poisson arrivals at several rates, TTFT from vLLM's own request
metrics (eval/vllm/headline.sh runs it on the GPU machine; its header says
how long and in how many device calls).

  python3 headline.py run --backend B --out FILE [options]   one backend, one vLLM engine
  python3 headline.py report --out-dir DIR FILE...           the SLO, rates at SLO, goals: JSON + markdown
  python3 headline.py configs                                every backend's engine arguments, as JSON

The workload is `tutti replay`'s docqa (eval/vllm/docqa.py): the plan's first
--requests requests, token-id prompts; every run (one round at one rate) uses
its own salt, "r<round>-<rate>", so no run hits what an earlier one stored and
every backend serves the same requests in the same order. Each backend runs in
its own process (an AsyncLLM, the engine core in a child process as `vllm
serve` runs it): warm-up, then for each round the rates in ascending order,
each run starting with vLLM's GPU prefix cache reset (the connector's store is
left as it is: tutti has no reset, and a run's salt keeps earlier runs from
hitting). A run's requests are sent at their arrival times by one asyncio task
each; its TTFT is vLLM's RequestStateStats.first_token_latency (the frontend's
clock from the request's arrival to its first token: the figure behind
vllm:time_to_first_token_seconds); the record also keeps queue time and the
engine core's first_token_ts - queued_ts. Bytes restored and restore time come
from the connector's own metrics where it reports them (tutti:
vllm:tutti_load_bytes, vllm:tutti_load_time_seconds; vLLM's offloading:
vllm:kv_offload_load_bytes, vllm:kv_offload_load_time), read as deltas of
vLLM's Prometheus registry around each run.

The no-connector backend (`none`) runs an unloaded pass first, one request at
a time (--unloaded N requests): the SLO is SLO_FACTOR x its p90
(headline_stats). With --slo-ms given, a round stops starting rates once one
missed the SLO (the rest are recorded as skipped: they cannot raise that
round's rate at SLO). eval/vllm/harness_check.py holds the replay harness's
designs against these results (headline.sh's header: HARNESS=1).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docqa  # noqa: E402
import headline_stats as hs  # noqa: E402

BACKENDS = ("none", "offload-cpu", "offload-fs", "tutti-gpu", "tutti-gpu-async", "tutti-gpu-auto", "tutti-gpu-save",
            "tutti-gpu-hostwait", "tutti-cpu", "lmcache-disk", "lmcache-gds")
ASYNC_LOADS = {"async": True, "auto": "auto"}  # a tutti backend's suffix -> its async_loads
# "save": kv_role kv_producer, every lookup a miss: what tutti's saves alone cost the engine (a diagnostic row)
KV_ROLE = {"save": "kv_producer"}
# "hostwait": save_wait "host", the host waits for the engine's stream at the save point (the control of "device")
SAVE_WAIT = {"hostwait": "host"}
GIB = 1 << 30
LMCACHE_CHUNK_TOKENS = 256  # LMCache's default chunk, the replay's 256-token blocks
DRAIN_S = 8.0  # allowance after a run's last arrival, for --deadline-s


def model_kv_bytes_per_token(model_dir: str) -> int:
    """K and V of every layer for one token, bf16 (the model's config.json)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * 2


def backend_config(name: str, a) -> dict:
    """What backend ``name`` needs: kv_transfer_config (a dict of
    KVTransferConfig's fields, None for no connector), env (variables for
    the engine), files ({path: text} to write first) and note (what it is,
    for the report). Pure: no vLLM import, no file written."""
    dirs = json.loads(a.dirs) if isinstance(a.dirs, str) else list(a.dirs)
    if name not in BACKENDS:
        raise ValueError(f"backend {name!r}: want one of {', '.join(BACKENDS)}")
    if name != "none" and not dirs:
        raise ValueError(f"backend {name}: --dirs is empty")
    sub = [os.path.join(d, name) for d in dirs]
    where = f"{len(dirs)} dirs" if len(dirs) > 1 else "1 dir"
    one = a.one_path_label or f"the first of the {where}"
    out = {"kv_transfer_config": None, "env": {}, "files": {}, "dirs": sub}
    if name == "none":
        out["note"] = f"no connector: vLLM's GPU prefix cache alone ({a.gpu_blocks} blocks of {a.block_size} tokens)"
        out["dirs"] = []
    elif name == "offload-cpu":
        out["kv_transfer_config"] = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                                     "kv_connector_extra_config": {"cpu_bytes_to_use": a.cpu_gib * GIB}}
        out["note"] = f"vLLM's OffloadingConnector, CPU tier of {a.cpu_gib} GiB pinned host memory"
        out["dirs"] = []
    elif name == "offload-fs":
        out["kv_transfer_config"] = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                                     "kv_connector_extra_config": {
                                         "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": a.fs_cpu_gib * GIB,
                                         "secondary_tiers": [{"type": "fs", "root_dir": sub[0]}]}}
        out["note"] = (f"vLLM's OffloadingConnector, TieringOffloadingSpec: CPU tier of {a.fs_cpu_gib} GiB, then its "
                       f"file tier (one root_dir: {one}; no eviction: earlier runs' files deleted between runs)")
        out["dirs"] = sub[:1]
    elif name.startswith("tutti-"):
        path, mode = (name.split("-") + [""])[1:3]
        extra = {"dirs": sub, "capacity_bytes": a.capacity_gib * GIB, "path": path}
        if path == "cpu":  # vLLM's KV cache is on the GPU: the CPU path goes through pinned host staging
            extra["host_staging_bytes"] = int(a.host_staging_gib * GIB)
        if mode in ASYNC_LOADS:
            extra["async_loads"] = ASYNC_LOADS[mode]
        if mode in SAVE_WAIT:
            extra["save_wait"] = SAVE_WAIT[mode]
        role = KV_ROLE.get(mode, "kv_both")
        out["kv_transfer_config"] = {"kv_connector": "TuttiConnector", "kv_connector_module_path": "tutti.vllm",
                                     "kv_role": role, "kv_connector_extra_config": extra}
        out["note"] = (f"tutti, {path.upper()} path, striped over {where}, {a.capacity_gib} GiB"
                       + (f", host staging of {a.host_staging_gib:g} GiB pinned" if path == "cpu" else "")
                       + (f", async_loads {json.dumps(extra['async_loads'])} (vLLM's WAITING_FOR_REMOTE_KVS)"
                          if mode in ASYNC_LOADS else "")
                       + (f", kv_role {role}: saves only, every lookup a miss (what the saves cost)" if mode in KV_ROLE
                          else "")
                       + (f", save_wait {SAVE_WAIT[mode]!r}: the host waits for the engine's stream at the save point"
                          if mode in SAVE_WAIT else ""))
    else:
        cfg = {"chunk_size": LMCACHE_CHUNK_TOKENS, "local_cpu": False, "max_local_cpu_size": a.lmcache_cpu_gib}
        if name == "lmcache-disk":
            cfg.update({"local_disk": f"file://{sub[0]}/", "max_local_disk_size": a.capacity_gib})
            what = "local disk backend"
        else:
            cfg.update({"gds_path": sub[0], "gds_buffer_size": a.gds_buffer_mib})
            what = (f"GDS backend (cuFile, {a.gds_buffer_mib} MiB registered buffer; no eviction: earlier runs' "
                    f"files deleted between runs)")
        path = os.path.join(a.work_dir, f"lmcache-{name}.yaml")
        out["files"][path] = "".join(f"{k}: {json.dumps(v)}\n" for k, v in cfg.items())  # JSON values are YAML
        # PYTHONHASHSEED: LMCache keys chunks with Python's hash() here (vLLM 0.26 gives it no other) and asks for it.
        out["env"] = {"LMCACHE_CONFIG_FILE": path, "LMCACHE_TRACK_USAGE": "false", "PYTHONHASHSEED": "0"}
        out["kv_transfer_config"] = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
        out["note"] = (f"LMCache (in-process LMCacheConnectorV1), {what}, {LMCACHE_CHUNK_TOKENS}-token chunks, no CPU "
                       f"hot cache; one path: {one}")
        out["dirs"] = sub[:1]
    return out


# Backends whose storage never evicts -> is this file one of their blocks?
# vLLM's file tier: <root>/<model>_<digest>_r<rank>/.../<hash>.bin (and
# <...>_<n>.tmp while written); LMCache 0.5.3's GDS backend ("does not support
# eviction"): <gds_path>/<l1>/<l2>/<key>.kvcache.safetensors, its .metadata
# and their .tmp<8> files. A run of the default plan writes ~10 GiB: kept,
# they fill the stripe (32 GiB) by the fourth run, the machine's disk soon after.
NO_EVICTION = {
    "offload-fs": lambda f: f.endswith(".bin") or f.endswith(".tmp"),
    "lmcache-gds": lambda f: ".kvcache.safetensors" in f,
}


def drop_unevicted_files(backend: str, root_dir: str) -> int:
    """Deletes the block files of a backend that never evicts (NO_EVICTION)
    under root_dir; earlier runs' blocks (other salts) are never hit again.
    Between runs only, with no request in flight: a lookup then finds no
    file (vLLM's tier) or asks for a key no later run has (LMCache's index,
    which outlives the file). Directories stay (LMCache caches which it
    made). Returns the files deleted."""
    want = NO_EVICTION[backend]
    n = 0
    for dirpath, _, files in os.walk(root_dir):
        for f in files:
            if want(f):
                try:
                    os.unlink(os.path.join(dirpath, f))
                except FileNotFoundError:  # a late save's temporary file, renamed meanwhile
                    continue
                n += 1
    return n


def drop_fs_tier_files(root_dir: str) -> int:
    """drop_unevicted_files for vLLM's file tier."""
    return drop_unevicted_files("offload-fs", root_dir)


def engine_kwargs(a, kv_transfer_config) -> dict:
    """AsyncEngineArgs' fields for every backend (the same engine but the
    connector)."""
    kw = dict(model=a.model, load_format="dummy", skip_tokenizer_init=True, max_model_len=a.max_model_len,
              max_num_batched_tokens=a.budget_tokens, enable_chunked_prefill=True, enable_prefix_caching=True,
              num_gpu_blocks_override=a.gpu_blocks, block_size=a.block_size, seed=a.seed, disable_log_stats=False,
              gpu_memory_utilization=a.gpu_mem_util, enforce_eager=not a.cuda_graphs)
    if not a.cuda_graphs:
        kw["compilation_config"] = {"mode": 0}
    if kv_transfer_config is not None:
        kw["kv_transfer_config"] = kv_transfer_config
    return kw


def flat_metrics() -> dict:
    """vLLM's Prometheus registry (this process's: the frontend's stat
    loggers, which the engine core's scheduler and connector stats reach)
    as {(name, labels, part): number}; part is "value" for a counter or
    gauge, "sum" and "count" for a histogram."""
    from vllm.v1.metrics.reader import get_metrics_snapshot

    out = {}
    for m in get_metrics_snapshot():
        lab = ",".join(f"{k}={v}" for k, v in sorted(m.labels.items()) if k not in ("model_name", "engine"))
        if hasattr(m, "sum") and hasattr(m, "count"):
            parts = {"sum": m.sum, "count": m.count}
        elif isinstance(getattr(m, "value", None), (int, float)):
            parts = {"value": m.value}
        else:
            continue
        for part, v in parts.items():
            out[(m.name, lab, part)] = out.get((m.name, lab, part), 0) + v
    return out


def metric_delta(before: dict, after: dict, name: str, part: str = "value"):
    """The run's increase of every series called name (labels summed);
    None when the registry has no such series."""
    keys = [k for k in after if k[0] == name and k[2] == part]
    if not keys:
        return None
    return sum(after[k] - before.get(k, 0) for k in keys)


RESTORE_METRICS = {  # backend prefix -> (bytes counter, seconds (name, part))
    "tutti": ("vllm:tutti_load_bytes", ("vllm:tutti_load_time_seconds", "sum")),
    "offload": ("vllm:kv_offload_load_bytes", ("vllm:kv_offload_load_time", "value")),
}


async def one(engine, rid, toks, at, sp, rec):
    """Sends one request at loop time ``at``; fills rec from its outputs."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, at - loop.time()))
    sent = loop.time()
    rec["sent_late_s"] = sent - at
    last = None
    try:
        async for out in engine.generate({"prompt_token_ids": toks}, sp, rid):
            if "client_ttft_s" not in rec and out.outputs and out.outputs[0].token_ids:
                rec["client_ttft_s"] = loop.time() - sent
            last = out
    except Exception as e:  # noqa: BLE001 - a failed request is counted, the run goes on
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
        return
    m = getattr(last, "metrics", None)
    if last is None or m is None or not getattr(m, "first_token_latency", 0):
        rec["error"] = "no first token in vLLM's request metrics"
        return
    rec["ttft_s"] = m.first_token_latency
    rec["queue_s"] = m.scheduled_ts - m.queued_ts if m.scheduled_ts and m.queued_ts else None
    rec["engine_ttft_s"] = m.first_token_ts - m.queued_ts if m.first_token_ts and m.queued_ts else None
    rec["num_cached_tokens"] = last.num_cached_tokens
    rec["finish_reason"] = last.outputs[0].finish_reason if last.outputs else None


async def reset_gpu_cache(engine, tries: int = 20, wait_s: float = 0.25) -> bool:
    """Empties vLLM's GPU prefix cache; False when it would not. vLLM 0.26
    refuses (returns False, nothing reset) while any block is held, e.g. a
    finished request's blocks a connector still saves from: retried for up
    to tries x wait_s. A run after a refused reset is still valid (its salt
    hits nothing earlier) but starts with a fuller GPU cache: recorded."""
    for _ in range(tries):
        if await engine.reset_prefix_cache() is not False:
            return True
        await asyncio.sleep(wait_s)
    return False


async def run_once(engine, plan, prompts, arrivals, sp, salt, prefix):
    """One run: every request at its arrival; returns the records."""
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.2
    recs = [{"index": q.index, "doc": q.doc, "question": q.question, "prompt_tokens": q.prompt_tokens}
            for q in plan.requests]
    await asyncio.gather(*(one(engine, f"{prefix}-{salt}-{i}", prompts[i], t0 + arrivals[i], sp, recs[i])
                           for i in range(len(recs))))
    return recs, loop.time() - t0


def run_record(rate, rnd, salt, recs, wall_s, before, after, backend, kv_bytes_per_token):
    ok = [r for r in recs if "ttft_s" in r]
    rec = {"rate": rate, "round": rnd, "salt": salt, "wall_s": wall_s, "n": len(recs), "failed": len(recs) - len(ok),
           "ttft_s": [r["ttft_s"] for r in ok], "requests": recs,
           "local_hit_tokens": metric_delta(before, after, "vllm:prefix_cache_hits"),
           "external_hit_tokens": metric_delta(before, after, "vllm:external_prefix_cache_hits"),
           "preemptions": metric_delta(before, after, "vllm:num_preemptions"),
           "max_sent_late_s": max((r.get("sent_late_s", 0) for r in recs), default=0)}
    for pre, (b, s) in RESTORE_METRICS.items():
        if backend.startswith(pre):
            rec["restored_bytes"] = metric_delta(before, after, b)
            rec["restore_s"] = metric_delta(before, after, *s)
    if backend.startswith("tutti"):  # the batch's waits on ended requests' saves (docs/vllm.md, Metrics)
        rec["save_end_wait_s"] = metric_delta(before, after, "vllm:tutti_save_end_wait_seconds")
        rec["save_end_reuses"] = metric_delta(before, after, "vllm:tutti_save_end_reuses")
        rec["save_sync_s"] = metric_delta(before, after, "vllm:tutti_save_sync_seconds")
        rec["save_issue_s"] = metric_delta(before, after, "vllm:tutti_save_issue_seconds")
    if rec.get("restored_bytes") is None and rec["external_hit_tokens"]:
        # Not reported by the backend (LMCache here): what vLLM counted as
        # external hits, in bytes of KV; labelled implied in the report.
        rec["implied_restored_bytes"] = rec["external_hit_tokens"] * kv_bytes_per_token
    s = hs.summary(rec["ttft_s"])
    print(f"[{backend}] round {rnd} rate {rate:g}: {len(ok)}/{len(recs)} ok, TTFT p50 {s['p50'] * 1e3:.1f} "
          f"p90 {s['p90'] * 1e3:.1f} p99 {s['p99'] * 1e3:.1f} ms, external hits {rec['external_hit_tokens']}, "
          f"GPU-cache hits {rec['local_hit_tokens']}, restored {rec.get('restored_bytes')}, "
          f"steps waiting on ended requests' saves {rec.get('save_end_wait_s')} s "
          f"({rec.get('save_end_reuses')} finished requests' blocks reused under their saves), host in the save "
          f"point {rec.get('save_sync_s')} s waiting, {rec.get('save_issue_s')} s issuing, {wall_s:.1f} s",
          flush=True)
    return rec


def make_vllm_engine(a, cfg):
    """The engine of one backend: (AsyncLLM, SamplingParams, vocabulary
    size, metrics reader). The engine core runs in a child process, as under
    `vllm serve`."""
    from vllm import SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    ktc = KVTransferConfig(**cfg["kv_transfer_config"]) if cfg["kv_transfer_config"] else None
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(a, ktc)))
    sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
    return engine, sp, engine.model_config.get_vocab_size(), flat_metrics


async def amain(a, make_engine=make_vllm_engine) -> int:
    """One backend's process: warm-up, the unloaded pass (--unloaded), then
    every round's rates; the result JSON is rewritten after each run, so a
    process cut short still leaves what it measured."""
    t_start = time.monotonic()
    cfg = backend_config(a.backend, a)
    for path, text in cfg["files"].items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    os.environ.update(cfg["env"])
    for d in cfg["dirs"]:
        os.makedirs(d, exist_ok=True)
    t_eng = time.monotonic()
    engine, sp, vocab, metrics = make_engine(a, cfg)
    res = {"backend": a.backend, "note": cfg["note"], "storage": a.storage, "args": vars(a),
           "kv_transfer_config": cfg["kv_transfer_config"], "engine_start_s": time.monotonic() - t_eng,
           "import_s": t_eng - t_start, "runs": [], "skipped": [], "unloaded": None}
    plan = docqa.load_plan(a.plan, a.requests)
    res["workload"] = {"describe": plan.workload, "params": plan.params, "requests": len(plan.requests)}
    kvb = model_kv_bytes_per_token(a.model)

    def save():
        with open(a.out, "w") as f:
            json.dump(res, f)

    # Warm-up: the plan's first two prompts (other tokens), nothing timed.
    warm = docqa.prompts(plan, vocab, "warmup")[:2]
    for i, toks in enumerate(warm):
        rec = {}
        await one(engine, f"warmup-{i}", toks, 0.0, sp, rec)
        if "ttft_s" not in rec:  # nothing to measure with: stop before the runs, not after them
            print(f"[{a.backend}] warm-up request {i} gave no TTFT from vLLM's request metrics: {rec}", flush=True)
            res["error"] = f"warm-up: {rec.get('error', rec)}"
            save()
            engine.shutdown()
            return 1
    if a.unloaded:
        uplan = docqa.Plan(plan.workload, plan.params, plan.requests[:a.unloaded])
        toks = docqa.prompts(uplan, vocab, "unloaded")
        if not await reset_gpu_cache(engine):
            print(f"[{a.backend}] unloaded: vLLM refused to reset its GPU prefix cache", flush=True)
        recs = []
        for i in range(len(toks)):
            rec = {"index": i}
            await one(engine, f"unloaded-{i}", toks[i], 0.0, sp, rec)
            recs.append(rec)
        t = [r["ttft_s"] for r in recs if "ttft_s" in r]
        res["unloaded"] = {"ttft_s": t, "failed": len(recs) - len(t), "requests": recs,
                           "slo_s": hs.slo_s(t) if t else None}
        print(f"[{a.backend}] unloaded: p90 {hs.percentile(t, 0.9) * 1e3:.1f} ms -> SLO "
              f"{res['unloaded']['slo_s'] * 1e3:.1f} ms", flush=True)
        save()
    slo = a.slo_ms / 1e3 if a.slo_ms else (res["unloaded"] or {}).get("slo_s")
    rates = sorted(float(x) for x in a.rates.split(","))
    for rnd in range(a.rounds):
        missed = False
        for rate in rates:
            salt = f"r{rnd}-{rate:g}"
            arr = docqa.arrivals_s(plan, rate)
            # A run takes its arrivals, then the last requests' prefill and decode, then the settle pause.
            need_s = arr[-1] + a.settle_s + DRAIN_S
            late = time.monotonic() - t_start + need_s > a.deadline_s
            if missed or late:
                why = "a lower rate missed the SLO" if missed else f"would end past --deadline-s {a.deadline_s:g}"
                res["skipped"].append({"round": rnd, "rate": rate, "why": why})
                print(f"[{a.backend}] round {rnd} rate {rate:g}: skipped ({why})", flush=True)
                continue
            toks = docqa.prompts(plan, vocab, salt)
            if a.backend in NO_EVICTION:
                drop_unevicted_files(a.backend, cfg["dirs"][0])
            reset = await reset_gpu_cache(engine)
            before = metrics()
            recs, wall = await run_once(engine, plan, toks, arr, sp, salt, a.backend)
            await asyncio.sleep(a.settle_s)  # the run's saves finish before the next run starts
            rec = run_record(rate, rnd, salt, recs, wall, before, metrics(), a.backend, kvb)
            rec["gpu_cache_reset"] = reset
            if not reset:
                print(f"[{a.backend}] round {rnd} rate {rate:g}: ran without a GPU prefix cache reset "
                      "(vLLM refused: blocks still held)", flush=True)
            res["runs"].append(rec)
            save()
            missed = slo is not None and not hs.meets(rec, slo)
    res["wall_s"] = time.monotonic() - t_start
    res["metrics_end"] = {f"{n}{{{lab}}}:{part}": v for (n, lab, part), v in metrics().items()
                          if any(s in n for s in ("tutti", "kv_offload", "prefix_cache", "preempt"))}
    save()
    engine.shutdown()
    return 0


def load_results(paths):
    out = {}
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        key = r["backend"] if not r.get("storage") else f"{r['backend']}@{r['storage']}"
        out[key] = r
    return out


def report(a) -> int:
    """Every backend's JSON -> headline.json and headline.md under
    --out-dir, one table per storage label. The SLO comes from the
    no-connector engine's unloaded pass (--slo-ms overrides)."""
    paths = sorted(set(sum((glob.glob(p) for p in a.files), [])))
    res = load_results(paths)
    if not res:
        print("no results", file=sys.stderr)
        return 1
    out = {"files": paths, "storages": {}}
    md = []
    # The no-connector engine touches no storage: one run of it serves every
    # storage's table and gives the SLO.
    nones = [r for r in res.values() if r["backend"] == "none"]
    for storage in sorted({r.get("storage") or "" for r in res.values() if r["backend"] != "none"} or {""}):
        rs = {r["backend"]: r for r in res.values() if (r.get("storage") or "") == storage}
        if "none" not in rs and nones:
            rs["none"] = nones[0]
        slo = a.slo_ms / 1e3 if a.slo_ms else None
        if slo is None:
            un = (rs.get("none") or {}).get("unloaded")
            if not un or not un.get("ttft_s"):
                print(f"{storage}: no unloaded pass of the no-connector engine; give --slo-ms", file=sys.stderr)
                return 1
            slo = hs.slo_s(un["ttft_s"])
        summ = {b: hs.backend_summary(r["runs"], slo) for b, r in rs.items() if r.get("runs")}
        for b, r in rs.items():
            if b in summ:
                summ[b]["skipped"] = r.get("skipped", [])
                summ[b]["engine_start_s"] = r.get("engine_start_s")
                imp = sum(x.get("implied_restored_bytes") or 0 for x in r["runs"])
                summ[b]["implied_restored_bytes"] = imp or None
        g = hs.goals(summ)
        out["storages"][storage] = {"slo_s": slo, "slo_source": hs.SLO_SOURCE, "backends": summ, "goals": g,
                                    "notes": {b: r["note"] for b, r in rs.items()}}
        md.append(f"## {storage or 'storage'}\n")
        md.append(hs.markdown(summ, slo, BACKENDS, {b: r["note"] for b, r in rs.items()}))
        md.append("Goals (issue 48):\n")
        for x in g:
            v = "—" if x["value"] is None else (f"{x['value']:.2f}" if isinstance(x["value"], float) else x["value"])
            md.append(f"- {x['goal']}: {v} ({'met' if x['met'] else 'missed' if x['met'] is False else 'n/a'}; "
                      f"{x['note']})")
        md.append("")
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "headline.json"), "w") as f:
        json.dump(hs.json_safe(out), f, indent=1, allow_nan=False)
    with open(os.path.join(a.out_dir, "headline.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    return 0


def add_engine_flags(p):
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--model", default=os.path.join(here, "models", "llama3-8b"))
    p.add_argument("--plan", default=docqa.PLAN_PATH, help="docqa plan (eval/workload/testdata)")
    p.add_argument("--requests", type=int, default=64, help="the plan's first N requests (0: all)")
    p.add_argument("--dirs", default="[]", help="JSON list of storage directories")
    p.add_argument("--storage", default="", help="what --dirs are, for the report")
    p.add_argument("--one-path-label", default="", help="what the one directory of a one-path backend is")
    p.add_argument("--work-dir", default="/tmp/headline")
    p.add_argument("--gpu-blocks", type=int, default=2048, help="num_gpu_blocks_override: vLLM's GPU KV cache")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--budget-tokens", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--max-model-len", type=int, default=8704)
    p.add_argument("--max-tokens", type=int, default=8, help="tokens generated per request")
    p.add_argument("--gpu-mem-util", type=float, default=0.85)
    p.add_argument("--cuda-graphs", action="store_true", help="capture CUDA graphs (default: eager, faster start)")
    p.add_argument("--capacity-gib", type=int, default=24, help="tutti's capacity; LMCache's disk size")
    p.add_argument("--cpu-gib", type=int, default=16, help="offload-cpu: cpu_bytes_to_use in GiB")
    p.add_argument("--fs-cpu-gib", type=int, default=2, help="offload-fs: its CPU tier in front of the files")
    p.add_argument("--lmcache-cpu-gib", type=float, default=4, help="LMCache max_local_cpu_size (its staging)")
    p.add_argument("--gds-buffer-mib", type=int, default=4096, help="LMCache gds_buffer_size")
    p.add_argument("--host-staging-gib", type=float, default=4,
                   help="tutti-cpu's host_staging_bytes in GiB (LMCache's max_local_cpu_size by default)")
    p.add_argument("--seed", type=int, default=0)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one backend")
    r.add_argument("--backend", required=True, choices=BACKENDS)
    r.add_argument("--out", required=True)
    r.add_argument("--rates", default="3,6,12", help="requests/s, comma-separated")
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--unloaded", type=int, default=0, help="an unloaded pass of N requests first (the SLO)")
    r.add_argument("--slo-ms", type=float, default=0, help="stop a round's rates after a miss (0: run them all)")
    r.add_argument("--settle-s", type=float, default=1.0, help="pause after each run")
    r.add_argument("--deadline-s", type=float, default=1e9,
                   help="start no run that would end later than this many seconds after the process started")
    add_engine_flags(r)
    c = sub.add_parser("configs", help="print every backend's engine arguments (no engine)")
    add_engine_flags(c)
    c.add_argument("--check", action="store_true", help="also build each KVTransferConfig and VllmConfig (vLLM)")
    rp = sub.add_parser("report", help="aggregate run JSONs")
    rp.add_argument("--out-dir", required=True)
    rp.add_argument("--slo-ms", type=float, default=0)
    rp.add_argument("files", nargs="+")
    a = p.parse_args(argv)
    if a.cmd == "run":
        if a.rounds < 1 or a.requests < 0 or a.unloaded < 0:
            p.error("--rounds >= 1, --requests >= 0, --unloaded >= 0")
        try:
            if any(not float(x) > 0 for x in a.rates.split(",")):
                raise ValueError
        except ValueError:
            p.error(f"--rates {a.rates!r}: want positive numbers, comma-separated")
    return a


def configs(a) -> int:
    """Every backend's config as JSON; with --check, each KVTransferConfig
    and the whole engine config built by vLLM (no GPU needed)."""
    out = {}
    for b in BACKENDS:
        cfg = backend_config(b, a)
        out[b] = {k: cfg[k] for k in ("kv_transfer_config", "env", "files", "note", "dirs")}
        if a.check:
            from vllm.config import KVTransferConfig

            ktc = KVTransferConfig(**cfg["kv_transfer_config"]) if cfg["kv_transfer_config"] else None
            out[b]["engine_kwargs"] = {k: str(v) for k, v in engine_kwargs(a, ktc).items()}
            if ktc is not None:
                out[b]["checked"] = {"kv_connector": ktc.kv_connector, "is_kv_transfer_instance": ktc.is_kv_transfer_instance,
                                     "extra": ktc.kv_connector_extra_config}
    print(json.dumps(out, indent=1))
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.cmd == "report":
        return report(a)
    if a.cmd == "configs":
        return configs(a)
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # FlashInfer is not staged (drive.py says why)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return asyncio.run(amain(a))


if __name__ == "__main__":
    sys.exit(main())
