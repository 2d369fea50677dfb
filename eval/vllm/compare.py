"""Checks one case of eval/vllm/run.sh: the first and second phases of a
connector run against the baseline (no connector) of the same model.

A case passes when:
  - every request that was not aborted on purpose finished (no error finish),
  - where the baseline and the phase both ran vLLM's batch-invariant kernels
    (drive.py's ``batch_invariant``: VLLM_BATCH_INVARIANT=1), greedy outputs
    equal the baseline's token for token; without them outputs are compared
    and reported, not required: where they part, the report gives the first
    position and both runs' top logprobs there, since different batches give
    different roundings (the check mode below is what tells a wrong KV),
  - the connector's check mode compared restored blocks with the KV vLLM
    computed for them and found none different and none without a digest
    (tutti.kvcheck's summary files under --check-dir),
  - the second process, a new one, restored from tutti (tutti's hit tokens
    above zero there) and no promised block failed.
Prints one line per finding and a verdict; --json writes them all.

With --control (the first phase run with vLLM's own OffloadingConnector
instead, same workload and kernels: run.sh's CONTROL=1) it also reports that
run's outputs against the baseline's and tutti's against that run's,
request by request with the cached tokens of each: where the engine parts
from the baseline with its own connector too, from the same cached prefix,
the parting is the engine's computation after a cached prefix, not tutti's
restore. Reported only: the verdict is unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from tutti.kvcheck import read_summaries  # noqa: E402

from drive import metric_total  # noqa: E402  (drive.py writes the metrics this reads)


def load(p):
    with open(p) as f:
        return json.load(f)


def metric(run, name):
    return metric_total(run.get("metrics", {}), name)


def compare_outputs(base, run):
    """Per request present in both: equal, or where it parts."""
    same, parted, failed = 0, [], []
    for rid, r in run["requests"].items():
        if r.get("aborted_at_step") is not None:
            continue
        if "tokens" not in r or r.get("finish_reason") not in ("length", "stop"):
            failed.append({"request": rid, "finish_reason": r.get("finish_reason")})
            continue
        b = base["requests"].get(rid)
        if b is None or "tokens" not in b:
            continue
        if r["tokens"] == b["tokens"]:
            same += 1
            continue
        pos = next(i for i, (x, y) in enumerate(zip(r["tokens"] + [None], b["tokens"] + [None])) if x != y)
        parted.append({"request": rid, "position": pos,
                       "tokens": r["tokens"][pos:pos + 4], "baseline_tokens": b["tokens"][pos:pos + 4],
                       "top": (r.get("top") or [])[pos:pos + 1], "baseline_top": (b.get("top") or [])[pos:pos + 1],
                       "cached_tokens": r.get("num_cached_tokens"), "baseline_cached_tokens": b.get("num_cached_tokens")})
    return same, parted, failed


def control_report(case, base, first, control):
    """The control run (module doc) against the baseline, and tutti's first
    phase against the control: counts, and per parted request both cached
    token counts, printed and returned."""
    same_c, parted_c, failed_c = compare_outputs(base, control)
    same_t, parted_t, _ = compare_outputs(control, first)
    for d in parted_t:  # compare_outputs' run is tutti's, its baseline the control
        d["tutti_cached_tokens"], d["control_cached_tokens"] = d.pop("cached_tokens"), d.pop("baseline_cached_tokens")
    print(f"{case} control (vLLM's OffloadingConnector, first phase): {same_c} outputs equal the baseline's, "
          f"{len(parted_c)} part, {len(failed_c)} failed; tutti's equal the control's: {same_t}, part: {len(parted_t)}")
    for d in parted_t[:4]:
        print(f"  {d['request']}: tutti parts from the control at token {d['position']} (cached tokens: tutti "
              f"{d['tutti_cached_tokens']}, control {d['control_cached_tokens']}); top {d['top']} vs {d['baseline_top']}")
    return {"equal_to_baseline": same_c, "parted_from_baseline": parted_c, "failed": failed_c,
            "tutti_equal_to_control": same_t, "tutti_parted_from_control": parted_t,
            "batch_invariant": bool(control.get("batch_invariant"))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", required=True)
    p.add_argument("--baseline", required=True)
    p.add_argument("--first", required=True)
    p.add_argument("--second", required=True)
    p.add_argument("--check-dir", default="")
    p.add_argument("--control", default="", help="the first phase with vLLM's OffloadingConnector (module doc)")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    base, first, second = load(a.baseline), load(a.first), load(a.second)
    rep = {"case": a.case, "phases": {}}
    ok = True
    for name, run in (("first", first), ("second", second)):
        same, parted, failed = compare_outputs(base, run)
        ext = metric(run, "vllm:external_prefix_cache_hits")
        rep["phases"][name] = {
            "equal_outputs": same, "parted": parted, "failed": failed,
            "external_hit_tokens": ext, "local_hit_tokens": metric(run, "vllm:prefix_cache_hits"),
            "preemptions": metric(run, "vllm:num_preemptions"), "engine_start_s": run.get("engine_start_s"),
            "pythonhashseed": run.get("pythonhashseed"),
            "tutti": {k: v for k, v in run.get("metrics", {}).items() if "tutti" in k},
        }
        tm = rep["phases"][name]["tutti"]
        print(f"{a.case} {name}: {same} outputs equal the baseline's, {len(parted)} part, {len(failed)} failed; "
              f"tutti promised {metric(run, 'vllm:tutti_hit_tokens')} tokens and restored "
              f"{metric(run, 'vllm:tutti_load_bytes') / 2**30:.2f} GiB "
              f"({metric(run, 'vllm:tutti_load_error_blocks')} blocks in error); vLLM counted {ext} external and "
              f"{rep['phases'][name]['local_hit_tokens']} GPU-cache hit tokens; preemptions "
              f"{rep['phases'][name]['preemptions']}; staged through host memory "
              f"{metric(run, 'vllm:tutti_staging_h2d_bytes') / 2**30:.2f} GiB" if tm else
              f"{a.case} {name}: {same} outputs equal the baseline's, {len(parted)} part, {len(failed)} failed")
        for d in parted[:4]:
            print(f"  {d['request']} parts at token {d['position']}: {d['tokens']} vs {d['baseline_tokens']}; "
                  f"top there {d['top']} vs {d['baseline_top']}")
        for d in failed:
            print(f"  {d['request']} did not finish: {d['finish_reason']}")
        ok &= not failed
        invariant = bool(base.get("batch_invariant") and run.get("batch_invariant"))
        rep["phases"][name]["batch_invariant"] = invariant
        if invariant:
            print(f"  batch-invariant kernels in both runs: outputs must be equal, {len(parted)} part")
            ok &= not parted
    if a.control:
        rep["control"] = control_report(a.case, base, first, load(a.control))
    ok &= metric(second, "vllm:tutti_hit_tokens") > 0 and metric(second, "vllm:tutti_load_error_blocks") == 0
    if a.check_dir:
        c = read_summaries(a.check_dir)
        rep["check"] = c
        print(f"{a.case} check mode: {c['match']} restored block-layers equal the KV vLLM computed, "
              f"{c['mismatch']} differ, {c['unknown']} had no digest; {c['recorded']} saved block-layers "
              f"digested ({c['files']} summaries)")
        for m in c["mismatches"]:
            print(f"  mismatch: {m}")
        ok &= c["files"] > 0 and c["match"] > 0 and c["mismatch"] == 0 and c["unknown"] == 0
    rep["ok"] = bool(ok)
    print(f"{a.case}: {'PASS' if ok else 'FAIL'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
