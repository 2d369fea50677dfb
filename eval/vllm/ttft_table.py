"""TTFT of restored prefixes in real vLLM: recompute (no connector) against
tutti and vLLM's OffloadingConnector on the same model (eval/vllm/drive.py's
``ttft`` phase, one process each, run by ``eval/vllm/run.sh ttft``).

Each run: every document prefilled, the GPU's prefix cache reset, then one
question per document, one request at a time. Prints the median TTFT of
each backend, the ratios against recompute and against the
OffloadingConnector, and the tokens each backend served from its cache
(vLLM's ``num_cached_tokens``); --json writes them.

With --vllm-cache (no connector, the questions served by vLLM's own prefix
cache, which the same prefill filled: drive.py --ttft-reset off), tutti's
answers must equal that run's bit for bit wherever both served the same
cached tokens: the KV a restore hands the engine is the KV the engine's own
cache would, whatever vLLM's kernels do with the batch and the chunks (a
Mamba model's recurrent state depends on both, so recompute may part).

Each run also keeps every question's first token and its top log-probs.
tutti and the OffloadingConnector restore the same KV at the same point and
compute the question alone in both processes, so where both served the
same tokens from their caches their first tokens and log-probs must be
equal bit for bit: a difference there is a wrong restore, not arithmetic.
Against recompute (other batches) only the first tokens are compared, unless
both runs had vLLM's batch-invariant kernels (drive.py's ``batch_invariant``:
VLLM_BATCH_INVARIANT=1): then a token's logits do not depend on its batch and
the top log-probs must be equal bit for bit there too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def summary(path):
    with open(path) as f:
        r = json.load(f)
    t = [x["ttft_s"] for x in r.get("ttft", []) if x.get("ttft_s") is not None]
    return {"median_s": statistics.median(t) if t else None, "ttft_s": t,
            "cached_tokens": [x.get("cached") for x in r.get("ttft", [])],
            # of them, vLLM's own prefix cache's and the connector's (drive.py's hit_counts; None: not recorded)
            "local_hit_tokens": [(x.get("hits") or {}).get("prefix_cache_hits") for x in r.get("ttft", [])],
            "connector_hit_tokens": [(x.get("hits") or {}).get("external_prefix_cache_hits") for x in r.get("ttft", [])],
            "outputs": {x["request"]: (x.get("tokens"), x.get("top")) for x in r.get("ttft", []) if x.get("request")},
            "block_size": r.get("block_size"), "kv_cache_groups": r.get("kv_cache_groups"),
            "batch_invariant": bool(r.get("batch_invariant"))}


def agreement(a, b, same_cached, bitwise):
    """Of the questions both runs answered (and, with same_cached, served the
    same cached tokens): how many gave the same first token, and how many the
    same top log-probs too; the requests that differ (in the first token, or
    with bitwise in the log-probs too)."""
    cached_a = dict(zip(a["outputs"], a["cached_tokens"]))
    cached_b = dict(zip(b["outputs"], b["cached_tokens"]))
    n = same_token = same_top = 0
    differ = []
    for rid, (tok, top) in a["outputs"].items():
        if rid not in b["outputs"] or tok is None or b["outputs"][rid][0] is None:
            continue
        if same_cached and cached_a.get(rid) != cached_b.get(rid):
            continue
        n += 1
        tok_b, top_b = b["outputs"][rid]
        same_token += tok == tok_b
        same_top += tok == tok_b and top == top_b
        if tok != tok_b or (bitwise and top != top_b):
            differ.append(rid)
    return {"compared": n, "same_first_token": same_token, "same_top_logprobs": same_top, "differ": differ}


def parts(a, b, rids):
    """Where a's and b's answers to the requests rids part: both first tokens,
    both top log-probs there (the first position whose tokens or tops
    differ) and the largest log-prob difference of the tokens in both tops
    (a last-bit difference or a wrong restore: the figure says which)."""
    out = {}
    for rid in rids:
        (tok_a, top_a), (tok_b, top_b) = a["outputs"][rid], b["outputs"][rid]
        tops = list(zip(top_a or [], top_b or []))
        i = next((k for k, (x, y) in enumerate(tops) if x != y or (tok_a or [])[k:k + 1] != (tok_b or [])[k:k + 1]), 0)
        x, y = tops[i] if tops else ([], [])
        lp_b = {int(t): float(v) for t, v in y}
        common = [abs(float(v) - lp_b[int(t)]) for t, v in x if int(t) in lp_b]
        out[rid] = {"position": i, "tokens": [tok_a, tok_b], "top": [x, y],
                    "max_logprob_diff": max(common) if common else None}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", required=True)
    p.add_argument("--recompute", required=True)
    p.add_argument("--tutti", required=True)
    p.add_argument("--offloading", default="", help="left out: the OffloadingConnector's run failed (no row)")
    p.add_argument("--vllm-cache", default="", help="no connector, questions from vLLM's own cache (drive.py "
                                                      "--ttft-reset off): the control tutti's answers must equal")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    rows = {k: summary(getattr(a, k)) for k in ("recompute", "tutti", "offloading", "vllm_cache") if getattr(a, k)}
    rec, tut = rows["recompute"]["median_s"], rows["tutti"]["median_s"]
    off = rows["offloading"]["median_s"] if "offloading" in rows else None
    groups = rows["tutti"]["kv_cache_groups"] or []
    print(f"{a.case} TTFT (median of {len(rows['tutti']['ttft_s'])} restored prefixes, block_size "
          f"{rows['tutti']['block_size']}, KV cache groups {[g['spec'] for g in groups]}):")
    local = []
    for k, r in rows.items():
        if k == "vllm_cache":
            continue  # a control of outputs: its TTFTs are of vLLM's own cache
        m = r["median_s"]
        print(f"  {k:<11} {m * 1000 if m else float('nan'):8.1f} ms   cached tokens {r['cached_tokens']}"
              + (f" (vLLM's own {r['local_hit_tokens']}, the connector's {r['connector_hit_tokens']})"
                 if None not in r["local_hit_tokens"] else ""))
        if k not in ("recompute", "vllm_cache") and any(r["local_hit_tokens"]):
            local.append(k)
    if local:  # the reset left vLLM's cache holding a document: its TTFT is no restore's
        print(f"  NOT RESTORES: {', '.join(local)} served questions from vLLM's own prefix cache")
    if "offloading" not in rows:
        print("  offloading  failed: vLLM's OffloadingConnector did not run on this model (run.sh logs why)")
    ok = None not in (rec, tut)
    if ok:
        vs_off = f", {off / tut:.2f}x lower than OffloadingConnector (CPU tier)" if off else ""
        print(f"  tutti: {rec / tut:.2f}x lower than recompute{vs_off}")
    invariant = rows["tutti"]["batch_invariant"] and rows["recompute"]["batch_invariant"]
    agree = {"recompute": agreement(rows["tutti"], rows["recompute"], same_cached=False, bitwise=invariant)}
    # The same KV at the same point (the same prefill's, from vLLM's own cache): tutti's answers, bit for bit.
    exact = {k: label for k, label in (("offloading", "OffloadingConnector"), ("vllm_cache", "vLLM's own prefix cache"))
             if k in rows}
    for k in exact:
        agree[k] = agreement(rows["tutti"], rows[k], same_cached=True, bitwise=True)
    rows["parts"] = {k: parts(rows["tutti"], rows[k], g["differ"]) for k, g in agree.items()}
    for k, label in exact.items():
        ok = bitwise(f"{label} (same cached tokens)", agree[k], rows["parts"][k]) and ok
    g = agree["recompute"]
    if invariant:  # batch-invariant kernels in both: recompute's logits are tutti's, bit for bit
        ok = bitwise("recompute (batch-invariant kernels)", g, rows["parts"]["recompute"]) and ok
    else:
        print(f"  tutti = recompute: first token {g['same_first_token']} of {g['compared']}")
    for r in rows.values():
        r.pop("outputs", None)
    rows["agreement"] = agree
    ok = ok and not local
    rows["ok"], rows["offloading_ran"], rows["batch_invariant"] = ok, off is not None, invariant
    rows["served_from_vllm_cache"] = local
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if ok else 1


def bitwise(other, g, ps) -> bool:
    """Prints an agreement that must hold bit for bit (agreement's g, parts'
    ps of its differing requests); whether it held."""
    print(f"  tutti = {other}: first token {g['same_first_token']} of {g['compared']}, top log-probs bit for bit "
          f"{g['same_top_logprobs']}" + (f"; differ: {g['differ']}" if g["differ"] else ""))
    for rid, x in ps.items():
        d = x["max_logprob_diff"]
        print(f"    {rid} parts at position {x['position']}: tokens {x['tokens'][0]} vs {x['tokens'][1]}, "
              f"largest log-prob difference {'n/a' if d is None else f'{d:.3g}'}; top {x['top'][0]} vs {x['top'][1]}")
    return not g["differ"]


if __name__ == "__main__":
    sys.exit(main())
