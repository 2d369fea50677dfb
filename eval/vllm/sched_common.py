"""What both CPU scheduler drivers share (eval/vllm/sched_cpu.py for one KV
cache group, sched_cpu_hybrid.py for several): the stand-in model's attention
KV, a function of each token's prefix exact in float16, and the verdict they
end with (the connector's check mode read back, the wrong values listed, PASS
or FAIL, the result file), and the one worker's process group."""

from __future__ import annotations

import json
import tempfile

import torch

from tutti.kvcheck import read_summaries

HEADS, HEAD = 2, 64  # an attention layer's KV heads and head size
MOD = 2039  # values < 2048 are exact in float16


_RENDEZVOUS = None  # the process group's rendezvous directory, removed at exit


def init_one_worker():
    """One worker of tensor-parallel size 1, as vLLM's uniprocess executor sets
    it up (gloo; call inside set_current_vllm_config, once a process), its
    rendezvous file in a directory of its own removed when the process exits."""
    global _RENDEZVOUS
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    _RENDEZVOUS = tempfile.TemporaryDirectory(prefix="tutti-gloo-")
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"file://{_RENDEZVOUS.name}/dist")
    initialize_model_parallel(1, 1)


def prefix_hashes(tokens) -> list[int]:
    """A rolling hash of every prefix of tokens: what position i's KV is a function of."""
    h, out = 17, []
    for t in tokens:
        h = (h * 1000003 + t) % (1 << 31)
        out.append(h)
    return out


def expect_kv(hashes, layer, p0, p1):
    """The K and V the stand-in model writes at positions [p0, p1) of a request in one layer."""
    h = torch.tensor(hashes[p0:p1], dtype=torch.int64).view(-1, 1, 1)
    j = torch.arange(HEADS * HEAD, dtype=torch.int64).view(1, HEADS, HEAD)
    return ((h + 7 * layer + j) % MOD).to(torch.float16), ((h + 7 * layer + j + 1000) % MOD).to(torch.float16)


def check_mode(a, res: dict, need_match: bool) -> bool:
    """Reads the check mode's summaries under ``a.dir``-check into res and
    prints them; true when no restored block-layer differed from what was
    saved or went unchecked, and (need_match) at least one was checked."""
    chk = read_summaries(f"{a.dir}-check")
    res["check"] = chk
    print(f"{a.phase}: check mode: {chk['match']} restored block-layers equal to what was saved, "
          f"{chk['mismatch']} differ, {chk['unknown']} unknown")
    return chk["mismatch"] == 0 and chk["unknown"] == 0 and (not need_match or chk["match"] > 0)



def step_tables(so, tables: dict, groups: int) -> list:
    """A scheduler output's block tables, as the model runner keeps them:
    ``tables[req_id]`` (a list of block ids per KV cache group) set for new
    and resumed requests and grown for running ones. Returns the step's
    work: (req_id, computed tokens before the step, new or resumed)."""
    work = []
    for nr in so.scheduled_new_reqs:
        tables[nr.req_id] = [list(g) for g in nr.block_ids]
        work.append((nr.req_id, nr.num_computed_tokens, True))
    cr = so.scheduled_cached_reqs
    for i, rid in enumerate(cr.req_ids):
        nb = cr.new_block_ids[i]
        if rid in cr.resumed_req_ids:
            tables[rid] = [list(g) for g in nb] if nb is not None else [[] for _ in range(groups)]
        elif nb is not None:
            for have, more in zip(tables[rid], nb):
                have.extend(more)
        work.append((rid, cr.num_computed_tokens[i], rid in cr.resumed_req_ids))
    return work

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
