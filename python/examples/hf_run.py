"""The runs of hf_serve.py: one model, every prefix, storage and path.

Kept apart from the command line so that hf_serve.py stays a thin driver.
Memory per prefix of P tokens (bytes of KV = K): the model's weights, A's
cache (K, kept as the source of truth and the reference's cache), the page
pool (K, on the GPU or pinned on the host), B's cache (K) and, for one-pass
recomputation, one more cache (K) after B's is freed.
"""

import os
import shutil
import time


MODELS = {
    # Llama-3-8B's shape (meta-llama/Meta-Llama-3-8B config.json).
    "llama3-8b": dict(arch="llama", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, num_hidden_layers=32, vocab_size=128256,
                      max_position_embeddings=131072 + 4096, rope_theta=500000.0, rms_norm_eps=1e-5),
    # Qwen2-7B's shape (Qwen/Qwen2-7B config.json): another KV shape (4 KV heads, 28 layers).
    "qwen2-7b": dict(arch="qwen2", hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                     num_key_value_heads=4, num_hidden_layers=28, vocab_size=152064,
                     max_position_embeddings=131072 + 4096, rope_theta=1000000.0, rms_norm_eps=1e-6),
}


def build_model(name, seed, layers=None):
    import torch
    import transformers

    spec = dict(MODELS[name])
    arch = spec.pop("arch")
    if layers:
        spec["num_hidden_layers"] = layers
    cfg_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                          "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[arch]
    cfg = cfg_cls(**spec)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = model_cls(cfg).to(torch.bfloat16).eval()
    return cfg, model


def decoder_layers(model):
    return model.model.layers


class Caches:
    """StaticCache construction (transformers' own) for a model."""

    def __init__(self, cfg, max_len):
        self.cfg, self.max_len = cfg, max_len

    def new(self):
        import torch
        from transformers import StaticCache

        c = StaticCache(config=self.cfg, max_cache_len=self.max_len)
        heads = self.cfg.num_key_value_heads
        dim = getattr(self.cfg, "head_dim", None) or self.cfg.hidden_size // self.cfg.num_attention_heads
        if hasattr(c, "early_initialization"):
            c.early_initialization(batch_size=1, num_heads=heads, head_dim=dim, dtype=torch.bfloat16, device="cuda")
        return c


def forward(model, ids, cache, start):
    import torch

    pos = torch.arange(start, start + ids.shape[1], device=ids.device)
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True, cache_position=pos, logits_to_keep=1)
    return out.logits[:, -1, :].float()


def greedy_pair(model, ca, cb, la, lb, start, steps):
    """Greedy decoding from two caches in lockstep. Returns both token lists
    and where their logits first differ bitwise: the step, the largest
    difference there, and whether the two caches were equal over every
    attended position before it (equal caches and unequal logits mean the
    decode step itself is not bitwise repeatable)."""
    import torch

    ta, tb, where = [], [], dict(logits_apart_at=None, caches_equal_before=None, logits_diff_there=None)
    for i in range(steps):
        if where["logits_apart_at"] is None and not torch.equal(la, lb):
            where.update(logits_apart_at=i, caches_equal_before=_caches_equal(ca, cb, start + i),
                         logits_diff_there=float((la - lb).abs().max()))
        ta.append(int(torch.argmax(la, dim=-1).item()))
        tb.append(int(torch.argmax(lb, dim=-1).item()))
        if i + 1 < steps:
            la = forward(model, torch.tensor([[ta[-1]]], device="cuda"), ca, start + i)
            lb = forward(model, torch.tensor([[tb[-1]]], device="cuda"), cb, start + i)
    return ta, tb, where


def greedy(model, cache, first_logits, start, steps):
    import torch

    toks, logits = [], first_logits
    for i in range(steps):
        t = int(torch.argmax(logits, dim=-1).item())
        toks.append(t)
        logits = forward(model, torch.tensor([[t]], device="cuda"), cache, start + i)
    return toks


class Hooks:
    """Forward hooks on every decoder layer; removed by close()."""

    def __init__(self):
        self.handles = []

    def pre(self, layers, fn):
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(lambda m, a, i=i: fn(i)))

    def post(self, layers, fn):
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_hook(lambda m, a, o, i=i: fn(i)))

    def close(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def sync():
    import torch

    torch.cuda.synchronize()




def _kv_bytes(cfg, tokens):
    heads = cfg.num_key_value_heads
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return cfg.num_hidden_layers * 2 * tokens * heads * dim * 2


PAGE_TOKENS = 16  # vLLM's block size; one chain block per page, as the vLLM connector stores them
SAVE_BOUND_MS = 120_000  # A's whole save admitted (see _open_worker)
WARM_TOKENS = 32768  # prefixes up to this get an untimed first pass of recompute and of the store's load




def _pool(cfg, num_pages, device):
    """The engine-layout page pool, one (2, pages, 16, kv_heads, head_dim) tensor per layer."""
    import torch

    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    shape = (2, num_pages, PAGE_TOKENS, cfg.num_key_value_heads, dim)
    if device == "cuda":
        return [torch.empty(shape, dtype=torch.bfloat16, device="cuda") for _ in range(cfg.num_hidden_layers)]
    return [torch.empty(shape, dtype=torch.bfloat16).pin_memory() for _ in range(cfg.num_hidden_layers)]


def _layer_name(i):
    return f"model.layers.{i}.self_attn"


def _open_worker(dirs, pool, path, capacity, host_staging_bytes=None):
    """tutti's worker side (the vLLM connector's) over the pool: layer
    registration from the tensors' shapes and strides, loads, waits, saves.
    Path "staged": the CPU path on the GPU pool through host staging of
    ``host_staging_bytes`` (tutti.hoststage), as vLLM's path "cpu" runs."""
    from tutti import GPUOptions, SchedOptions, Store, worker_side

    def opener(lay):
        # A restore moves the whole prefix at once: no cut below the pool's pages.
        # B needs all of A's prefix: a save bound far above the default 2 s, which an
        # unlearned device model (seeded low) would hold a 16 GiB save to, cutting the rest.
        return Store(dirs, capacity, lay.geometry, lay.num_pages, layout=lay.layout, path="cpu" if path == "staged" else path,
                     gpu=GPUOptions(max_pages=lay.num_pages), sched=SchedOptions(save_bound_ms=SAVE_BOUND_MS))

    w = worker_side.WorkerSide(opener)
    try:
        w.register({_layer_name(i): t for i, t in enumerate(pool)}, block_size=PAGE_TOKENS,
                   host_staging_bytes=host_staging_bytes if path == "staged" else None)
    except BaseException:
        w.close()
        raise
    return w


def _clear(dirs):
    for d in dirs:
        for name in os.listdir(d):
            p = os.path.join(d, name)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)


def run_model(name, args, prefixes, storages, paths):
    import torch
    from tutti import hfcache

    cfg, model = build_model(name, args.seed, args.layers or None)
    layers = decoder_layers(model)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    # Warm-up: CUDA's lazy loading, cuBLAS heuristics and SDPA kernels before anything is timed.
    warm = Caches(cfg, 1024 + args.suffix)
    forward(model, torch.randint(0, cfg.vocab_size, (1, 1024), generator=gen).cuda(), warm.new(), 0)
    del warm
    for P in prefixes:
        try:
            yield from _run_prefix(name, args, cfg, model, layers, gen, P, storages, paths, hfcache)
        except torch.cuda.OutOfMemoryError as e:
            # "Where memory allows": the prefix is reported as not run, with what ran out; the next one runs.
            yield dict(model=name, prefix=P, kind="skipped", ok=True,
                       why=f"out of GPU memory at {P} tokens: {str(e).splitlines()[0]}")
        torch.cuda.empty_cache()


def _run_prefix(name, args, cfg, model, layers, gen, P, storages, paths, hfcache):
    import torch
    import tutti
    from tutti import worker_side

    S = args.suffix
    caches = Caches(cfg, P + S + args.decode + 16)
    prompt = torch.randint(0, cfg.vocab_size, (1, P + S), generator=gen).cuda()
    prefix, suffix = prompt[:, :P], prompt[:, P:]
    chain = tutti.chain_from_tokens(prefix[0].tolist(), PAGE_TOKENS, seed=args.seed)
    table = hfcache.BlockTable(-(-P // PAGE_TOKENS), PAGE_TOKENS)
    pages = table.allocate(P)
    kv_bytes = _kv_bytes(cfg, P)
    base = dict(model=name, prefix=P, suffix=S, kv_gib=round(kv_bytes / 2**30, 3), layers=cfg.num_hidden_layers)

    # Request A: prefill the prefix into its own cache (kept as the truth).
    cache_a = caches.new()
    sync()
    t0 = time.perf_counter()
    forward(model, prefix, cache_a, 0)
    sync()
    prefill_ms = (time.perf_counter() - t0) * 1e3

    # Is prefill bitwise repeatable here? A second prefill of the same prefix,
    # compared with A's cache, then freed (reported: when it is not, only a
    # reference built from A's own cache can be bit-exact).
    prefill_repeatable = None  # not tried past WARM_TOKENS: a long prefill's time goes to the runs
    if P <= WARM_TOKENS:
        cache_2 = caches.new()
        forward(model, prefix, cache_2, 0)
        prefill_repeatable = _caches_equal(cache_a, cache_2, P)
        del cache_2

    # Reference: the same model, the prefix in its cache (A's prefill, copied
    # into a fresh cache), then the suffix.
    cache_ref = _clone_cache(caches, cache_a, P)
    logits_ref = forward(model, suffix, cache_ref, P)

    # One-pass recomputation of the whole prompt: B's TTFT baseline (a first,
    # untimed pass up to WARM_TOKENS so that its kernels are chosen and loaded).
    if P <= WARM_TOKENS:
        cache_1 = caches.new()
        forward(model, prompt, cache_1, 0)
        del cache_1
    cache_1 = caches.new()
    sync()
    t0 = time.perf_counter()
    logits_1 = forward(model, prompt, cache_1, 0)
    sync()
    recompute_ms = (time.perf_counter() - t0) * 1e3
    del cache_1
    torch.cuda.empty_cache()

    checked = False
    for storage, dirs in storages:
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        _clear(dirs)
        capacity = int(kv_bytes * 1.25) + (256 << 20)
        saved_by = None
        for path in paths:
            pool = _pool(cfg, table.num_pages, "cpu" if path == "cpu" else "cuda")
            kv = _open_worker(dirs, pool, path, capacity, args.host_staging_bytes)
            try:
                if saved_by is None:
                    # A's save: each layer's KV into the pool and saved per layer (the
                    # run is written once the last layer is in), then made durable.
                    t0 = time.perf_counter()
                    kv.bind(saves=[worker_side.SaveSpec("A", chain, pages)])
                    for i, layer in enumerate(cache_a.layers):
                        hfcache.cache_to_pages(layer.keys, layer.values, pool[i], pages, P, name=f"layer {i}")
                        kv.save_layer(_layer_name(i))
                    kv.wait_for_save()
                    kv.store.wait_saves()
                    kv.unbind()
                    save_ms = (time.perf_counter() - t0) * 1e3
                    saved_by = path
                    yield dict(base, kind="save", storage=storage, path=path, save_ms=save_ms,
                               save_gbps=kv_bytes / save_ms / 1e6, prefill_ms=prefill_ms, ok=True)
                _poison(pool, path)
                cold_ms = None
                if P <= WARM_TOKENS:
                    # The store's first load pays one-time set-up (an engine pays it once, at its first
                    # request): timed apart, and the load measured is the second.
                    cold = _restore_b(kv, model, layers, caches, chain, pages, P, suffix, pool, path, hfcache)
                    cold_ms = cold["ttft_ms"]
                    del cold
                    _poison(pool, path)
                rec = _restore_b(kv, model, layers, caches, chain, pages, P, suffix, pool, path, hfcache)
                rec["cold_ttft_ms"] = cold_ms
                ok, why = rec.pop("ok"), rec.pop("why")
                kv_equal = _pool_equals_cache(pool, pages, cache_a, P, hfcache)
                logits_b = rec.pop("logits")
                logits_equal = bool(torch.equal(logits_b, logits_ref))
                ok = ok and kv_equal and logits_equal
                if not kv_equal:
                    why += " restored KV differs from the saved KV;"
                if not logits_equal:
                    why += " B's logits differ from prefix-then-suffix;"
                cache_b = rec.pop("cache")
                if not checked:
                    yield _checks(base, args, caches, model, cache_a, cache_b, cache_ref, logits_b, logits_ref, logits_1, P, S,
                                  kv_equal, logits_equal, prefill_repeatable)
                    checked = True
                del cache_b
                rec.update(base, kind="ttft", storage=storage, path=path, recompute_ms=recompute_ms,
                           speedup=recompute_ms / rec["ttft_ms"], kv_equal=kv_equal, logits_equal=logits_equal,
                           ok=ok, why=why.strip(), stats=kv.store.stats().as_dict(), staging=kv.take_stats())
                yield rec
            finally:
                kv.close()
            del pool
            torch.cuda.empty_cache()
        _clear(dirs)


def _restore_b(kv, model, layers, caches, chain, pages, P, suffix, pool, path, hfcache):
    """Request B: tutti restores the prefix while the model runs the suffix;
    before each decoder layer the model waits for that layer's restore (GPU
    path: its stream waits; CPU path: this thread) and moves its pages into
    B's StaticCache."""
    from tutti import worker_side

    cache_b = caches.new()
    hooks = Hooks()
    waits = [0.0] * len(layers)

    def before_layer(i):
        t = time.perf_counter()
        kv.wait_for_layer(_layer_name(i))
        waits[i] = time.perf_counter() - t
        lk = cache_b.layers[i]
        hfcache.pages_to_cache(pool[i], pages, lk.keys, lk.values, P, name=f"layer {i}")

    # Every layer's fill counter before the forward, not in its hook: the
    # model reads the cache's length (its positions and mask) before layer 0.
    for lk in cache_b.layers:
        hfcache.set_filled_tokens(lk, P)

    hooks.pre(layers, before_layer)
    kv.bind(loads=[worker_side.LoadSpec("B", chain, 0, pages)])
    try:
        sync()
        t0 = time.perf_counter()
        kv.start_load()
        logits = forward(model, suffix, cache_b, P)
        logits_host = logits.cpu()  # the first token's logits on the host: TTFT ends here
        ttft_ms = (time.perf_counter() - t0) * 1e3
        res = kv.finish_step()
        restore_ms = (time.perf_counter() - t0) * 1e3
    finally:
        hooks.close()
        kv.unbind()
    restored = res.restored_blocks.get("B", 0)
    ok = restored == len(chain) and not res.error_block_ids and not res.failures
    why = "" if ok else f"restored {restored} of {len(chain)} blocks, {len(res.error_block_ids)} load errors {res.failures};"
    return dict(ttft_ms=ttft_ms, restore_done_ms=restore_ms, blocks=len(chain), restored_blocks=restored,
                host_wait_ms=sum(waits) * 1e3, logits=logits_host.cuda(), cache=cache_b, ok=ok, why=why)


def _pool_equals_cache(pool, pages, cache, P, hfcache):
    import torch

    for i, layer in enumerate(cache.layers):
        want = torch.empty((2, pool[i].shape[1]) + tuple(pool[i].shape[2:]), dtype=pool[i].dtype, device="cuda")
        hfcache.cache_to_pages(layer.keys, layer.values, want, pages, P, name=f"layer {i}")
        got = pool[i].to("cuda", non_blocking=True)
        if not torch.equal(got[:, pages[0]:pages[-1] + 1], want[:, pages[0]:pages[-1] + 1]):
            return False
    return True


def _caches_equal(x, y, n_tokens):
    """Tokens [0, n_tokens) of every layer of two caches, bit for bit."""
    import torch

    return all(torch.equal(a.keys[:, :, :n_tokens], b.keys[:, :, :n_tokens]) and
               torch.equal(a.values[:, :, :n_tokens], b.values[:, :, :n_tokens]) for a, b in zip(x.layers, y.layers))


def _poison(pool, path):
    """Fills the page pool with one constant, so that a page the restore left unwritten fails the bit-exact check."""
    for t in pool:
        t.fill_(7.0 if path == "cpu" else -1.0)


def _clone_cache(caches, src, n_tokens):
    """A fresh cache holding src's tokens [0, n_tokens), its fill counters set."""
    from tutti import hfcache

    dst = caches.new()
    for a, b in zip(src.layers, dst.layers):
        b.keys.copy_(a.keys)
        b.values.copy_(a.values)
        hfcache.set_filled_tokens(b, n_tokens)
    return dst


def _checks(base, args, caches, model, cache_a, cache_b, cache_ref, logits_b, logits_ref, logits_1, P, S, kv_equal, logits_equal,
            prefill_repeatable):
    import torch

    # Where a mismatch comes from (before greedy decoding grows the caches): B's
    # prefix in its own cache against A's, and how far the logits are apart.
    b_prefix_equal = _caches_equal(cache_a, cache_b, P)
    logits_max_diff = float((logits_b - logits_ref).abs().max())
    # The control: the reference's cache cloned and decoded again. Where two
    # identical caches decode apart, decoding itself is not bitwise repeatable
    # on this machine (a kernel's reduction order), not tutti's restore.
    b_attended_equal = _caches_equal(cache_ref, cache_b, P + S)  # the suffix's KV too
    b_buffer_equal = all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
                         for a, b in zip(cache_ref.layers, cache_b.layers))  # every position, attended or not
    cache_r2 = _clone_cache(caches, cache_ref, P + S)
    greedy_b, greedy_r, where = greedy_pair(model, cache_b, cache_ref, logits_b, logits_ref, P + S, args.decode)
    greedy_r2 = greedy(model, cache_r2, logits_ref, P + S, args.decode)
    del cache_r2
    apart = next((i for i, (x, y) in enumerate(zip(greedy_b, greedy_r)) if x != y), None)
    rng = float(logits_ref.max() - logits_ref.min())
    rel = float((logits_1 - logits_ref).abs().max()) / max(rng, 1e-9)
    top1 = bool(torch.argmax(logits_1) == torch.argmax(logits_ref))
    # Greedy tokens must agree, unless decoding is shown not to be bitwise
    # repeatable here: B's cache buffers equal the reference's at every
    # position and their first logits are equal, so both decodes start from the
    # same state and any later difference is the decode kernels' rounding, not
    # anything restored (the control, the reference's clone decoded again,
    # shows the same where it parts).
    greedy_ok = greedy_b == greedy_r or (b_buffer_equal and logits_equal)
    ok = kv_equal and logits_equal and greedy_ok and rel <= args.tolerance
    return dict(base, kind="checks", kv_equal=kv_equal, logits_equal=logits_equal, greedy_equal=greedy_b == greedy_r, greedy_ok=greedy_ok,
                b_prefix_equal=b_prefix_equal, b_attended_equal=b_attended_equal, b_buffer_equal=b_buffer_equal, **where,
                logits_max_diff=logits_max_diff, prefill_repeatable=prefill_repeatable,
                greedy_repeatable=greedy_r == greedy_r2, greedy_apart_at=apart,
                greedy_tokens=greedy_b[:8], onepass_rel_diff=rel, onepass_top1=top1, tolerance=args.tolerance, ok=ok)
