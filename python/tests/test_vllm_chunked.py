"""tutti.vllm.TuttiConnector under vLLM 0.26's scheduling (tests/vllm_engine.py
over the contract double, TP = 1, CPU tensors): a prompt longer than the
step's token budget is computed in chunks, its blocks allocated chunk by
chunk, and every full prompt block is saved, chunk by chunk; preempted and
aborted requests save only KV they computed, from their own blocks; a hit
never covers more than the prompt. Every restored block is compared with the
KV the request itself would compute (Engine.bad)."""

import os
import shutil
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


@unittest.skipIf(torch is None, NO_TORCH)
class ChunkedPrefillTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, DOUBLE)
        torch.set_num_threads(1)  # tiny tensors; the CI machine has 2 cores

    @classmethod
    def tearDownClass(cls):
        sys.path.remove(DOUBLE)

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="tutti-chunked-")
        self.addCleanup(shutil.rmtree, self.root, True)

    def engine(self, **kw):
        from vllm_engine import Engine
        e = Engine(self.root, **kw)
        self.addCleanup(e.close)
        return e

    def req(self, rid, tokens, **kw):
        from vllm_engine import BS
        from vllm.v1.request import Request
        return Request(rid, tokens, BS, **kw)

    def admitted(self, e, rid):
        """Steps until rid is scheduled; its computed tokens then (the hit)."""
        for _ in range(100):
            so = e.step()
            for nr in so.scheduled_new_reqs:
                if nr.req_id == rid:
                    return nr.num_computed_tokens
        self.fail(f"{rid} never scheduled")

    def test_every_chunk_is_saved(self):
        """A 600-token prompt prefilled 256 tokens a step: a later request
        sharing 480 of its tokens matches all 480."""
        e = self.engine(num_blocks=96, max_num_batched_tokens=256)
        a = list(range(1000, 1600))
        e.add(self.req("A", a, max_tokens=1))
        e.run()
        self.assertEqual(e.steps, 4)  # three chunks, and the step that tells the workers A finished
        e.wait_saves()
        e.add(self.req("B", a[:480] + list(range(7000, 7100)), max_tokens=1))
        self.assertEqual(self.admitted(e, "B"), 480)
        e.run()
        e.add(self.req("C", a, max_tokens=1))  # the whole prompt: every full block, the last token computed
        self.assertEqual(self.admitted(e, "C"), 592)
        e.run()
        self.assertEqual((e.bad, e.errors), ([], set()))

    def test_an_aborted_prompt_keeps_its_computed_chunks(self):
        """Aborted after two of its chunks: both are stored (a crash mid-prompt
        keeps what was computed), nothing after them."""
        e = self.engine(num_blocks=96, max_num_batched_tokens=256)
        a = list(range(2000, 2600))
        e.add(self.req("A", a, max_tokens=1))
        e.step()
        e.step()
        e.abort("A")
        e.run()
        e.wait_saves()
        e.add(self.req("B", a, max_tokens=1))
        self.assertEqual(self.admitted(e, "B"), 512)
        e.run()
        self.assertEqual((e.bad, e.errors), ([], set()))

    def test_preempted_requests_save_from_their_own_blocks(self):
        """Two long requests that do not fit together: one is preempted, its
        blocks go to the other, it resumes in other blocks. Every prompt block
        of both is stored with the KV of its own tokens."""
        e = self.engine(num_blocks=40, max_num_batched_tokens=256)
        p, q = list(range(3000, 3400)), list(range(4000, 4400))
        e.add(self.req("P", p, max_tokens=40))
        e.add(self.req("Q", q, max_tokens=40))
        e.run()
        self.assertGreater(e.preempted, 0, "nothing was preempted: the test proves nothing")
        e.wait_saves()
        for rid, toks in (("P2", p), ("Q2", q)):
            e.add(self.req(rid, toks, max_tokens=1))
            self.assertEqual(self.admitted(e, rid), 25 * 16 - 1)
            e.run()
        self.assertEqual((e.bad, e.errors), ([], set()))

    def test_never_more_than_the_prompt(self):
        """A request resumed after a preemption has output tokens past its
        64-token prompt; even where the store holds blocks that match them,
        the hit stops at the prompt."""
        e = self.engine(num_blocks=64, max_num_batched_tokens=256)
        a = list(range(5000, 5096))
        e.add(self.req("A", a, max_tokens=1))
        e.run()
        e.wait_saves()
        b = self.req("B", a[:64], max_tokens=100)
        b.append_output_token_ids(a[64:96] + [1, 2, 3, 4, 5])  # as if decoded before a preemption
        n, _ = e.sched.get_num_new_matched_tokens(b, 0)
        self.assertEqual(n, 64)
        e.sched.request_finished(b, [])


if __name__ == "__main__":
    unittest.main()
