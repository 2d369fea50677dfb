#!/usr/bin/env python3
"""A Llama-shaped PyTorch model loop whose prefix KV is restored by tutti.

The model has Llama's structure (token embedding; per layer RMSNorm, Q/K/V
projections with grouped-query attention, rotary embeddings, causal attention
over a paged KV cache, output projection, RMSNorm, SwiGLU MLP; final norm and
LM head) with random weights. Its KV cache is paged like vLLM's: one tensor
per layer shaped [2, num_pages, page_tokens, kv_heads, head_dim], a block
table per request.

1. Request 1 prefills a prompt (prefix) and saves its KV through tutti
   (TuttiConnector: save_kv_layer per layer, wait_for_save, then the store's
   wait_saves makes it durable).
2. Request 2 is the same prefix plus a new suffix. Tutti looks it up, loads
   the prefix KV into fresh pages layer by layer (start_load_kv, then
   wait_for_layer_load(l) before layer l's attention), and the model
   prefills only the suffix.
3. The reference recomputes: prefix prefill into other pages, then the same
   suffix step. The restored KV must equal the reference KV byte for byte and
   the logits must be identical (torch.equal). One-pass recomputation of the
   whole prompt (the TTFT baseline) is also compared, with a tolerance, since
   different GEMM shapes may round differently.

TTFT of request 2 (load + suffix prefill, median of --reps runs) is reported
against one-pass recomputation of the whole prompt.

Path: --path gpu registers the CUDA cache with tutti (GPU-driven io_uring and
scatter kernels); --path cpu registers a pinned host mirror (io_uring from
the library's threads) and copies each layer to the GPU after it arrives;
--path auto (default) tries gpu and falls back to cpu, saying so.

Exit status: 0 when KV is bit-exact and logits equal; 1 otherwise; 2 when
torch or CUDA is missing (the message says which).
"""

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import tutti  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
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
    p.add_argument("--reps", type=int, default=3, help="timed repetitions (median reported)")
    p.add_argument("--path", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--dir", action="append", help="store directory (repeat to stripe); default: a temporary one")
    p.add_argument("--capacity-gib", type=float, default=0, help="store capacity; default: 2x the prefix KV")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the report here too")
    p.add_argument("--wait", choices=("auto", "host", "stream"), default="auto",
                   help="GPU path: wait for a layer on the host, or make torch's stream wait (auto: stream)")
    p.add_argument("--device", default="cuda", help="torch device; 'cpu' only smoke-tests the flow (tiny shapes)")
    return p.parse_args(argv)


class Llama:
    """Random-weight Llama-shaped decoder over a paged KV cache."""

    def __init__(self, a, device, dtype):
        self.a, self.device, self.dtype = a, device, dtype
        g = torch.Generator(device=device).manual_seed(a.seed)

        def w(*shape, fan_in):
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) / math.sqrt(fan_in)).to(dtype)

        H, D, KVH = a.heads, a.head_dim, a.kv_heads
        self.embed = w(a.vocab, a.hidden, fan_in=1)
        self.layers = []
        for _ in range(a.layers):
            self.layers.append(dict(
                ln1=torch.ones(a.hidden, device=device, dtype=dtype),
                wq=w(a.hidden, H * D, fan_in=a.hidden), wk=w(a.hidden, KVH * D, fan_in=a.hidden),
                wv=w(a.hidden, KVH * D, fan_in=a.hidden), wo=w(H * D, a.hidden, fan_in=H * D),
                ln2=torch.ones(a.hidden, device=device, dtype=dtype),
                wg=w(a.hidden, a.intermediate, fan_in=a.hidden), wu=w(a.hidden, a.intermediate, fan_in=a.hidden),
                wd=w(a.intermediate, a.hidden, fan_in=a.intermediate),
            ))
        self.lnf = torch.ones(a.hidden, device=device, dtype=dtype)
        self.lm_head = w(a.hidden, a.vocab, fan_in=a.hidden)
        inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
        self.inv_freq = inv

    @staticmethod
    def rms(x, wt, eps=1e-5):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * wt

    def rope(self, x, pos):
        f = torch.outer(pos.float(), self.inv_freq)  # [T, D/2]
        cos, sin = f.cos()[:, None, :], f.sin()[:, None, :]
        x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
        return out.to(x.dtype)

    def forward(self, tokens, start, kv, table, before_attn=None, after_attn=None):
        """Prefills `tokens` at positions [start, start+T) whose earlier KV
        (positions < start) is already in the pages of `table`; writes the new
        KV into the cache and returns the last position's logits."""
        a = self.a
        T, PT = tokens.numel(), a.page_tokens
        H, KVH, D = a.heads, a.kv_heads, a.head_dim
        pos = torch.arange(start, start + T, device=self.device)
        ctx = start + T
        page_of = table[pos // PT]
        slot_of = pos % PT
        ctx_pages = table[: (ctx + PT - 1) // PT]
        if T == ctx:
            mask = None
        else:
            kpos = torch.arange(ctx, device=self.device)
            mask = kpos[None, :] <= pos[:, None]  # [T, ctx]
        h = self.embed[tokens]
        for l, L in enumerate(self.layers):
            x = self.rms(h, L["ln1"])
            q = self.rope((x @ L["wq"]).view(T, H, D), pos)
            k = self.rope((x @ L["wk"]).view(T, KVH, D), pos)
            v = (x @ L["wv"]).view(T, KVH, D)
            if before_attn:
                before_attn(l)  # the earlier KV of this layer must be in place from here on
            cache = kv[l]
            cache[0, page_of, slot_of] = k
            cache[1, page_of, slot_of] = v
            K = cache[0, ctx_pages].reshape(-1, KVH, D)[:ctx]
            V = cache[1, ctx_pages].reshape(-1, KVH, D)[:ctx]
            K = K.repeat_interleave(H // KVH, dim=1)
            V = V.repeat_interleave(H // KVH, dim=1)
            o = attention(q.transpose(0, 1), K.transpose(0, 1), V.transpose(0, 1), mask)
            h = h + o.transpose(0, 1).reshape(T, H * D) @ L["wo"]
            if after_attn:
                after_attn(l)
            x = self.rms(h, L["ln2"])
            h = h + (F.silu(x @ L["wg"]) * (x @ L["wu"])) @ L["wd"]
        return (self.rms(h[-1:], self.lnf) @ self.lm_head).float()[0]


def attention(q, k, v, mask):
    """Causal attention of q [H, T, D] over k, v [H, ctx, D]; mask [T, ctx]
    (True = attend) or None for a full causal prefill (T == ctx)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=None if mask is None else mask[None, None],
                                              is_causal=mask is None)[0]
    # torch < 2.0 (CPU smoke tests only)
    T, ctx = q.shape[1], k.shape[1]
    if mask is None:
        mask = torch.ones(T, ctx, dtype=torch.bool, device=q.device).tril()
    s = (q.float() @ k.float().transpose(1, 2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask[None], float("-inf"))
    return (s.softmax(-1) @ v.float()).to(q.dtype)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_ms(fn):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, (time.perf_counter() - t0) * 1e3


def main(argv=None):
    a = parse_args(argv)
    if torch is None:
        print("llama_loop: torch is not installed; this example runs on the GPU machine", file=sys.stderr)
        return 2
    dev, dtype = torch.device(a.device), torch.bfloat16
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("llama_loop: no CUDA device visible to torch", file=sys.stderr)
        return 2
    PT = a.page_tokens
    block_tokens = PT * a.chunk_pages
    if a.prefix_tokens % block_tokens:
        a.prefix_tokens -= a.prefix_tokens % block_tokens
        print(f"prefix rounded down to {a.prefix_tokens} tokens (whole chain blocks of {block_tokens})")
    P, S = a.prefix_tokens, a.suffix_tokens
    pages_per_req = (P + S + PT - 1) // PT
    # Four page sets: request 1, request 2 (tutti), the two-step reference, one-pass recompute.
    num_pages = 4 * pages_per_req
    geom = tutti.Geometry(layers=a.layers, kv_heads=a.kv_heads, head_dim=a.head_dim, dtype="bf16",
                          planes=2, page_tokens=PT, chunk_pages=a.chunk_pages)
    prefix_kv_bytes = P // PT * geom.page_bytes_per_layer * a.layers
    capacity = int(a.capacity_gib * (1 << 30)) or max(2 * prefix_kv_bytes, 64 << 20)

    model = Llama(a, dev, dtype)
    shape = geom.tensor_shape("per_layer", num_pages)
    kv = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(a.layers)]
    names = [f"model.layers.{l}.self_attn.attn" for l in range(a.layers)]
    tables = [torch.arange(i * pages_per_req, (i + 1) * pages_per_req, device=dev, dtype=torch.long) for i in range(4)]

    dirs = a.dir or [tempfile.mkdtemp(prefix="tutti-llama-")]
    own_dirs = a.dir is None
    report = dict(model=dict(layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim,
                             intermediate=a.intermediate, vocab=a.vocab, dtype="bf16"),
                  prefix_tokens=P, suffix_tokens=S, page_tokens=PT, chunk_pages=a.chunk_pages,
                  prefix_kv_bytes=prefix_kv_bytes, dirs=dirs,
                  device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", torch=torch.__version__)

    def open_store(path):
        for d in dirs:  # a fresh store for each attempt
            for e in os.listdir(d):
                p = os.path.join(d, e)
                shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
        return tutti.Store(dirs, capacity, geom, num_pages, layout="per_layer", path=path)

    def connect(path):
        """Opens a store on `path` and registers the KV memory with a
        connector: the CUDA cache on the GPU path, a pinned host mirror of it
        on the CPU path (tutti's CPU path reads and writes host memory)."""
        store = open_store(path)
        try:
            stream_wait = None if a.wait == "auto" else (a.wait == "stream" and path == "gpu")
            conn = tutti.TuttiConnector(store, layer_names=names, hash_seed=0x11A3A, stream_wait=stream_wait)
            host = None
            if path == "gpu":
                conn.register_kv_caches(dict(zip(names, kv)))
            else:
                host = [torch.zeros(shape, dtype=dtype, pin_memory=dev.type == "cuda") for _ in range(a.layers)]
                conn.register_kv_caches(dict(zip(names, host)))
            return store, conn, host
        except BaseException:
            store.close()
            raise

    path = a.path
    if path == "auto":
        path = "gpu" if dev.type == "cuda" else "cpu"
    try:
        store, conn, host = connect(path)
    except (tutti.NoGPU, tutti.NotSupported) as e:
        if a.path != "auto":
            raise
        report["fallback"] = f"GPU path unavailable ({type(e).__name__}: {e}); using the CPU path"
        print("fallback:", report["fallback"])
        path = "cpu"
        store, conn, host = connect(path)
    report["path"] = path
    report["layer_wait"] = "stream" if conn.stream_wait else "host"

    try:
        g = torch.Generator(device="cpu").manual_seed(a.seed + 1)
        prefix = torch.randint(0, a.vocab, (P,), generator=g)
        suffix = torch.randint(0, a.vocab, (S,), generator=g)
        prompt2 = torch.cat([prefix, suffix])
        prefix_d, suffix_d, prompt2_d = prefix.to(dev), suffix.to(dev), prompt2.to(dev)
        n_pages_prefix = P // PT
        chain_len = P // block_tokens

        # -- request 1: prefill the prefix, save its KV through the connector.
        t1 = tables[0]
        page_ids_1 = t1[:n_pages_prefix].tolist()
        conn.bind_connector_metadata(tutti.ConnectorMetadata(saves=[tutti.ReqMeta("r1", page_ids_1, token_ids=prefix.tolist())]))
        conn.start_load_kv()

        def save_hook(l):
            if host is not None:  # CPU path: the host mirror is what tutti saves
                host[l][:, page_ids_1] = kv[l][:, t1[:n_pages_prefix]].cpu()
            # GPU path: the connector syncs torch's stream before tutti gathers.
            conn.save_kv_layer(names[l], kv[l], None)

        _, ms_req1 = timed_ms(lambda: model.forward(prefix_d, 0, kv, t1, after_attn=save_hook))
        conn.wait_for_save()
        conn.get_finished({"r1"})
        conn.clear_connector_metadata()
        store.wait_saves()
        report["request1_prefill_ms"] = ms_req1

        # -- scheduler: how much of request 2 can tutti supply?
        class Req:
            prompt_token_ids = prompt2.tolist()
        matched, _ = conn.get_num_new_matched_tokens(Req, 0)
        report["matched_tokens"] = matched
        if matched < P:
            raise SystemExit(f"lookup found {matched} tokens of the {P}-token prefix: the save did not land")

        # -- request 2 through tutti: load the prefix layer by layer, prefill the suffix.
        t2 = tables[1]
        page_ids_2 = t2[:n_pages_prefix].tolist()

        def tutti_request():
            for t in kv:
                t[:, t2] = 0  # every rep starts from zeroed destination pages
            sync()
            t0 = time.perf_counter()
            conn.bind_connector_metadata(tutti.ConnectorMetadata(loads=[
                tutti.ReqMeta("r2", page_ids_2, token_ids=prompt2.tolist(), num_tokens=P)]))
            conn.start_load_kv()
            # The scheduler may leave a stored tail to recompute when that is
            # faster: the model computes every token past the planned blocks.
            planned = conn.planned_blocks["r2"]
            start = planned * block_tokens
            n_loaded_pages = planned * a.chunk_pages

            def wait_hook(l):
                conn.wait_for_layer_load(names[l])
                if host is not None and n_loaded_pages:
                    kv[l][:, t2[:n_loaded_pages]] = host[l][:, page_ids_2[:n_loaded_pages]].to(dev, non_blocking=True)

            logits = model.forward(prompt2_d[start:], start, kv, t2, before_attn=wait_hook)
            sync()
            ms = (time.perf_counter() - t0) * 1e3
            conn.get_finished(set())
            conn.clear_connector_metadata()
            return logits, ms, planned

        tutti_runs = [tutti_request() for _ in range(a.reps)]
        logits_tutti = tutti_runs[-1][0]
        report["tutti_ttft_ms"] = [r[1] for r in tutti_runs]
        report["loaded_blocks"] = conn.loaded_blocks.get("r2")
        report["planned_blocks"] = [r[2] for r in tutti_runs]
        report["chain_blocks"] = chain_len
        planned = tutti_runs[-1][2]
        n_loaded = planned * a.chunk_pages
        if planned < chain_len:
            print(f"note: the scheduler loaded {planned} of {chain_len} stored blocks and left the rest to recompute")
        report["load_errors"] = sorted(conn.get_block_ids_with_load_errors())

        # -- reference: recompute the prefix into other pages, then the same suffix step.
        t3 = tables[2]

        def two_step():
            model.forward(prefix_d, 0, kv, t3)
            return model.forward(suffix_d, P, kv, t3)

        logits_ref, _ = timed_ms(two_step)
        # Bit-exactness is a property of the restored pages; the logits are
        # identical when the whole prefix was restored (with a recomputed tail
        # the tail's GEMMs have other shapes and may round differently).
        kv_exact = all(torch.equal(kv[l][:, t2[:n_loaded]], kv[l][:, t3[:n_loaded]]) for l in range(a.layers))
        kv_equal_req1 = all(torch.equal(kv[l][:, t2[:n_loaded]], kv[l][:, t1[:n_loaded]]) for l in range(a.layers))
        logits_equal = torch.equal(logits_tutti, logits_ref)
        logits_ref_diff = (logits_tutti - logits_ref).abs().max().item()

        # -- TTFT baseline: one-pass recomputation of the whole prompt.
        t4 = tables[3]
        recompute_runs = [timed_ms(lambda: model.forward(prompt2_d, 0, kv, t4)) for _ in range(a.reps)]
        logits_full = recompute_runs[-1][0]
        report["recompute_ttft_ms"] = [r[1] for r in recompute_runs]
        diff = (logits_tutti - logits_full).abs().max().item()
        scale = logits_full.abs().max().item()

        ttft_t = statistics.median(report["tutti_ttft_ms"])
        ttft_r = statistics.median(report["recompute_ttft_ms"])
        report.update(
            kv_bit_exact_vs_recompute=kv_exact, kv_bit_exact_vs_saved=kv_equal_req1,
            logits_equal_vs_recompute=logits_equal, logits_max_abs_diff_vs_recompute=logits_ref_diff,
            logits_max_abs_diff_vs_one_pass=diff, logits_max_abs_one_pass=scale,
            logits_argmax_equal_one_pass=bool(logits_tutti.argmax() == logits_full.argmax()),
            tutti_ttft_median_ms=ttft_t, recompute_ttft_median_ms=ttft_r, speedup=ttft_r / ttft_t,
            restored_gbps=n_loaded * geom.page_bytes_per_layer * a.layers / (ttft_t / 1e3) / 1e9,
            stats=store.stats(),
        )
    finally:
        store.close()
        if own_dirs:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)

    print(json.dumps(report, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    print(f"\nrequest 2 TTFT: tutti ({path} path, {planned}/{chain_len} blocks loaded) {ttft_t:.1f} ms vs recompute "
          f"{ttft_r:.1f} ms (x{ttft_r / ttft_t:.2f}); KV bit-exact: {kv_exact and kv_equal_req1}; logits equal: {logits_equal}")
    full = planned == chain_len
    ok = kv_exact and kv_equal_req1 and report["loaded_blocks"] == planned and (logits_equal or not full)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
