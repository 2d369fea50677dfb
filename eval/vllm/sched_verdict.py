"""The verdict both CPU scheduler drivers end with (eval/vllm/sched_cpu.py for
one KV cache group, sched_cpu_hybrid.py for several): the connector's check
mode read back, the wrong values listed, PASS or FAIL, the result file."""

from __future__ import annotations

import json

from tutti.kvcheck import read_summaries


def check_mode(a, res: dict, need_match: bool) -> bool:
    """Reads the check mode's summaries under ``a.dir``-check into res and
    prints them; true when no restored block-layer differed from what was
    saved or went unchecked, and (need_match) at least one was checked."""
    chk = read_summaries(f"{a.dir}-check")
    res["check"] = chk
    print(f"{a.phase}: check mode: {chk['match']} restored block-layers equal to what was saved, "
          f"{chk['mismatch']} differ, {chk['unknown']} unknown")
    return chk["mismatch"] == 0 and chk["unknown"] == 0 and (not need_match or chk["match"] > 0)


def finish(a, res: dict, ok: bool, bad: list) -> int:
    """Prints the first wrong values and the verdict, writes res to
    ``a.json`` when asked; the exit status."""
    for b in bad[:8]:
        print("  " + b)
    res["ok"] = bool(ok)
    print(f"{a.phase}: {'PASS' if ok else 'FAIL'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    return 0 if ok else 1
