#!/usr/bin/env python3
"""A Llama-shaped PyTorch model loop whose prefix KV is restored by tutti.

The model has Llama's structure (token embedding; per layer RMSNorm, Q/K/V
projections with grouped-query attention, rotary embeddings, causal attention
over a paged KV cache, output projection, RMSNorm, SwiGLU MLP; final norm and
LM head) with random weights. Its KV cache is paged like vLLM's: one tensor
per layer shaped [2, num_pages, page_tokens, kv_heads, head_dim], a block
table per request.

Prefixes: one per warm-up request and one per timed repetition, all random
and distinct, so that every timed load reads blocks that were written once
and never read (tutti's pool files are O_DIRECT: nothing is served from the
page cache; the report checks the open flags and the pages cached).

1. Saves: each prefix is prefilled (request 1) and its KV saved through
   tutti's engine-neutral connector, the one vLLM's runs on (the scheduler
   side decides the save, the worker side's save_layer per layer and
   wait_for_save run it), then the store's wait_saves makes them durable. No
   write is in flight after.
2. Warm-up (untimed): a request 2 through tutti and a one-pass recompute on
   the warm-up prefix: CUDA's lazy module loading, cuBLAS handles and
   heuristics for these GEMM shapes, tutti's kernels, ring and SQPOLL
   thread are all started before anything is timed.
3. Timed repetitions, each on its own prefix: request 2 (same prefix plus a
   new suffix) through tutti (the scheduler side's lookup, which holds what
   it promises, and allocation; the worker side's start_load, then
   wait_for_layer(l) before layer l's attention; the model prefills only
   the suffix), then
   one-pass recomputation of the whole prompt (the TTFT baseline). Each
   TTFT runs from an idle, synchronized device to the logits on the host
   side of a synchronize. CUDA events on the compute stream give the
   breakdown: per layer, how long the stream waited for tutti's KV and how
   long it computed, and when each layer's KV let it go on.
4. Checks: each restored prefix equals the pages it was saved from, byte for
   byte; on the last prefix the reference recomputes (prefix prefill into
   other pages, then the same suffix step): KV bit-exact and identical
   logits (torch.equal). One-pass recomputation is compared with a
   tolerance, since different GEMM shapes may round differently.

--distinct-layers N lets layers share the weights of N distinct ones
(layer l uses weights l mod N): every layer still runs full-width GEMMs
whose weights stream from HBM (a 70B layer is 1.7 GB, far beyond any cache),
and writes its own KV, so compute and KV bytes per layer are those of the
real model; only HBM for weights is saved.

Path: --path gpu registers the CUDA cache with tutti (GPU-driven io_uring and
scatter kernels); --path cpu registers a pinned host mirror (io_uring from
the library's threads) and copies each layer to the GPU after it arrives;
--path auto (default) tries gpu and falls back to cpu, saying so.

The last line printed is the summary: TTFT of request 2 against
recomputation (medians), per-layer load and compute, and the checks.

Exit status: 0 when KV is bit-exact and logits equal; 1 otherwise; 2 when
torch or CUDA is missing (the message says which).
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)  # llama_model.py and llama_report.py, beside this file

import tutti  # noqa: E402
from tutti import worker_side  # noqa: E402
from tutti.scheduler_side import LocalMatcher, SchedulerSide  # noqa: E402
from llama_report import (Marks, breakdown_text, drop_page_cache, median, open_flags_direct,  # noqa: E402
                          page_cache_bytes, pool_files, recompute_breakdown, rounded, sync, tutti_breakdown)

try:
    import torch
except ImportError:
    torch = None

HASH_SEED = 0x11A3A  # the chain seed of this example's model (one seed per model)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--distinct-layers", type=int, default=0,
                   help="layers share the weights of this many distinct layers (0: all distinct); see the doc")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=28672)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--page-tokens", type=int, default=16)
    p.add_argument("--chunk-pages", type=int, default=1, help="pages per chain block (hash granularity)")
    p.add_argument("--prefix-tokens", type=int, default=8192)
    p.add_argument("--suffix-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3, help="timed repetitions, each on its own prefix (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up requests of both paths, on their own prefixes")
    p.add_argument("--path", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--dir", action="append", help="store directory (repeat to stripe); default: a temporary one")
    p.add_argument("--capacity-gib", type=float, default=0,
                   help="store capacity; default: the KV of every prefix plus 25%%")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the report here too")
    p.add_argument("--wait", choices=("auto", "host", "stream"), default="auto",
                   help="GPU path: wait for a layer on the host, or make torch's stream wait (auto: stream)")
    p.add_argument("--device", default="cuda", help="torch device; 'cpu' only smoke-tests the flow (tiny shapes)")
    a = p.parse_args(argv)
    if a.reps < 1 or a.warmup < 0:
        p.error("--reps must be >= 1 and --warmup >= 0")
    return a

class Loop:
    """One run of the example, phase by phase: its sizes, the model and its paged
    KV cache, the store and the connector's two halves, the prompts, the
    requests and the report."""

    def __init__(self, a, dev, dtype, Llama):
        """The sizes (the prefix rounded down to whole blocks), the model, its paged KV cache
        and page sets, the report's setup."""
        t_start = time.perf_counter()
        PT = a.page_tokens
        block_tokens = PT * a.chunk_pages
        if a.prefix_tokens % block_tokens:
            a.prefix_tokens -= a.prefix_tokens % block_tokens
            print(f"prefix rounded down to {a.prefix_tokens} tokens (whole chain blocks of {block_tokens})")
        P, S = a.prefix_tokens, a.suffix_tokens
        n_prefixes = a.warmup + a.reps
        pages_per_req = (P + S + PT - 1) // PT
        # Page sets: one per prefix (its request 1, kept for the check against
        # the saved pages), then request 2 (tutti), the two-step reference and
        # one-pass recomputation.
        n_sets = n_prefixes + 3
        num_pages = n_sets * pages_per_req
        geom = tutti.Geometry(layers=a.layers, kv_heads=a.kv_heads, head_dim=a.head_dim, dtype="bf16",
                              planes=2, page_tokens=PT, chunk_pages=a.chunk_pages)
        n_pages_prefix = P // PT
        chain_len = P // block_tokens
        prefix_kv_bytes = n_pages_prefix * geom.page_bytes_per_layer * a.layers
        # The index admits payload up to a fraction of the capacity (runtime.CapacityForBlocks):
        # a quarter more than the prefixes' KV, plus headers, keeps every prefix whole.
        capacity = int(a.capacity_gib * (1 << 30)) or max(int(n_prefixes * prefix_kv_bytes * 1.25) + (64 << 20), 64 << 20)

        model = Llama(a, dev, dtype)
        shape = geom.tensor_shape("per_layer", num_pages)
        kv = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(a.layers)]
        kv_cache_bytes = sum(t.numel() * t.element_size() for t in kv)
        names = [f"model.layers.{l}.self_attn.attn" for l in range(a.layers)]
        tables = [torch.arange(i * pages_per_req, (i + 1) * pages_per_req, device=dev, dtype=torch.long) for i in range(n_sets)]
        save_tables, t_load, t_ref, t_full = tables[:n_prefixes], tables[-3], tables[-2], tables[-1]

        dirs = a.dir or [tempfile.mkdtemp(prefix="tutti-llama-")]
        own_dirs = a.dir is None
        report = dict(model=dict(layers=a.layers, distinct_layers=a.distinct_layers or a.layers, hidden=a.hidden,
                                 heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, intermediate=a.intermediate,
                                 vocab=a.vocab, dtype="bf16", weight_bytes=model.weight_bytes),
                      prefix_tokens=P, suffix_tokens=S, page_tokens=PT, chunk_pages=a.chunk_pages,
                      prefix_kv_bytes=prefix_kv_bytes, kv_cache_bytes=kv_cache_bytes, capacity_bytes=capacity,
                      warmup=a.warmup, reps=a.reps, dirs=dirs,
                      device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", torch=torch.__version__)
        print(f"model: {a.layers} layers ({a.distinct_layers or a.layers} distinct), weights {model.weight_bytes / 2**30:.1f} GiB; "
              f"KV cache {kv_cache_bytes / 2**30:.1f} GiB; prefix KV {prefix_kv_bytes / 2**30:.2f} GiB x {n_prefixes} prefixes",
              flush=True)
        self.P, self.S, self.a, self.block_tokens, self.capacity = P, S, a, block_tokens, capacity
        self.chain_len, self.dev, self.dirs, self.dtype, self.geom, self.kv = chain_len, dev, dirs, dtype, geom, kv
        self.model, self.n_pages_prefix, self.n_prefixes, self.names = model, n_pages_prefix, n_prefixes, names
        self.num_pages, self.prefix_kv_bytes, self.report = num_pages, prefix_kv_bytes, report
        self.save_tables, self.shape, self.t_full, self.t_load, self.t_ref = save_tables, shape, t_full, t_load, t_ref
        self.t_start, self.own_dirs = t_start, own_dirs

    def open_store(self, path):
        dirs, n_prefixes, prefix_kv_bytes, capacity = self.dirs, self.n_prefixes, self.prefix_kv_bytes, self.capacity
        geom, num_pages, n_pages_prefix = self.geom, self.num_pages, self.n_pages_prefix
        for d in dirs:  # a fresh store for each attempt
            for e in os.listdir(d):
                p = os.path.join(d, e)
                shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
        # The GPU path sizes its pinned staging slots for gpu_max_pages: the prefix, no more.
        # Saves: the scheduler admits what its device model (a conservative
        # default until it has measured the device) writes within the save
        # bound and the pending budget; the rest of a save is cut (an
        # engine's right trade). This example needs every prefix whole before
        # the timed loads, which wait for nothing else: bound and budget are
        # sized for all of them (4x the modelled write time).
        save_bytes = n_prefixes * prefix_kv_bytes
        return tutti.Store(dirs, capacity, geom, num_pages, layout="per_layer", path=path,
                           gpu=tutti.GPUOptions(max_pages=n_pages_prefix if path == "gpu" else 0),
                           sched=tutti.SchedOptions(
                               save_bound_ms=min(600_000, max(2000, math.ceil(4 * save_bytes / 1e6))),
                               save_budget_bytes=int(1.25 * save_bytes) + (64 << 20)))

    def connect(self, path):
        """Opens a store on `path`, the connector's worker side registers the
        KV memory (the CUDA cache on the GPU path, a pinned host mirror of it
        on the CPU path: tutti's CPU path reads and writes host memory) and
        its scheduler side looks up through the same store."""
        names, a, shape, kv, dtype, dev = self.names, self.a, self.shape, self.kv, self.dtype, self.dev
        store = self.open_store(path)
        try:
            stream_wait = None if a.wait == "auto" else (a.wait == "stream" and path == "gpu")
            matcher = LocalMatcher(store)
            worker = worker_side.WorkerSide(lambda lay: store, stream_wait=stream_wait, holds=matcher)
            host = None
            if path != "gpu":
                host = [torch.zeros(shape, dtype=dtype, pin_memory=dev.type == "cuda") for _ in range(a.layers)]
            worker.register(dict(zip(names, kv if host is None else host)), a.page_tokens, layer_names=names,
                            chunk_pages=a.chunk_pages)
            sched = SchedulerSide(matcher, self.block_tokens, a.chunk_pages)
            return store, worker, sched, host
        except BaseException:
            store.close()
            raise

    def connect_any(self):
        """--path gpu or cpu, or auto: gpu on CUDA, falling back to cpu when the GPU path
        is unavailable."""
        a, report, dev = self.a, self.report, self.dev
        connect = self.connect
        path = a.path
        if path == "auto":
            path = "gpu" if dev.type == "cuda" else "cpu"
        try:
            store, worker, sched, host = connect(path)
        except (tutti.NoGPU, tutti.NotSupported) as e:
            if a.path != "auto":
                raise
            report["fallback"] = f"GPU path unavailable ({type(e).__name__}: {e}); using the CPU path"
            print("fallback:", report["fallback"])
            path = "cpu"
            store, worker, sched, host = connect(path)
        report["path"] = path
        report["layer_wait"] = "stream" if worker.stream_wait else "host"
        report["gpu_reads"] = store.gpu_reads()
        print("GPU reads:", report["gpu_reads"], flush=True)
        self.worker, self.sched, self.host, self.path, self.store = worker, sched, host, path, store
        self.load_errors = set()

    def close(self):
        """Releases the scheduler side's holds; the worker side closes the store."""
        self.sched.matcher.close()
        self.worker.close()

    def make_prompts(self):
        """One random prefix per warm-up and timed request and one shared suffix."""
        dev, a, S, P, n_prefixes = self.dev, self.a, self.S, self.P, self.n_prefixes
        g = torch.Generator(device="cpu").manual_seed(a.seed + 1)
        prefixes = [torch.randint(0, a.vocab, (P,), generator=g) for _ in range(n_prefixes)]
        suffix = torch.randint(0, a.vocab, (S,), generator=g)
        prompts = [torch.cat([p, suffix]) for p in prefixes]
        # Token lists are made here: an engine holds them already.
        prefix_lists = [p.tolist() for p in prefixes]
        prompt_lists = [p.tolist() for p in prompts]
        prefixes_d = [p.to(dev) for p in prefixes]
        prompts_d = [p.to(dev) for p in prompts]
        suffix_d = suffix.to(dev)
        self.prefix_lists, self.prefixes_d, self.prompt_lists = prefix_lists, prefixes_d, prompt_lists
        self.prompts_d, self.suffix_d = prompts_d, suffix_d

    def save_prefixes(self):
        """1. Request 1 per prefix: prefill, save its KV through the connector; then
        every save durable."""
        n_prefixes, report, save_tables, dev, kv = self.n_prefixes, self.report, self.save_tables, self.dev, self.kv
        store, worker, sched, host, model = self.store, self.worker, self.sched, self.host, self.model
        chain_len, a, names, n_pages_prefix = self.chain_len, self.a, self.names, self.n_pages_prefix
        prefix_lists, prefixes_d, P = self.prefix_lists, self.prefixes_d, self.P
        req1_ms, gather_ms = [], []
        for i in range(n_prefixes):
            t1 = save_tables[i]
            page_ids_1 = t1[:n_pages_prefix].tolist()
            # The scheduler side saves the prompt's full blocks as the step computes them.
            rid = f"r1-{i}"
            sched.track(rid, tutti.chain_from_tokens(prefix_lists[i], self.block_tokens, HASH_SEED))
            meta = sched.build_meta(SimpleNamespace(
                scheduled_new_reqs=[SimpleNamespace(req_id=rid, block_ids=page_ids_1, num_computed_tokens=0)],
                num_scheduled_tokens={rid: P}))
            worker.bind(meta.loads, meta.saves, ended=meta.ended, dropped=meta.dropped)
            worker.start_load()

            def save_hook(l, t1=t1, page_ids_1=page_ids_1):
                if host is not None:  # CPU path: the host mirror is what tutti saves
                    host[l][:, page_ids_1] = kv[l][:, t1[:n_pages_prefix]].cpu()
                # GPU path: the worker side syncs torch's stream before tutti gathers.
                worker.save_layer(names[l])

            sync(dev)
            t0 = time.perf_counter()
            model.forward(prefixes_d[i], 0, kv, t1, after_attn=save_hook)
            sync(dev)
            t_fwd = time.perf_counter()
            worker.wait_for_save()  # the pages are gathered (may be reused from here)
            req1_ms.append((t_fwd - t0) * 1e3)
            gather_ms.append((time.perf_counter() - t_fwd) * 1e3)
            self.load_errors |= worker.finish_step([rid]).error_block_ids
            worker.unbind()
            sched.request_finished(rid)
        t0 = time.perf_counter()
        store.wait_saves()  # durable, and nothing written from here on
        durable_ms = (time.perf_counter() - t0) * 1e3
        st = store.stats().saves
        skipped = sum(vars(st.skipped_blocks).values())
        if skipped or st.saved_blocks < n_prefixes * chain_len:
            raise SystemExit(f"saves incomplete: {st.saved_blocks} of {n_prefixes * chain_len} blocks saved, "
                             f"{skipped} skipped (saves: {st.as_dict()})")
        report["saves"] = dict(request1_prefill_ms=rounded(req1_ms), gather_wait_ms=rounded(gather_ms),
                               wait_saves_ms=round(durable_ms, 3), warmup_prefixes=a.warmup)
        report["request1_prefill_ms"] = median(req1_ms[a.warmup:])

    def check_lookups(self):
        """Each request 2 finds its whole prefix stored; what keying a prompt and a
        lookup cost on the host (each timed request 2 does both again)."""
        n_prefixes, report, block_tokens, P = self.n_prefixes, self.report, self.block_tokens, self.P
        prompt_lists, store = self.prompt_lists, self.store
        for i in range(n_prefixes):
            matched = store.lookup(tutti.chain_from_tokens(prompt_lists[i], block_tokens, HASH_SEED)) * block_tokens
            if matched < P:
                raise SystemExit(f"lookup found {matched} tokens of the {P}-token prefix {i}: the save did not land")
        report["matched_tokens"] = matched
        t0 = time.perf_counter()
        chain = tutti.chain_from_tokens(prompt_lists[-1], block_tokens, HASH_SEED)
        t1_ = time.perf_counter()
        store.lookup(chain)
        report["host_hash_ms"] = round((t1_ - t0) * 1e3, 3)
        report["host_lookup_ms"] = round((time.perf_counter() - t1_) * 1e3, 3)

    def check_pool_files(self):
        """What the timed loads will read: the pool files' open flags and page-cache
        bytes (then dropped)."""
        dirs, report = self.dirs, self.report
        files = pool_files(dirs)
        direct = open_flags_direct(files)
        cached_before = {p: page_cache_bytes(p) for p in files}
        drop_page_cache(files)
        report["pool_files"] = {p: dict(o_direct_fds=direct[p], page_cache_bytes_before_loads=cached_before[p])
                                for p in files}
        self.files = files

    def tutti_request(self, i, marks):
        """Request 2 on prefix i: load through tutti, prefill the suffix."""
        kv, host, dev, block_tokens, t_load = self.kv, self.host, self.dev, self.block_tokens, self.t_load
        worker, sched, a, model, names, prompts_d = self.worker, self.sched, self.a, self.model, self.names, self.prompts_d
        n_pages_prefix, prompt_lists = self.n_pages_prefix, self.prompt_lists
        page_ids_2 = t_load[:n_pages_prefix].tolist()
        for t in kv:
            t[:, t_load] = 0  # every rep starts from zeroed destination pages
        for t in host or ():
            t[:, page_ids_2] = 0  # and so does the CPU path's host mirror
        rid, prompt = f"r2-{i}", prompt_lists[i]
        sync(dev)
        t0 = time.perf_counter()
        marks.mark("t0")
        # The scheduler side keys the prompt, looks it up (holding what it
        # promises) and queues the load into the request's pages; it may
        # leave a stored tail to recompute when that is faster: the model
        # computes every token past the promised blocks.
        hit = sched.get_num_new_matched_tokens(rid, tutti.chain_from_tokens(prompt, block_tokens, HASH_SEED), len(prompt), 0)
        sched.update_state_after_alloc(rid, t_load.tolist(), hit)
        meta = sched.build_meta(SimpleNamespace(num_scheduled_tokens={}))
        worker.bind(meta.loads, meta.saves)
        worker.start_load()
        t_started = time.perf_counter()
        planned = hit // block_tokens
        start = planned * block_tokens
        n_loaded_pages = planned * a.chunk_pages

        def wait_hook(l):
            marks.mark(("wait0", l))
            worker.wait_for_layer(names[l])
            marks.mark(("wait1", l))
            if host is not None and n_loaded_pages:
                kv[l][:, t_load[:n_loaded_pages]] = host[l][:, page_ids_2[:n_loaded_pages]].to(dev, non_blocking=True)
                marks.mark(("copy", l))

        logits = model.forward(prompts_d[i][start:], start, kv, t_load, before_attn=wait_hook, marks=marks)
        t_launched = time.perf_counter()
        sync(dev)
        ttft = (time.perf_counter() - t0) * 1e3
        res = worker.finish_step([rid])
        worker.unbind()
        sched.request_finished(rid)
        self.load_errors |= res.error_block_ids
        return dict(logits=logits, ttft_ms=ttft, planned=planned, loaded=res.restored_blocks.get(rid, 0),
                    start_load_ms=(t_started - t0) * 1e3, host_launch_ms=(t_launched - t_started) * 1e3)

    def recompute_request(self, i, marks):
        """One-pass recomputation of prompt i (the TTFT baseline)."""
        dev, kv, t_full, model, prompts_d = self.dev, self.kv, self.t_full, self.model, self.prompts_d
        sync(dev)
        t0 = time.perf_counter()
        marks.mark("t0")
        logits = model.forward(prompts_d[i], 0, kv, t_full, marks=marks)
        sync(dev)
        return dict(logits=logits, ttft_ms=(time.perf_counter() - t0) * 1e3)

    def run_requests(self):
        """2. The warm-up of both paths on their own prefixes (untimed), then 3. the
        timed repetitions, each on a prefix never read before."""
        report, n_prefixes, a, dev, files, kv = self.report, self.n_prefixes, self.a, self.dev, self.files, self.kv
        t_load, save_tables = self.t_load, self.save_tables
        tutti_request = self.tutti_request
        recompute_request = self.recompute_request
        warm = []
        for i in range(a.warmup):
            r = tutti_request(i, Marks(dev))
            c = recompute_request(i, Marks(dev))
            warm.append(dict(tutti_ttft_ms=round(r["ttft_ms"], 3), recompute_ttft_ms=round(c["ttft_ms"], 3)))
        report["warmup_runs"] = warm

        # -- 3. timed repetitions, each on a prefix never read before.
        tutti_runs, recompute_runs, exact_saved = [], [], []
        for i in range(a.warmup, n_prefixes):
            m = Marks(dev)
            r = tutti_request(i, m)
            r["breakdown"] = tutti_breakdown(m, a.layers)
            tutti_runs.append(r)
            n_loaded = r["planned"] * a.chunk_pages
            exact_saved.append(all(torch.equal(kv[l][:, t_load[:n_loaded]], kv[l][:, save_tables[i][:n_loaded]])
                                   for l in range(a.layers)))
            m = Marks(dev)
            c = recompute_request(i, m)
            c["breakdown"] = recompute_breakdown(m, a.layers)
            recompute_runs.append(c)
        report["pool_files_after"] = {p: dict(page_cache_bytes=page_cache_bytes(p)) for p in files}
        self.exact_saved, self.recompute_runs, self.tutti_runs = exact_saved, recompute_runs, tutti_runs

    def finish(self):
        """4. The reference on the last prefix, the checks and the report's results."""
        chain_len, tutti_runs, report, n_prefixes = self.chain_len, self.tutti_runs, self.report, self.n_prefixes
        kv, t_ref, suffix_d, P, dev = self.kv, self.t_ref, self.suffix_d, self.P, self.dev
        exact_saved, a, model, prefixes_d = self.exact_saved, self.a, self.model, self.prefixes_d
        recompute_runs, geom, store = self.recompute_runs, self.geom, self.store
        t_start, t_load = self.t_start, self.t_load
        last = tutti_runs[-1]
        planned = last["planned"]
        n_loaded = planned * a.chunk_pages
        report["loaded_blocks"] = last["loaded"]
        report["planned_blocks"] = [r["planned"] for r in tutti_runs]
        report["chain_blocks"] = chain_len
        if planned < chain_len:
            print(f"note: the scheduler loaded {planned} of {chain_len} stored blocks and left the rest to recompute")
        report["load_errors"] = sorted(self.load_errors)

        # -- 4. reference on the last prefix: recompute the prefix into other
        # pages, then the same suffix step.
        i = n_prefixes - 1
        model.forward(prefixes_d[i], 0, kv, t_ref)
        logits_ref = model.forward(suffix_d, P, kv, t_ref)
        sync(dev)
        # Bit-exactness is a property of the restored pages; the logits are
        # identical when the whole prefix was restored (with a recomputed tail
        # the tail's GEMMs have other shapes and may round differently).
        kv_exact = all(torch.equal(kv[l][:, t_load[:n_loaded]], kv[l][:, t_ref[:n_loaded]]) for l in range(a.layers))
        kv_equal_saved = all(exact_saved)
        logits_tutti = last["logits"]
        logits_equal = torch.equal(logits_tutti, logits_ref)
        logits_full = recompute_runs[-1]["logits"]
        diff = (logits_tutti - logits_full).abs().max().item()

        ttft_t = median([r["ttft_ms"] for r in tutti_runs])
        ttft_r = median([r["ttft_ms"] for r in recompute_runs])
        loaded_bytes = n_loaded * geom.page_bytes_per_layer * a.layers
        bd = [r["breakdown"] for r in tutti_runs]
        rbd = [r["breakdown"] for r in recompute_runs]
        paced = [b["load_ms_per_layer"] for b in bd if b["load_ms_per_layer"] is not None]
        load_per_layer = median(paced) if paced else None
        compute_per_layer = median([b["compute_ms_per_layer"] for b in rbd])
        report.update(
            tutti_ttft_ms=rounded([r["ttft_ms"] for r in tutti_runs]),
            recompute_ttft_ms=rounded([r["ttft_ms"] for r in recompute_runs]),
            tutti_ttft_median_ms=ttft_t, recompute_ttft_median_ms=ttft_r, speedup=ttft_r / ttft_t,
            kv_bit_exact_vs_recompute=kv_exact, kv_bit_exact_vs_saved=kv_equal_saved,
            kv_bit_exact_vs_saved_per_rep=exact_saved,
            logits_equal_vs_recompute=logits_equal,
            logits_max_abs_diff_vs_recompute=(logits_tutti - logits_ref).abs().max().item(),
            logits_max_abs_diff_vs_one_pass=diff, logits_max_abs_one_pass=logits_full.abs().max().item(),
            logits_argmax_equal_one_pass=bool(logits_tutti.argmax() == logits_full.argmax()),
            # Restored bytes over the whole TTFT (a lower bound of the read rate).
            restored_gbps=loaded_bytes / (ttft_t / 1e3) / 1e9,
            # Over the time until the last layer's KV let the stream go on.
            load_gbps=loaded_bytes / (max(median([b["last_layer_ready_ms"] for b in bd]), 1e-3) / 1e3) / 1e9,
            load_ms_per_layer=load_per_layer, recompute_ms_per_layer=compute_per_layer,
            tutti_runs=[dict(ttft_ms=round(r["ttft_ms"], 3), start_load_ms=round(r["start_load_ms"], 3),
                             host_launch_ms=round(r["host_launch_ms"], 3), planned_blocks=r["planned"],
                             loaded_blocks=r["loaded"], **{k: (round(v, 3) if isinstance(v, float) else v)
                                                           for k, v in r["breakdown"].items() if k != "per_layer"})
                        for r in tutti_runs],
            recompute_runs=[dict(ttft_ms=round(r["ttft_ms"], 3), **{k: (round(v, 3) if isinstance(v, float) else v)
                                                                    for k, v in r["breakdown"].items()
                                                                    if k != "per_layer_compute_ms"})
                            for r in recompute_runs],
            # Per layer, for the repetition with the median TTFT.
            tutti_per_layer=sorted(tutti_runs, key=lambda r: r["ttft_ms"])[len(tutti_runs) // 2]["breakdown"]["per_layer"],
            recompute_per_layer_ms=sorted(recompute_runs, key=lambda r: r["ttft_ms"])[len(recompute_runs) // 2]
            ["breakdown"]["per_layer_compute_ms"],
            stats=store.stats().as_dict(),
            wall_s=round(time.perf_counter() - t_start, 1),
        )
        self.compute_per_layer, self.kv_equal_saved, self.kv_exact = compute_per_layer, kv_equal_saved, kv_exact
        self.load_per_layer, self.logits_equal, self.planned = load_per_layer, logits_equal, planned
        self.ttft_r, self.ttft_t = ttft_r, ttft_t

    def summary(self):
        """Prints the report, its breakdown and the summary line; returns the exit status."""
        a, planned, chain_len, kv_exact = self.a, self.planned, self.chain_len, self.kv_exact
        kv_equal_saved, report, logits_equal = self.kv_equal_saved, self.report, self.logits_equal
        load_per_layer, path, ttft_t, ttft_r = self.load_per_layer, self.path, self.ttft_t, self.ttft_r
        compute_per_layer = self.compute_per_layer
        print(json.dumps(report, indent=2))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=2)
        print(breakdown_text(report))
        full = planned == chain_len
        ok = kv_exact and kv_equal_saved and report["loaded_blocks"] == planned and (logits_equal or not full)
        per_layer = "" if load_per_layer is None else f"load {load_per_layer:.1f} ms/layer, "
        print(f"\nrequest 2 TTFT (warm, median of {a.reps}): tutti ({path} path, {planned}/{chain_len} blocks, "
              f"{report['load_gbps']:.2f} GB/s) {ttft_t:.1f} ms vs recompute {ttft_r:.1f} ms (x{ttft_r / ttft_t:.2f}); "
              f"{per_layer}recompute {compute_per_layer:.1f} ms/layer; "
              f"KV bit-exact: {kv_exact and kv_equal_saved}; logits equal: {logits_equal}")
        return 0 if ok else 1


def main(argv=None):
    a = parse_args(argv)
    if torch is None:
        print("llama_loop: torch is not installed; this example runs on the GPU machine", file=sys.stderr)
        return 2
    dev, dtype = torch.device(a.device), torch.bfloat16
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("llama_loop: no CUDA device visible to torch", file=sys.stderr)
        return 2
    from llama_model import Llama  # needs torch
    run = Loop(a, dev, dtype, Llama)
    run.connect_any()
    try:
        run.make_prompts()
        run.save_prefixes()
        run.check_lookups()
        run.check_pool_files()
        run.run_requests()
        run.finish()
    finally:
        run.close()
        if run.own_dirs:
            for d in run.dirs:
                shutil.rmtree(d, ignore_errors=True)
    return run.summary()


if __name__ == "__main__":
    sys.exit(main())
