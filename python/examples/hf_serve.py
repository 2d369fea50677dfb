#!/usr/bin/env python3
"""Hugging Face transformers models served on KV that tutti restores.

Builds transformers models from their configs with random bf16 weights
(seeded; no weights are downloaded, the architecture and its kernels are
transformers' own): a Llama-3-8B-shaped ``LlamaForCausalLM`` and a
Qwen2-7B-shaped ``Qwen2ForCausalLM`` (4 KV heads instead of 8, 28 layers).
For each model and prefix length:

1. Request A prefills its prompt (the prefix) into a ``StaticCache``; after
   each decoder layer a forward hook copies that layer's KV into tutti's page
   pool (the engine layout, :mod:`tutti.hfcache`) and the prefix is saved
   through tutti, then made durable.
2. Request B shares A's prefix and adds a suffix. tutti restores the prefix
   into the page pool (GPU path: the GPU-driven restore into HBM; CPU path:
   into pinned host pages, copied to the GPU per layer; staged: the CPU path
   on GPU pages through a bounded pinned pool, tutti.hoststage), and a forward
   pre-hook on each decoder layer waits for that layer's restore (as vLLM's
   ``wait_for_layer_load``) and moves its pages into the model's own
   ``StaticCache``; the model computes only the suffix.
3. Checks: the restored pages equal the saved ones bit for bit; B's logits
   equal those of the same model prefilling the prefix into its cache and then
   the suffix (torch.equal); greedy decoding of 32 tokens gives the same
   tokens from both caches, or both caches are bit-equal at every position
   with equal first logits (both decodes start from one state: tokens that
   part then show decoding is not bitwise repeatable on this machine, as the
   control, the reference's clone decoded again, also shows); one-pass
   recomputation of the whole prompt agrees within a tolerance (different
   GEMM shapes round differently in bf16): the max |logit| difference
   relative to the logits' range, and top-1 agreement.
4. TTFT of B (restore + suffix) against one-pass recomputation, per storage
   (``--storage NAME=DIR[,DIR...]``), path (gpu, cpu) and prefix.

The layer registration, per-layer waits and saves go through tutti's
worker-side API (the same code the vLLM connector uses).

Output: one JSON object per line on stdout (``--json FILE`` writes them all),
then a summary table. Exit status 0 when every check holds, 1 when one
fails, 2 when torch, transformers or a GPU is missing (the message says which).
"""

import argparse
import gc
import json
import os
import sys
import tempfile


def need_deps():
    try:
        import torch
    except ImportError:
        print("hf_serve: torch is not installed (pip install torch)", file=sys.stderr)
        sys.exit(2)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("hf_serve: transformers is not installed (pip install transformers)", file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print("hf_serve: no CUDA GPU visible to torch: this example runs the model on a GPU", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama3-8b,qwen2-7b")
    ap.add_argument("--prefixes", default="8192,32768,131072", help="prefix tokens (multiples of 16)")
    ap.add_argument("--suffix", type=int, default=64, help="suffix tokens of request B")
    ap.add_argument("--decode", type=int, default=32, help="greedy tokens compared from both caches")
    ap.add_argument("--storage", action="append", default=[],
                    help="NAME=DIR[,DIR...] (repeatable): where tutti's store lives; default disk=a temporary dir")
    ap.add_argument("--paths", default="gpu,cpu", help="gpu, cpu (a pinned host page pool), staged (the CPU path "
                    "through host staging on GPU pages, as vLLM's path \"cpu\")")
    ap.add_argument("--host-staging-bytes", type=int, default=1 << 30, help="the staged path's pinned pool; a save larger than it is skipped "
                    "(Llama-3-8B: 128 KiB per prefix token)")
    ap.add_argument("--layers", type=int, default=0, help="override the layer count (quick runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=0.02,
                    help="one-pass recompute: max |logit diff| / logit range allowed")
    ap.add_argument("--json", default="", help="write every result line to this file too")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch's deterministic algorithms and cuBLAS's fixed workspace (CUBLAS_WORKSPACE_CONFIG)")
    args = ap.parse_args(argv)
    for v, n in ((args.suffix, "--suffix"), (args.decode, "--decode"), (args.layers, "--layers")):
        if v < 0:
            ap.error(f"{n} {v}: must be >= 0")
    prefixes = [int(x) for x in args.prefixes.split(",") if x]
    if any(p <= 0 or p % 16 for p in prefixes):
        ap.error(f"--prefixes {args.prefixes}: each must be a positive multiple of 16")
    paths = [p for p in args.paths.split(",") if p]
    if any(p not in ("gpu", "cpu", "staged") for p in paths):
        ap.error(f"--paths {args.paths}: want gpu, cpu and/or staged")
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
    need_deps()
    import torch

    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    from hf_run import MODELS, run_model  # beside this file; imports torch and transformers

    storages = []
    for s in args.storage or ["disk=" + tempfile.mkdtemp(prefix="tutti-hf-", dir="/var/tmp")]:
        name, _, dirs = s.partition("=")
        if not dirs:
            ap.error(f"--storage {s!r}: want NAME=DIR[,DIR...]")
        storages.append((name, dirs.split(",")))
    results, ok = [], True
    out = open(args.json, "w") if args.json else None
    models = args.models.split(",")
    for name in models:
        if name not in MODELS:
            ap.error(f"--models: unknown model {name!r} (want {', '.join(MODELS)})")
    # Prefix-major, each model built afresh per prefix: a run cut short by its
    # time limit has every model at the shorter prefixes.
    runs = [(P, name) for P in prefixes for name in models]
    for P, name in runs:
        for rec in run_model(name, args, [P], storages, paths):
            line = json.dumps(rec, sort_keys=True)
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()
            results.append(rec)
            ok = ok and rec.get("ok", True)
        gc.collect()  # the model of this run goes before the next is built
        torch.cuda.empty_cache()
    if out:
        out.close()
    print("\nmodel       prefix  storage  path  restore_ms  B_ttft_ms  recompute_ms  speedup  checks")
    for r in results:
        if r.get("kind") == "ttft":
            print(f"{r['model']:<11} {r['prefix']:>6}  {r['storage']:<7}  {r['path']:<4}  {r['restore_done_ms']:>10.1f}"
                  f"  {r['ttft_ms']:>9.1f}  {r['recompute_ms']:>12.1f}  {r['speedup']:>6.2f}x  "
                  f"{'ok' if r['ok'] else 'FAILED: ' + r.get('why', '')}")
        elif r.get("kind") == "skipped":
            print(f"{r['model']:<11} {r['prefix']:>6}  not run: {r['why']}")
        elif r.get("kind") == "checks":
            print(f"{r['model']:<11} {r['prefix']:>6}  checks: kv_bit_exact={r['kv_equal']} logits_equal={r['logits_equal']}"
                  f" greedy_same={r['greedy_equal']} greedy_ok={r['greedy_ok']} onepass_rel_diff={r['onepass_rel_diff']:.4f}"
                  f" top1={r['onepass_top1']} -> {'ok' if r['ok'] else 'FAILED'}"
                  + ("" if r['ok'] else f" (B's prefix = A's: {r['b_prefix_equal']}, prefill repeatable:"
                     f" {r['prefill_repeatable']}, max |logit diff| {r['logits_max_diff']:.4g}, greedy apart at"
                     f" {r['greedy_apart_at']}, the reference's own decode repeatable: {r['greedy_repeatable']},"
                     f" B's cache = the reference's: attended {r['b_attended_equal']}, whole buffers {r['b_buffer_equal']})"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
