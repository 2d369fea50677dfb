"""The numbers of eval/vllm/headline.py: TTFT percentiles, the SLO, the
highest rate that meets it, each backend's spread over rounds, the paper's
goals, and the markdown table. Pure functions over the per-run records the
driver writes (no vLLM), so they are tested on synthetic inputs
(python/tests/test_headline.py).

A run record (one backend, one round, one rate) is a dict with at least
``rate``, ``round`` and ``ttft_s`` (vLLM's own first_token_latency of every
request that produced a token), and optionally ``failed`` (requests that
ended without one), ``restored_bytes`` and ``restore_s`` (what the backend
reports, summed over the run), ``external_hit_tokens``.

Percentiles are nearest-rank, as eval/metrics.Percentile (the replay's): the
smallest value with at least q of the sample at or below it.
"""

from __future__ import annotations

import math
from statistics import median
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

SLO_FACTOR = 2.0  # the SLO is SLO_FACTOR x the no-connector unloaded p90 TTFT
SLO_SOURCE = "2 x p90 TTFT of the no-connector engine unloaded (one request at a time)"

# The paper's goals on this workload (issue 48).
GOAL_RATE_X_GDS = 2.0  # rate at SLO at least 2x LMCache-GDS's
GOAL_P99_X_GDS = 4.6  # p99 TTFT at that rate at least 4.6x lower than LMCache-GDS's
GOAL_P50_X_DRAM = 1.2  # p50 within 1.2x of a DRAM tier (vLLM's CPU tier holding everything)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank q-quantile (q in [0, 1]); NaN for an empty sample."""
    if not values:
        return math.nan
    s = sorted(values)
    if q <= 0:
        return s[0]
    rank = min(len(s), math.ceil(q * len(s)))
    return s[rank - 1]


def summary(values: Sequence[float]) -> Dict[str, float]:
    return {"n": len(values), "p50": percentile(values, 0.5), "p90": percentile(values, 0.9),
            "p99": percentile(values, 0.99), "max": max(values) if values else math.nan}


def slo_s(unloaded_ttft_s: Sequence[float]) -> float:
    """SLO_FACTOR x the p90 of the unloaded TTFTs; ValueError on none."""
    if not unloaded_ttft_s:
        raise ValueError("no unloaded TTFTs: the SLO needs the no-connector engine's unloaded pass")
    return SLO_FACTOR * percentile(unloaded_ttft_s, 0.9)


def meets(run: dict, slo: float) -> bool:
    """p90 TTFT at or under the SLO, and every request produced a token
    (a failed request is a miss: it never met any SLO)."""
    t = run.get("ttft_s") or []
    if not t or run.get("failed", 0):
        return False
    return percentile(t, 0.9) <= slo


def rate_at_slo(runs: Iterable[dict], slo: float) -> Tuple[float, bool]:
    """The highest rate met before the first rate missed, over one round's
    runs (as the replay's Sweep: the last rate that meets the SLO below the
    first that does not). Returns (rate, lower_bound): 0 when the lowest
    rate already misses; lower_bound when no rate tried missed (the real
    one is at least that)."""
    rs = sorted(runs, key=lambda r: r["rate"])
    best = 0.0
    for r in rs:
        if not meets(r, slo):
            return best, False
        best = r["rate"]
    return best, bool(rs)


def spread(values: Sequence[float]) -> Dict[str, float]:
    """Median, lowest and highest (NaN when empty)."""
    if not values:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"median": median(values), "min": min(values), "max": max(values), "n": len(values)}


def by_round(runs: Iterable[dict]) -> Dict[int, List[dict]]:
    out: Dict[int, List[dict]] = {}
    for r in runs:
        out.setdefault(int(r["round"]), []).append(r)
    return out


def pooled_at(runs: Iterable[dict], rate: float) -> List[float]:
    """Every round's TTFTs at one rate, pooled."""
    out: List[float] = []
    for r in runs:
        if math.isclose(r["rate"], rate):
            out += r.get("ttft_s") or []
    return out


def by_cache(runs: Iterable[dict]) -> Dict[str, dict]:
    """TTFTs of the runs' requests split by what vLLM found cached for them
    (``num_cached_tokens``): ``cold``, nothing (a document's first request,
    computed whole), ``cached``, a prefix from the GPU cache or a connector;
    what a backend adds to each says where its time goes (its saves weigh on
    the first, its restores on the second)."""
    out = {"cold": ([], []), "cached": ([], [])}  # (TTFTs, queue times)
    for r in runs:
        for q in r.get("requests") or []:
            if q.get("ttft_s") is None or q.get("num_cached_tokens") is None:
                continue
            t, qs = out["cached" if q["num_cached_tokens"] > 0 else "cold"]
            t.append(q["ttft_s"])
            if q.get("queue_s") is not None:
                qs.append(q["queue_s"])
    # queue_p50: of the TTFT, the median time waiting to be scheduled (the
    # engine's load) as against computing and restoring (the request's own)
    return {k: {**summary(t), "queue_p50": summary(qs)["p50"]} for k, (t, qs) in out.items()}


def backend_summary(runs: List[dict], slo: float) -> dict:
    """One backend over its rounds: rate at SLO per round and its spread,
    TTFT percentiles per rate (rounds pooled, and each round's p90 for the
    spread), restored bytes and bandwidth per rate."""
    per_round = {k: rate_at_slo(v, slo) for k, v in sorted(by_round(runs).items())}
    rates = sorted({r["rate"] for r in runs})
    rows = []
    for rate in rates:
        at = [r for r in runs if math.isclose(r["rate"], rate)]
        t = pooled_at(at, rate)
        by = sorted(at, key=lambda r: r["round"])
        b = sum(r.get("restored_bytes") or 0 for r in at)
        s = sum(r.get("restore_s") or 0 for r in at)
        rows.append({"rate": rate, **summary(t),
                     "p90_rounds": [percentile(r.get("ttft_s") or [], 0.9) for r in by],
                     "failed": sum(r.get("failed", 0) for r in at),
                     "restored_bytes": b if any(r.get("restored_bytes") is not None for r in at) else None,
                     "restore_gbps": (b / s / 1e9) if s > 0 else None,
                     "external_hit_tokens": sum(r.get("external_hit_tokens") or 0 for r in at),
                     "implied_restored_bytes": sum(r.get("implied_restored_bytes") or 0 for r in at) or None,
                     "meets": [meets(r, slo) for r in by], "by_cache": by_cache(at)})
    got = [v[0] for v in per_round.values()]
    # A round that met the SLO at every rate tried gives a lower bound, and
    # so does the median of rounds among which one did.
    return {"rate_at_slo_rounds": got, "rate_at_slo_rounds_lower_bound": [v[1] for v in per_round.values()],
            "rate_at_slo": spread(got), "rate_at_slo_lower_bound": any(v[1] for v in per_round.values()), "rates": rows}


def row_at(summ: dict, rate: float) -> Optional[dict]:
    for r in summ["rates"]:
        if math.isclose(r["rate"], rate):
            return r
    return None


def tried_at_or_below(summ: dict, rate: float) -> Optional[float]:
    """The highest rate the backend ran at or below ``rate`` (a median over
    rounds may lie between two rates tried)."""
    got = [r["rate"] for r in summ["rates"] if r["rate"] <= rate * (1 + 1e-9)]
    return max(got) if got else None


def goals(summ: Dict[str, dict], tutti: str = "tutti-gpu", gds: str = "lmcache-gds",
          dram: str = "offload-cpu") -> List[dict]:
    """The paper's goals where the backends they name ran: each a dict with
    goal, value, met (None where not measurable) and note."""
    out = []

    def add(goal, value, met, note):
        out.append({"goal": goal, "value": value, "met": met, "note": note})

    t, g, d = summ.get(tutti), summ.get(gds), summ.get(dram)
    if t is None:
        add("all", None, None, f"{tutti} did not run")
        return out
    tr = t["rate_at_slo"]["median"]
    if g is None:
        add(f"rate at SLO >= {GOAL_RATE_X_GDS}x {gds}", None, None, f"{gds} did not run")
        add(f"p99 at that rate >= {GOAL_P99_X_GDS}x lower than {gds}", None, None, f"{gds} did not run")
    else:
        gr = g["rate_at_slo"]["median"]
        x = tr / gr if gr > 0 else math.inf
        add(f"rate at SLO >= {GOAL_RATE_X_GDS}x {gds}", x, x >= GOAL_RATE_X_GDS,
            f"{tr:g} vs {gr:g} req/s" + (" (tutti's a lower bound)" if t["rate_at_slo_lower_bound"] else ""))
        at = tried_at_or_below(g, gr) if gr > 0 else None
        a, b = (row_at(t, at), row_at(g, at)) if at else (None, None)
        if a and b:
            x = b["p99"] / a["p99"] if a["p99"] > 0 else math.inf
            add(f"p99 at {gds}'s rate >= {GOAL_P99_X_GDS}x lower", x, x >= GOAL_P99_X_GDS,
                f"{a['p99'] * 1e3:.1f} vs {b['p99'] * 1e3:.1f} ms at {at:g} req/s")
        else:
            add(f"p99 at {gds}'s rate >= {GOAL_P99_X_GDS}x lower", None, None, f"{gds} met the SLO at no rate tried")
    if d is None:
        add(f"p50 within {GOAL_P50_X_DRAM}x of {dram}", None, None, f"{dram} did not run")
    else:
        lows = sorted(set(r["rate"] for r in t["rates"]) & set(r["rate"] for r in d["rates"]))
        if lows:
            a, b = row_at(t, lows[0]), row_at(d, lows[0])
            x = a["p50"] / b["p50"] if b["p50"] > 0 else math.inf
            add(f"p50 within {GOAL_P50_X_DRAM}x of {dram} (at {lows[0]:g} req/s)", x, x <= GOAL_P50_X_DRAM,
                f"{a['p50'] * 1e3:.1f} vs {b['p50'] * 1e3:.1f} ms")
    for name, s in sorted(summ.items()):
        if not name.startswith("offload-"):
            continue
        worse = [r["rate"] for r in t["rates"] if (o := row_at(s, r["rate"])) and r["p90"] > o["p90"]]
        add(f"{tutti} at or above {name} on every rate", len(worse), not worse and tr >= s["rate_at_slo"]["median"],
            f"rate at SLO {tr:g} vs {s['rate_at_slo']['median']:g}; p90 worse at {worse or 'no'} rate(s)")
    return out


def _ms(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 1e3:.1f}"


def markdown(summ: Dict[str, dict], slo: float, order: Sequence[str], notes: Dict[str, str]) -> str:
    """Two tables: per backend its rate at SLO (median and round spread);
    per backend and rate, TTFT p50/p90/p99 ms (rounds pooled; p90 per
    round), restored GiB and GB/s where the backend reports them (where it
    does not, the KV that vLLM's external-hit count implies, labelled so)."""
    lines = [f"SLO: p90 TTFT <= {slo * 1e3:.1f} ms ({SLO_SOURCE}).", "",
             "| backend | rate at SLO (req/s), median | each round | what it is |", "|---|---|---|---|"]
    for b in order:
        if b not in summ:
            continue
        s = summ[b]
        r = s["rate_at_slo"]
        lb = ">= " if s["rate_at_slo_lower_bound"] else ""
        rounds = ", ".join(f"{'>= ' if low else ''}{x:g}"
                           for x, low in zip(s["rate_at_slo_rounds"], s["rate_at_slo_rounds_lower_bound"]))
        lines.append(f"| {b} | {lb}{r['median']:g} | {rounds} | "
                     f"{notes.get(b, '')} |")
    lines += ["", "| backend | rate | n | p50 ms | p90 ms (each round) | p99 ms | failed | restored GiB | restore GB/s |",
              "|---|---|---|---|---|---|---|---|---|"]
    for b in order:
        if b not in summ:
            continue
        for r in summ[b]["rates"]:
            gib = "—" if r["restored_bytes"] is None else f"{r['restored_bytes'] / 2**30:.2f}"
            if r["restored_bytes"] is None and r.get("implied_restored_bytes"):
                gib = f"{r['implied_restored_bytes'] / 2**30:.2f} (vLLM's external hits x KV bytes/token)"
            bw = "—" if r["restore_gbps"] is None else f"{r['restore_gbps']:.2f}"
            lines.append(f"| {b} | {r['rate']:g} | {r['n']} | {_ms(r['p50'])} | {_ms(r['p90'])} "
                         f"({', '.join(_ms(x) for x in r['p90_rounds'])}) | {_ms(r['p99'])} | {r['failed']} | "
                         f"{gib} | {bw} |")
    lines += ["", "TTFT by what vLLM found cached for a request (cold: nothing, a document's first request; cached: a "
              "prefix from the GPU cache or the backend):", "",
              "| backend | rate | cold: n, p50 ms, p90 ms, queued p50 ms | cached: n, p50 ms, p90 ms, queued p50 ms |",
              "|---|---|---|---|"]
    for b in order:
        for r in summ[b]["rates"] if b in summ else ():
            c, w = r["by_cache"]["cold"], r["by_cache"]["cached"]
            lines.append(f"| {b} | {r['rate']:g} | {c['n']}, {_ms(c['p50'])}, {_ms(c['p90'])}, {_ms(c.get('queue_p50'))} | "
                         f"{w['n']}, {_ms(w['p50'])}, {_ms(w['p90'])}, {_ms(w.get('queue_p50'))} |")
    return "\n".join(lines) + "\n"


def json_safe(o):
    """o with what strict JSON lacks spelled out: NaN (an empty sample's
    percentile) as null, an infinite ratio (a baseline of zero) as "inf" or
    "-inf"; for json.dump(..., allow_nan=False)."""
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {k: json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    return o
