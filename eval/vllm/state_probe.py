"""Where a hybrid model's restored prefix parts from what vLLM computed:
digests of the KV pages and recurrent states a real vLLM engine holds, taken
around each forward, in a drive.py process (``--state-probe``), and their
comparison across two runs of the ttft phase (recompute and tutti).

In the engine (``install``): before each forward, for every request in the
batch, the digest of each Mamba group's state in the block the step runs it
in (the state the step starts from: after vLLM's own copy and a connector's
load) and, on a request's first step after a hit, of every full-attention
block the hit covers; after it, the state there (the state at the step's
end) and the full-attention blocks the step completed. One record per
(request, when, position), at most ``MAX_RECORDS``: the probe reads pages back
to the host, so it is a diagnostic, never a timing run.

Compared (``python3 state_probe.py --recompute A.json --tutti B.json``), per
document: the state a restored question starts from in tutti's run against
the state at the same position after the document's prefill (in tutti's run,
what its save should have read, and in recompute's); each restored
full-attention block against the same block after the prefill. A difference
in tutti's run alone places the fault: prefill states that differ between
the runs (tutti's prefill computed differently), a restored state that
differs from its own run's prefill (the save or the restore), or restored
attention blocks (the full group).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

MAX_RECORDS = 20000


def _runner(llm):
    """The engine's GPUModelRunner (an in-process engine: drive.py --init normal)."""
    try:
        return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    except AttributeError as e:
        raise RuntimeError(f"state probe: no in-process model runner ({e}); run with VLLM_ENABLE_V1_MULTIPROCESSING=0") from e


class Probe:
    """Wraps a runner's execute_model and _model_forward (see the module doc)."""

    def __init__(self, runner):
        self.runner, self.records, self.dropped, self.error = runner, [], 0, None
        groups = runner.kv_cache_config.kv_cache_groups
        kind = [type(g.kv_cache_spec).__name__ for g in groups]  # vLLM's MambaSpec, FullAttentionSpec
        self.state_groups = [i for i, k in enumerate(kind) if k == "MambaSpec"]
        self.full_groups = [i for i, k in enumerate(kind) if k == "FullAttentionSpec"]
        self.block = {i: g.kv_cache_spec.block_size for i, g in enumerate(groups)}
        self.layers = {i: list(g.layer_names) for i, g in enumerate(groups)}
        self.ctx = runner.compilation_config.static_forward_context
        self.num_blocks = runner.kv_cache_config.num_blocks
        self._so = None
        self._seen = set()
        exec_model, forward = runner.execute_model, runner._model_forward

        def execute_model(scheduler_output, *a, **k):
            self._so = scheduler_output
            return exec_model(scheduler_output, *a, **k)

        def model_forward(*a, **k):
            self._safe_take("in")
            out = forward(*a, **k)
            self._safe_take("out")
            return out

        runner.execute_model, runner._model_forward = execute_model, model_forward

    def _digest(self, group: int, block: int) -> str:
        import torch

        h = hashlib.sha1()
        for name in self.layers[group]:
            kv = self.ctx[name].kv_cache
            for t in (kv if isinstance(kv, (list, tuple)) else [kv]):
                # Blocks-first or FlashAttention's (2, blocks, ...); a kernel block smaller than the
                # manager's makes that dimension a multiple of the pool's size.
                d = 0 if t.shape[0] % self.num_blocks == 0 else 1
                per = t.shape[d] // self.num_blocks
                page = t.narrow(d, block * per, per)
                h.update(page.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    def _add(self, rec):
        if len(self.records) >= MAX_RECORDS:
            self.dropped += 1
            return
        self.records.append(rec)

    def _safe_take(self, when: str):
        """A probe that fails stops, saying why in ``error``; the engine runs on."""
        if self.error is not None:
            return
        try:
            self._take(when)
        except Exception as e:  # a diagnostic's own fault must not cost the run
            self.error = f"{type(e).__name__}: {e}"
            print(f"[state probe] stopped: {self.error}", file=sys.stderr, flush=True)

    def _take(self, when: str):
        r, so = self.runner, self._so
        if so is None:
            return
        for rid in list(r.input_batch.req_ids):
            st = r.requests.get(rid)
            n = so.num_scheduled_tokens.get(rid, 0)
            if st is None or n == 0:
                continue
            c = st.num_computed_tokens
            pos = c if when == "in" else c + n
            first = rid not in self._seen  # the request's first step: c > 0 is a hit
            idx = r.mamba_state_idx.get(rid)
            if idx is not None and pos > 0:
                for g in self.state_groups:
                    b = st.block_ids[g][idx]
                    self._add({"req": rid, "when": when, "pos": pos, "group": g, "kind": "state", "block": int(b),
                               "first": first, "sha": self._digest(g, b)})
            for g in self.full_groups:
                bs = self.block[g]
                if when == "in" and c > 0 and first:
                    blocks = range(0, c // bs)  # a hit's blocks, on the request's first step
                elif when == "out":
                    blocks = range(c // bs, (c + n) // bs)  # the blocks this step completed
                else:
                    continue
                for j in blocks:
                    b = st.block_ids[g][j]
                    self._add({"req": rid, "when": when, "pos": (j + 1) * bs, "group": g, "kind": "full",
                               "block": int(b), "first": first, "sha": self._digest(g, b)})
            if when == "in":
                self._seen.add(rid)


def install(llm) -> Probe:
    return Probe(_runner(llm))


def _doc(req: str) -> str:
    return req.split("-", 1)[0]


def _role(req: str) -> str:
    """ "prefill" or "ttft": drive.py's request id, which vLLM's engine
    suffixes ("d0-prefill-8815d94d")."""
    parts = req.split("-")
    return parts[1] if len(parts) > 1 else ""


def _index(res):
    """{(doc, phase, kind, group, pos): sha} of one run: phase "prefill" (the
    state after a prefill step, a block a step completed) or "restored" (the
    ttft question's first step: the state it starts from, the hit's blocks)."""
    out = {}
    for r in res.get("state_probe", []):
        d = _doc(r["req"])
        if _role(r["req"]) == "prefill" and r["when"] == "out":
            out[(d, "prefill", r["kind"], r["group"], r["pos"])] = r["sha"]
        elif _role(r["req"]) == "ttft" and r["when"] == "in" and r["first"] and r["pos"] > 0:
            out[(d, "restored", r["kind"], r["group"], r["pos"])] = r["sha"]
    return out


def compare(recompute, tutti) -> dict:
    """{document: verdict} (see the module doc): of tutti's restored states
    and attention blocks, those equal to and differing from its own prefill's
    (``state_differ``, ``full_differ``: "g<group>@<position>"), where tutti's
    prefill differs from recompute's (``prefill_differ``), and restored parts
    no prefill record covers (``unmatched``)."""
    a, b = _index(recompute), _index(tutti)
    out = {}
    for d in sorted({k[0] for k in b if k[1] == "restored"}):
        v = {"state_equal": 0, "state_differ": [], "full_equal": 0, "full_differ": [], "prefill_differ": [],
             "unmatched": 0}
        for (doc, phase, kind, g, pos), sha in sorted(b.items()):
            if doc != d or phase != "restored":
                continue
            mine, ref = b.get((d, "prefill", kind, g, pos)), a.get((d, "prefill", kind, g, pos))
            if mine is None:
                v["unmatched"] += 1
                continue
            if ref is not None and ref != mine:
                v["prefill_differ"].append(f"{kind} g{g}@{pos}")
            if sha == mine:
                v[kind + "_equal"] += 1
            else:
                v[kind + "_differ"].append(f"g{g}@{pos}")
        out[d] = v
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recompute", required=True, help="drive.py ttft --state-probe, no connector")
    p.add_argument("--tutti", required=True, help="drive.py ttft --state-probe, tutti's connector")
    a = p.parse_args(argv)
    with open(a.recompute) as f:
        rec = json.load(f)
    with open(a.tutti) as f:
        tut = json.load(f)
    for res, name in ((rec, a.recompute), (tut, a.tutti)):
        if "state_probe" not in res:
            print(f"{name}: no state_probe records (drive.py --state-probe)", file=sys.stderr)
            return 2
        if res.get("state_probe_error"):
            print(f"[state probe] {name}: the probe stopped early: {res['state_probe_error']}")
    for d, v in compare(rec, tut).items():
        print(f"[state probe] {d}: restored states equal to tutti's prefill {v['state_equal']}, differ "
              f"{len(v['state_differ'])} {v['state_differ'][:6]}; restored attention blocks equal {v['full_equal']}, "
              f"differ {len(v['full_differ'])} {v['full_differ'][:6]}; tutti's prefill differs from recompute's at "
              f"{len(v['prefill_differ'])} {v['prefill_differ'][:6]}; unmatched {v['unmatched']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
