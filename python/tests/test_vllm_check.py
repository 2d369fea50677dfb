"""Check mode of tutti.vllm.TuttiConnector (kv_connector_extra_config
"check": {"dir": ...}; tutti.kvcheck) under the double's engine: every saved
block's KV is digested per layer as the engine computed it, every restored
block compared after its layer's load; a second process (here: a second
connector, reading what the first persisted) checks what the first saved; a
planted corruption is reported (counts, summary), never raised."""

import glob
import json
import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
DOUBLE = os.path.join(HERE, "vllm_double")

try:
    import torch
except ImportError:
    torch = None

NO_TORCH = "torch is not installed for this interpreter (Debian's python3-torch serves /usr/bin/python3)"
PROMPT = list(range(600, 900))  # 18 full blocks of 16, and 12 tokens


@unittest.skipIf(torch is None, NO_TORCH)
class CheckModeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, DOUBLE)
        torch.set_num_threads(1)

    @classmethod
    def tearDownClass(cls):
        sys.path.remove(DOUBLE)

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="tutti-check-")
        self.addCleanup(shutil.rmtree, self.root, True)
        self.check_dir = os.path.join(self.root, "check")

    def engine(self, engine_id):
        from vllm_engine import Engine
        return Engine(self.root, num_blocks=64, max_num_batched_tokens=128, engine_id=engine_id,
                      extra={"check": {"dir": self.check_dir}})

    def run_one(self, e, rid, tokens):
        from vllm_engine import BS
        from vllm.v1.request import Request
        e.add(Request(rid, tokens, BS, max_tokens=1))
        e.run()
        e.wait_saves()

    def summaries(self):
        """The summaries written, oldest first."""
        paths = sorted(glob.glob(os.path.join(self.check_dir, "*", "*", f"summary-{os.getpid()}-*.json")),
                       key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))
        out = []
        for p in paths:
            with open(p) as f:
                out.append(json.load(f))
        return out

    def test_restores_checked_across_processes(self):
        e = self.engine("first")
        self.run_one(e, "A", PROMPT)  # saved in chunks, digests recorded
        self.run_one(e, "B", PROMPT)  # restored and checked in this process
        self.assertEqual((e.stats["check_match"], e.stats["check_mismatch"], e.stats["check_unknown"]), (18 * 2, 0, 0))
        self.assertEqual(e.stats["check_recorded"], 18 * 2)
        e.close()
        e2 = self.engine("second")  # reads what the first persisted
        self.run_one(e2, "C", PROMPT[:200])
        self.assertEqual((e2.stats["check_match"], e2.stats["check_mismatch"], e2.stats["check_unknown"]), (12 * 2, 0, 0))
        e2.close()
        first, second = self.summaries()
        self.assertTrue(first["ok"] and second["ok"])
        self.assertEqual(first["per_layer"]["model.layers.1.self_attn.attn"]["match"], 18)
        self.assertEqual(second["per_layer"]["model.layers.1.self_attn.attn"]["match"], 12)

    def test_planted_corruption_is_reported(self):
        import tutti.store
        e = self.engine("first")
        self.addCleanup(e.close)
        self.run_one(e, "A", PROMPT)
        real = tutti.store.Load.wait_layer

        def corrupt_after_load(ld, layer):
            real(ld, layer)
            if layer == 1:  # the second layer's KV of the third restored block, overwritten before the check
                page = e.worker._worker._loads_spec[0].block_ids[2]
                e.kv["model.layers.1.self_attn.attn"][:, page] += 1
        with mock.patch.object(tutti.store.Load, "wait_layer", corrupt_after_load):
            self.run_one(e, "B", PROMPT)
        self.assertEqual((e.stats["check_match"], e.stats["check_mismatch"]), (18 * 2 - 1, 1))
        self.assertEqual(e.bad, [("B", 2, "model.layers.1.self_attn.attn")])  # the engine sees it too
        e.close()
        s, = self.summaries()
        self.assertFalse(s["ok"])
        self.assertEqual(s["mismatches"][0]["request"], "B")
        self.assertEqual((s["mismatches"][0]["block"], s["mismatches"][0]["layer"]), (2, "model.layers.1.self_attn.attn"))


if __name__ == "__main__":
    unittest.main()
