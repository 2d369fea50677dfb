"""Blocks keyed by what they hold (tutti.keys, tutti.request_keys) under
tutti.vllm.TuttiConnector: two processes whose vLLM block hashes differ (no
PYTHONHASHSEED in one, another in the other) share a store, except where
vLLM's extra keys differ (LoRA, cache salt, multimodal inputs, prompt
embeddings: block by block, as vLLM folds them); a request whose extras
cannot be represented is a counted miss, never saved."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
DOUBLE = os.path.join(HERE, "vllm_double")

try:
    import torch
except ImportError:
    torch = None

NO_TORCH = "torch is not installed for this interpreter (Debian's python3-torch serves /usr/bin/python3)"
PROMPT = list(range(100, 300))  # 12 full blocks of 16, and 8 tokens


def _child(mode, root):
    """One process: an Engine of the double; prints a JSON report."""
    sys.path.insert(0, DOUBLE)
    sys.path.insert(0, HERE)
    torch.set_num_threads(1)
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.v1.request import Request
    from vllm_engine import BS, Engine

    def mm(ident):
        return [MultiModalFeatureSpec(ident, PlaceholderRange(16, 32))]

    embeds = torch.arange(len(PROMPT) * 8, dtype=torch.float32).reshape(len(PROMPT), 8)
    reqs = {
        "plain": {}, "lora-x": {"lora_request": LoRARequest("x", 1)}, "lora-y": {"lora_request": LoRARequest("y", 2)},
        "salt-1": {"cache_salt": "s1"}, "salt-2": {"cache_salt": "s2"}, "img-a": {"mm_features": mm("img-a")},
        "img-b": {"mm_features": mm("img-b")}, "embeds": {"prompt_embeds": embeds},
        "embeds-other": {"prompt_embeds": embeds + 1},
    }
    saved = ("plain", "lora-x", "salt-1", "img-a", "embeds")
    e = Engine(root, num_blocks=128, max_num_batched_tokens=512, engine_id=mode)
    out = {"hash0": Request("h", PROMPT, BS).block_hashes[0].hex(), "hits": {}}
    for name in (saved if mode == "save" else reqs):
        toks = None if name.startswith("embeds") else PROMPT
        e.add(Request(f"{name}-{mode}", toks, BS, max_tokens=1, **reqs[name]))
        while True:
            so = e.step()
            hit = [nr.num_computed_tokens for nr in so.scheduled_new_reqs]
            if hit:
                out["hits"][name] = hit[0]
                break
        e.run()
        e.wait_saves()
    e.add(Request("odd", PROMPT, BS, max_tokens=1, mm_features=mm(object())))  # no canonical encoding
    e.run()
    out.update(bad=len(e.bad), errors=len(e.errors), unkeyable=e.stats.get("unkeyable", 0))
    e.close()
    print(json.dumps(out))


@unittest.skipIf(torch is None, NO_TORCH)
class TwoProcessesTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="tutti-keys-")
        self.addCleanup(shutil.rmtree, self.root, True)

    def child(self, mode, hashseed):
        env = dict(os.environ)
        env.pop("PYTHONHASHSEED", None)
        if hashseed is not None:
            env["PYTHONHASHSEED"] = hashseed
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "child", mode, self.root], env=env,
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        return json.loads(r.stdout.strip().splitlines()[-1])

    def test_processes_with_other_block_hashes_share_blocks(self):
        a = self.child("save", None)  # vLLM's NONE_HASH random
        b = self.child("probe", "777")
        self.assertNotEqual(a["hash0"], b["hash0"], "vLLM's block hashes agree: the test proves nothing")
        full = 12 * 16
        self.assertEqual(b["hits"], {"plain": full, "lora-x": full, "lora-y": 0, "salt-1": full, "salt-2": 0,
                                     "img-a": full, "img-b": 16, "embeds": full, "embeds-other": 0})
        self.assertEqual((a["bad"], a["errors"], b["bad"], b["errors"]), (0, 0, 0, 0))
        self.assertEqual(b["unkeyable"], 1)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "child":
        _child(sys.argv[2], sys.argv[3])
    else:
        unittest.main()
