"""eval/vllm/state_probe.py: the digests a probe takes around a runner's
forwards (a runner of vLLM's shape over CPU tensors: a full-attention group
in FlashAttention's layout, a Mamba group's states as per-block tensors) and
the verdict that places where a restored prefix parts from its prefill."""

import os
import sys
import unittest
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "eval", "vllm"))

try:
    import torch
except ImportError:  # the suite's own Python may lack torch
    torch = None

import state_probe  # noqa: E402

B, NB = 4, 64  # tokens per block, the pool's blocks


class FullAttentionSpec(SimpleNamespace):
    pass


class MambaSpec(SimpleNamespace):
    pass


class Runner:
    """Plays GPUModelRunner's parts the probe reads: a forward writes each
    completed attention block's KV and the step's end state into the running
    block, as functions of (document, position); ``corrupt``: the restored
    state a hit starts from is wrong (what a broken save or restore does)."""

    def __init__(self, corrupt=False):
        self.corrupt = corrupt
        self.kv_cache_config = SimpleNamespace(num_blocks=NB, kv_cache_groups=[
            SimpleNamespace(kv_cache_spec=FullAttentionSpec(block_size=B), layer_names=["a0"]),
            SimpleNamespace(kv_cache_spec=MambaSpec(block_size=B), layer_names=["m0"])])
        self.kv = torch.zeros(2, NB, B, 1, 2)
        self.states = [torch.zeros(NB, 3), torch.zeros(NB, 2, 2)]
        self.compilation_config = SimpleNamespace(static_forward_context={
            "a0": SimpleNamespace(kv_cache=self.kv), "m0": SimpleNamespace(kv_cache=self.states)})
        self.input_batch = SimpleNamespace(req_ids=[])
        self.requests, self.mamba_state_idx = {}, {}
        self._next = 1
        self._so = None

    def add(self, rid, computed=0, restored_from=None):
        """A request; ``computed`` tokens hit, their blocks copied from
        request ``restored_from``'s."""
        n = 6
        ids = [[self._take() for _ in range(n)], [self._take() for _ in range(n)]]
        self.requests[rid] = SimpleNamespace(num_computed_tokens=computed, block_ids=ids)
        if restored_from:
            src = self.requests[restored_from].block_ids
            for j in range(computed // B):
                self.kv[:, ids[0][j]] = self.kv[:, src[0][j]]
            for x in self.states:
                x[ids[1][computed // B - 1]] = x[src[1][computed // B - 1]] + (1 if self.corrupt else 0)

    def _take(self):
        self._next += 1
        return self._next - 1

    def execute_model(self, so):
        self._so = so
        self.input_batch.req_ids = list(so.num_scheduled_tokens)
        for rid, n in so.num_scheduled_tokens.items():  # vLLM's align mode: the state runs in block ceil((c+n)/B)-1
            st = self.requests[rid]
            prev = self.mamba_state_idx.get(rid, (st.num_computed_tokens - 1) // B)
            cur = -(-(st.num_computed_tokens + n) // B) - 1
            if prev >= 0 and prev != cur:
                for x in self.states:
                    x[st.block_ids[1][cur]] = x[st.block_ids[1][prev]]
            self.mamba_state_idx[rid] = cur
        self._model_forward()
        for rid, n in so.num_scheduled_tokens.items():
            self.requests[rid].num_computed_tokens += n

    def _model_forward(self):
        for rid, n in self._so.num_scheduled_tokens.items():
            st, doc = self.requests[rid], int(rid[1])
            c = st.num_computed_tokens
            for j in range(c // B, (c + n) // B):
                self.kv[:, st.block_ids[0][j]] = doc * 100 + j
            for i, x in enumerate(self.states):
                x[st.block_ids[1][self.mamba_state_idx[rid]]] = doc * 1000 + c + n + i


def step(r, **sched):
    r.execute_model(SimpleNamespace(num_scheduled_tokens=sched))


def run(corrupt=False):
    r = Runner(corrupt)
    p = state_probe.Probe(r)
    pre = [f"d{d}-prefill-{d:08x}" for d in (0, 1)]  # vLLM's engine suffixes drive.py's request ids
    for rid in pre:
        r.add(rid)
    for n in (4, 4, 1):  # 9 tokens: blocks 0, 1 and a partial one
        step(r, **{rid: n for rid in pre})
    for d in (0, 1):
        r.add(f"d{d}-ttft-{d:08x}", computed=8, restored_from=pre[d])
        step(r, **{f"d{d}-ttft-{d:08x}": 3})
    return {"state_probe": p.records}


@unittest.skipIf(torch is None, "torch is not importable by this Python (CI runs the suite with Debian's, which has it)")
class StateProbeTest(unittest.TestCase):
    def test_restored_prefix_equal_to_its_prefill(self):
        v = state_probe.compare(run(), run())
        self.assertEqual(sorted(v), ["d0", "d1"])
        for d in v.values():
            self.assertEqual(d["state_equal"], 1)  # the state at position 8
            self.assertEqual(d["full_equal"], 2)  # blocks 0 and 1
            self.assertEqual((d["state_differ"], d["full_differ"], d["prefill_differ"], d["unmatched"]),
                             ([], [], [], 0))

    def test_a_wrong_restored_state_is_placed(self):
        v = state_probe.compare(run(), run(corrupt=True))
        for d in v.values():
            self.assertEqual(d["state_differ"], ["g1@8"])
            self.assertEqual(d["full_equal"], 2)
            self.assertEqual(d["prefill_differ"], [])

    def test_a_prefill_that_differs_between_runs(self):
        ref = run()
        for rec in ref["state_probe"]:
            if rec["req"].startswith("d1-prefill") and rec["kind"] == "state":
                rec["sha"] = "0" * 16
        v = state_probe.compare(ref, run())
        self.assertEqual(v["d0"]["prefill_differ"], [])
        self.assertEqual(v["d1"]["prefill_differ"], ["state g1@8"])


if __name__ == "__main__":
    unittest.main()
