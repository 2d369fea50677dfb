"""The replay harness's re-implemented designs held against the real systems
on the same workload (issue 48): `tutti replay --at-rates` (its --json rows:
each design's timeline at the real runs' rates, every request's TTFT) beside
eval/vllm/headline.py's result files (headline-<backend>-<storage>.json: vLLM
0.26 serving the same docqa requests through each backend).

  python3 harness_check.py check --replay REPLAY.json [--slo-ms X] [--json OUT] [--md OUT] HEADLINE.json...
  python3 harness_check.py replay-args --requests N --rates R1,R2,... [--backends "none tutti-gpu ..."]

check prints per design, at each rate both ran, the harness's TTFT p50, p90
and p99 against the real backend's (the real one's rounds pooled), and the
rate at SLO of both under ONE SLO, the real run's (--slo-ms, else 2 x the
no-connector engine's unloaded p90, headline_stats.slo_s), each over the
rates the real backend was given, stopping at the first missed (as
headline_stats.rate_at_slo: the harness's own rate at SLO is continuous and
under its own SLO, so it is shown only beside). Each figure gets the ratio
harness/real and a flag where it is off by more than TOLERANCE. It reports:
exit 0 whatever the differences, 1 with an error naming the file and field
on malformed or mismatched input (other requests, another workload, storage
labels of two storages). replay-args prints the replay flags that give the
same plan (eval/vllm/docqa.py's plan file), for eval/vllm/headline.sh.

Pure Python, no vLLM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docqa  # noqa: E402
import headline_stats as hs  # noqa: E402

TOLERANCE = 0.15  # issue 48: a harness figure more than 15% off the real one is flagged
# The harness's design -> the real backend it re-implements (eval/vllm/headline.py's BACKENDS).
DESIGNS = {"recompute": "none", "dram": "offload-cpu", "vllm-fs": "offload-fs", "lmcache-disk": "lmcache-disk",
           "lmcache-gds": "lmcache-gds", "tutti-gpu": "tutti-gpu", "tutti-cpu": "tutti-cpu"}


class InputError(ValueError):
    """Malformed or mismatched input; the message names the file and field."""


def _field(obj, key, kind, where):
    if not isinstance(obj, dict) or key not in obj:
        raise InputError(f"{where}: no field {key!r}")
    v = obj[key]
    if kind is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    elif kind is int:
        ok = isinstance(v, int) and not isinstance(v, bool)
    else:
        ok = isinstance(v, kind)
    if not ok:
        raise InputError(f"{where}: field {key!r} is {type(v).__name__}, want {getattr(kind, '__name__', kind)}")
    return v


def _numbers(v, where) -> List[float]:
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                          for x in v):
        raise InputError(f"{where}: want a list of numbers")
    return [float(x) for x in v]


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e})") from e


def load_replay(path: str) -> Dict[str, dict]:
    """`tutti replay --json --at-rates` rows -> {design: {requests, workload,
    skipped, own_rate_at_slo, at: {rate: [ttft_s...]}}}."""
    rows = _load(path)
    if not isinstance(rows, list):
        raise InputError(f"{path}: want the replay's --json array of rows, got {type(rows).__name__}")
    out = {}
    for i, r in enumerate(rows):
        where = f"{path}: row {i}"
        b = _field(r, "backend", str, where)
        where = f"{path}: row {i} ({b})"
        d = {"skipped": r.get("skipped") or "", "requests": _field(r, "requests", int, where),
             "workload": r.get("workload"), "own_rate_at_slo": r.get("max_rate_at_slo"), "at": {}}
        if not d["skipped"]:
            if not r.get("at_rates"):
                raise InputError(f"{where}: no field 'at_rates' (run the replay with --at-rates)")
            _field(r, "workload", str, where)
            for j, a in enumerate(_field(r, "at_rates", list, where)):
                w = f"{where}: at_rates[{j}]"
                t = _numbers(_field(a, "ttft_ms", list, w), f"{w}: field 'ttft_ms'")
                if len(t) != d["requests"]:
                    raise InputError(f"{w}: {len(t)} TTFTs, the row has {d['requests']} requests")
                d["at"][_field(a, "rate_per_s", float, w)] = [x / 1e3 for x in t]
        out[b] = d
    return out


def load_real(paths: List[str]) -> Dict[str, dict]:
    """headline.py's result files -> {backend: its JSON}, every field used checked."""
    out = {}
    for p in paths:
        r = _load(p)
        b = _field(r, "backend", str, p)
        wl = _field(r, "workload", dict, p)
        _field(wl, "describe", str, f"{p}: field 'workload'")
        _field(wl, "requests", int, f"{p}: field 'workload'")
        for i, run in enumerate(_field(r, "runs", list, p)):
            w = f"{p}: runs[{i}]"
            _field(run, "rate", float, w)
            _field(run, "round", int, w)
            _numbers(_field(run, "ttft_s", list, w), f"{w}: field 'ttft_s'")
        if b in out:
            raise InputError(f"{p}: a second result of backend {b} (give one storage's files)")
        r["_path"] = p
        out[b] = r
    return out


def real_slo(real: Dict[str, dict], slo_ms: Optional[float]) -> float:
    if slo_ms:
        return slo_ms / 1e3
    un = (real.get("none") or {}).get("unloaded") or {}
    if not un.get("ttft_s"):
        raise InputError("no SLO: give --slo-ms or the none backend's file (its field 'unloaded' with 'ttft_s')")
    return hs.slo_s(_numbers(un["ttft_s"], f"{real['none']['_path']}: field 'unloaded.ttft_s'"))


def check_match(replay: Dict[str, dict], real: Dict[str, dict], replay_path: str) -> None:
    """The same requests of the same workload on one storage, or InputError."""
    storages = {r.get("storage") or "" for b, r in real.items() if b != "none"}
    if len(storages) > 1:
        raise InputError(f"real files of {len(storages)} storages ({'; '.join(sorted(storages))}): give one storage's")
    for b, d in replay.items():
        if d["skipped"]:
            continue
        for rb, r in real.items():
            wl = r["workload"]
            if wl["requests"] != d["requests"]:
                raise InputError(f"{r['_path']}: field 'workload.requests' {wl['requests']}, but {replay_path} row "
                                 f"{b} has {d['requests']} requests")
            if wl["describe"] != d["workload"]:
                raise InputError(f"{r['_path']}: field 'workload.describe' {wl['describe']!r} is not {replay_path} "
                                 f"row {b}'s workload {d['workload']!r}")


def _ratio(h, r):
    if h is None or r is None or math.isnan(h) or math.isnan(r):
        return None
    if r == 0:
        return 1.0 if h == 0 else math.inf
    return h / r


def _flag(x) -> bool:
    return x is not None and abs(x - 1) > TOLERANCE


def _at(h: dict, rate: float) -> List[float]:
    """A replay design's TTFTs at ``rate`` (one of its --at-rates)."""
    return next(v for k, v in h["at"].items() if math.isclose(k, rate))


def compare(replay: Dict[str, dict], real: Dict[str, dict], slo: float) -> List[dict]:
    """One entry per design: why not compared, or every common rate's
    percentiles and the rates at SLO, with ratios harness/real and flags."""
    out = []
    for design, backend in DESIGNS.items():
        e = {"design": design, "real": backend}
        h, r = replay.get(design), real.get(backend)
        if h is None and r is None:
            continue  # neither side ran it: nothing to say
        if h is None or r is None or h["skipped"] or not r["runs"]:
            e["not_compared"] = ("the replay did not run it" if h is None else f"the replay skipped it: {h['skipped']}"
                                 if h["skipped"] else f"real {backend} not run" if r is None
                                 else f"real {backend} has no runs")
            out.append(e)
            continue
        grid = sorted(float(x) for x in str((r.get("args") or {}).get("rates", "")).split(",") if x) or \
            sorted({run["rate"] for run in r["runs"]})
        have = sorted(h["at"])
        common = [x for x in grid if any(math.isclose(x, y) for y in have)]
        if not common:
            e["not_compared"] = f"no rate both ran (real {grid}, the replay's --at-rates {have})"
            out.append(e)
            continue
        e["rates"] = []
        for rate in common:
            real_t = hs.pooled_at(r["runs"], rate)
            if not real_t:
                continue  # every round skipped it (a lower rate missed the SLO)
            sh, sr = hs.summary(_at(h, rate)), hs.summary(real_t)
            row = {"rate": rate}
            for q in ("p50", "p90", "p99"):
                x = _ratio(sh[q], sr[q])
                row[q] = {"harness_s": sh[q], "real_s": sr[q], "ratio": x, "flag": _flag(x)}
            e["rates"].append(row)
        summ = hs.backend_summary(r["runs"], slo)
        hr, hlow = hs.rate_at_slo([{"rate": x, "round": 0, "ttft_s": _at(h, x)} for x in common], slo)
        rr = summ["rate_at_slo"]["median"]
        e["rate_at_slo"] = {"harness": hr, "harness_lower_bound": hlow, "real": rr,
                            "real_lower_bound": summ["rate_at_slo_lower_bound"], "real_rounds": summ["rate_at_slo_rounds"],
                            "ratio": _ratio(hr, rr), "flag": _flag(_ratio(hr, rr)), "grid": common,
                            "harness_own": h["own_rate_at_slo"]}
        missing = [x for x in grid if x not in common]
        if missing:
            e["note"] = f"rates the real backend was given but the replay's --at-rates lacks: {missing}"
        e["flagged"] = e["rate_at_slo"]["flag"] or any(row[q]["flag"] for row in e["rates"] for q in ("p50", "p90", "p99"))
        out.append(e)
    return out


def _x(v) -> str:
    return "—" if v is None else "inf" if math.isinf(v) else f"{v:.2f}"


def markdown(entries: List[dict], slo: float) -> str:
    lines = [f"Harness against the real systems: SLO p90 TTFT <= {slo * 1e3:.1f} ms (the real run's; both judged "
             f"by it); ratio harness/real, ** where off by more than {TOLERANCE:.0%}.", "",
             "| design (real) | rate | p50 ms harness/real (x) | p90 ms | p99 ms |", "|---|---|---|---|---|"]
    for e in entries:
        if "not_compared" in e:
            continue
        for row in e["rates"]:
            cells = [f"{row[q]['harness_s'] * 1e3:.1f} / {row[q]['real_s'] * 1e3:.1f} "
                     f"({'**' if row[q]['flag'] else ''}{_x(row[q]['ratio'])}{'**' if row[q]['flag'] else ''})"
                     for q in ("p50", "p90", "p99")]
            lines.append(f"| {e['design']} ({e['real']}) | {row['rate']:g} | " + " | ".join(cells) + " |")
    lines += ["", "| design (real) | rate at SLO harness / real, req/s (x) | harness's own (its SLO, continuous) |",
              "|---|---|---|"]
    for e in entries:
        if "not_compared" in e:
            lines.append(f"| {e['design']} ({e['real']}) | not compared: {e['not_compared']} | |")
            continue
        s = e["rate_at_slo"]
        f = "**" if s["flag"] else ""
        own = s["harness_own"]
        lines.append(f"| {e['design']} ({e['real']}) | {'>= ' if s['harness_lower_bound'] else ''}{s['harness']:g} / "
                     f"{'>= ' if s['real_lower_bound'] else ''}{s['real']:g} ({f}{_x(s['ratio'])}{f}) | "
                     f"{'—' if own is None else f'{own:.2f}'} |")
    notes = [f"- {e['design']}: {e['note']}" for e in entries if e.get("note")]
    flagged = [e["design"] for e in entries if e.get("flagged")]
    lines += [""] + notes + [f"Off by more than {TOLERANCE:.0%}: {', '.join(flagged) or 'none'} "
                             "(each to be corrected in the harness or explained in its label)."]
    return "\n".join(lines) + "\n"


def check(a) -> int:
    replay = load_replay(a.replay)
    real = load_real(a.files)
    check_match(replay, real, a.replay)
    slo = real_slo(real, a.slo_ms)
    entries = compare(replay, real, slo)
    md = markdown(entries, slo)
    print(md, end="")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(hs.json_safe({"replay": a.replay, "real": a.files, "slo_s": slo, "tolerance": TOLERANCE,
                                    "designs": entries}), f, indent=1, allow_nan=False)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    return 0


def replay_args(plan: docqa.Plan, requests: int, rates: str, backends: str = "") -> List[str]:
    """The `tutti replay` flags that generate ``plan``'s first ``requests``
    requests and give each design's timeline at ``rates``; with ``backends``
    (the real ones, space- or comma-separated), --backends of the designs
    that re-implement them (DESIGNS)."""
    p = plan.params
    real = backends.replace(",", " ").split()
    by_real = {v: k for k, v in DESIGNS.items()}
    unknown = [b for b in real if b not in by_real]
    if unknown:
        raise InputError(f"--backends: {unknown} re-implemented by no design of the replay (known: {sorted(by_real)})")
    flags = {"--workload": "docqa", "--docqa-docs": p["Documents"], "--docqa-min-doc-tokens": p["MinDocTokens"],
             "--docqa-max-doc-tokens": p["MaxDocTokens"], "--docqa-questions": p["QuestionsPerDoc"],
             "--docqa-min-question-tokens": p["MinQuestionTokens"], "--docqa-max-question-tokens": p["MaxQuestionTokens"],
             "--docqa-rate": p["RatePerS"], "--docqa-seed": p["Seed"], "--block-tokens": p["BlockTokens"],
             "--requests": requests, "--at-rates": rates}
    if real:
        flags["--backends"] = ",".join(by_real[b] for b in real)
    return [x for k, v in flags.items() for x in (k, f"{v:g}" if isinstance(v, float) else str(v))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="harness against real: TTFT per rate and rate at SLO, flags")
    c.add_argument("--replay", required=True, help="`tutti replay --json --at-rates ...` output")
    c.add_argument("--slo-ms", type=float, default=0, help="the SLO (default: from the none backend's unloaded pass)")
    c.add_argument("--json", help="write the comparison as JSON here")
    c.add_argument("--md", help="write the tables as markdown here")
    c.add_argument("files", nargs="+", help="headline-<backend>-<storage>.json of one storage (and none's)")
    r = sub.add_parser("replay-args", help="the replay flags of the headline's plan")
    r.add_argument("--requests", type=int, required=True)
    r.add_argument("--rates", required=True)
    r.add_argument("--backends", default="", help="the real backends (headline.sh's BACKENDS): --backends of their designs")
    r.add_argument("--plan", default=docqa.PLAN_PATH)
    a = p.parse_args(argv)
    try:
        if a.cmd == "replay-args":
            print(" ".join(replay_args(docqa.load_plan(a.plan), a.requests, a.rates, a.backends)))
            return 0
        return check(a)
    except ValueError as e:  # InputError, or docqa's plan file naming itself
        print(f"harness_check: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
