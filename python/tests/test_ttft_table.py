"""eval/vllm/ttft_table.py: the TTFT table of run.sh's ttft phase, with or
without vLLM's OffloadingConnector's row (it may fail on a hybrid model:
that costs its row, not tutti's); drive.py's prefix-cache reset before it."""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "eval", "vllm"))

import drive  # noqa: E402
import ttft_table  # noqa: E402


class TTFTTableTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tutti-ttft-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_json(self, name, ttfts, tokens=(7, 9), top=-1.5, cached=32, invariant=False, local=None):
        p = os.path.join(self.dir, name + ".json")
        with open(p, "w") as f:
            json.dump({"ttft": [{"request": f"d{i}-ttft", "ttft_s": t, "cached": cached, "tokens": [tokens[i]],
                                 "top": [[[tokens[i], top], [3, top - 0.5]]],
                                 **({"hits": {"prefix_cache_hits": local[i], "external_prefix_cache_hits":
                                              cached - local[i]}} if local else {})}
                                for i, t in enumerate(ttfts)],
                       "block_size": 16, "batch_invariant": invariant,
                       "kv_cache_groups": [{"spec": "SlidingWindowSpec"}, {"spec": "FullAttentionSpec"}]}, f)
        return p

    def table(self, *args):
        out = os.path.join(self.dir, "out.json")
        with contextlib.redirect_stdout(io.StringIO()):
            rc = ttft_table.main(["--case", "m:loops:gpu", "--recompute", self.run_json("none", [0.4, 0.6]),
                                  "--tutti", self.run_json("tutti", [0.1, 0.1]), "--json", out, *args])
        with open(out) as f:
            return rc, json.load(f)

    def test_with_and_without_offloading(self):
        rc, r = self.table("--offloading", self.run_json("off", [0.2, 0.2]))
        self.assertEqual((rc, r["ok"], r["offloading_ran"], r["offloading"]["median_s"]), (0, True, True, 0.2))
        rc, r = self.table()  # its run failed: no row, tutti's still there
        self.assertEqual((rc, r["ok"], r["offloading_ran"]), (0, True, False))
        self.assertNotIn("offloading", r)
        self.assertEqual(r["tutti"]["median_s"], 0.1)

    def test_a_question_from_vllms_own_cache_is_no_restore(self):
        """A connector's question served by vLLM's own prefix cache (a reset
        that left a document there) fails the table; recompute's hits and
        a connector's are fine."""
        out = os.path.join(self.dir, "out.json")

        def run(tutti_local):
            with contextlib.redirect_stdout(io.StringIO()):
                rc = ttft_table.main(["--case", "m:loops:gpu", "--json", out,
                                      "--recompute", self.run_json("none", [0.4, 0.6], local=(32, 0)),
                                      "--tutti", self.run_json("tutti", [0.1, 0.1], local=tutti_local)])
            with open(out) as f:
                return rc, json.load(f)
        rc, r = run((0, 0))
        self.assertEqual((rc, r["ok"], r["served_from_vllm_cache"], r["tutti"]["connector_hit_tokens"]),
                         (0, True, [], [32, 32]))
        rc, r = run((0, 16))
        self.assertEqual((rc, r["ok"], r["served_from_vllm_cache"]), (1, False, ["tutti"]))

    def test_vllms_own_cache_is_the_control(self):
        """--vllm-cache: no connector, the questions from vLLM's own cache
        (its hits are its own, not a flaw): tutti's answers must equal it
        bit for bit where both served the same cached tokens."""
        out = os.path.join(self.dir, "out.json")

        def run(top):
            with contextlib.redirect_stdout(io.StringIO()):
                rc = ttft_table.main(["--case", "m:loops:gpu", "--json", out,
                                      "--recompute", self.run_json("none", [0.4, 0.6], tokens=(8, 8), cached=0),
                                      "--tutti", self.run_json("tutti", [0.1, 0.1], local=(0, 0)),
                                      "--vllm-cache", self.run_json("ctl", [0.05, 0.05], top=top, local=(32, 32))])
            with open(out) as f:
                return rc, json.load(f)
        rc, r = run(-1.5)
        self.assertEqual((rc, r["ok"], r["served_from_vllm_cache"]), (0, True, []))
        self.assertEqual(r["agreement"]["vllm_cache"],
                         {"compared": 2, "same_first_token": 2, "same_top_logprobs": 2, "differ": []})
        rc, r = run(-1.25)
        self.assertEqual((rc, r["ok"], r["agreement"]["vllm_cache"]["differ"]), (1, False, ["d0-ttft", "d1-ttft"]))

    def test_outputs_against_offloading_and_recompute(self):
        # Same KV restored at the same point: first tokens and log-probs equal bit for bit.
        rc, r = self.table("--offloading", self.run_json("off", [0.2, 0.2]))
        self.assertEqual(r["agreement"]["offloading"],
                         {"compared": 2, "same_first_token": 2, "same_top_logprobs": 2, "differ": []})
        # A log-prob off in the last bit is a wrong restore: the table fails.
        rc, r = self.table("--offloading", self.run_json("off", [0.2, 0.2], top=-1.5000001))
        self.assertEqual((rc, r["ok"], r["agreement"]["offloading"]["differ"]), (1, False, ["d0-ttft", "d1-ttft"]))
        # ... and where they part is kept: the position, both tops, the largest log-prob difference.
        p = r["parts"]["offloading"]["d0-ttft"]
        self.assertEqual((p["position"], p["tokens"], p["top"][1][0]), (0, [[7], [7]], [7, -1.5000001]))
        self.assertAlmostEqual(p["max_logprob_diff"], 1e-7, delta=1e-9)
        self.assertEqual(r["parts"]["recompute"], {})
        # The OffloadingConnector served other cached tokens: nothing to compare exactly, nothing failed.
        rc, r = self.table("--offloading", self.run_json("off", [0.2, 0.2], tokens=(8, 8), cached=16))
        self.assertEqual((rc, r["agreement"]["offloading"]["compared"]), (0, 0))
        # Recompute ran other batches: first tokens only, a difference is reported, never a failure.
        out = os.path.join(self.dir, "out.json")
        with contextlib.redirect_stdout(io.StringIO()):
            rc = ttft_table.main(["--case", "m:loops:gpu",
                                  "--recompute", self.run_json("none", [0.4, 0.6], tokens=(7, 8)),
                                  "--tutti", self.run_json("tutti", [0.1, 0.1]), "--json", out])
        with open(out) as f:
            r = json.load(f)
        self.assertEqual((rc, r["agreement"]["recompute"]["same_first_token"], r["agreement"]["recompute"]["differ"]),
                         (0, 1, ["d1-ttft"]))

    def test_batch_invariant_recompute_is_bitwise(self):
        """Both runs with vLLM's batch-invariant kernels: recompute's log-probs
        must be tutti's bit for bit (a difference fails); with them in one run
        only, first tokens alone are compared, as without."""
        def run(recompute_top, tutti_invariant=True):
            out = os.path.join(self.dir, "out.json")
            with contextlib.redirect_stdout(io.StringIO()):
                rc = ttft_table.main(["--case", "m:loops:gpu", "--json", out,
                                      "--recompute", self.run_json("none", [0.4, 0.6], top=recompute_top, cached=0,
                                                                   invariant=True),
                                      "--tutti", self.run_json("tutti", [0.1, 0.1], invariant=tutti_invariant)])
            with open(out) as f:
                return rc, json.load(f)
        rc, r = run(-1.5)
        self.assertEqual((rc, r["ok"], r["batch_invariant"]), (0, True, True))
        self.assertEqual(r["agreement"]["recompute"],
                         {"compared": 2, "same_first_token": 2, "same_top_logprobs": 2, "differ": []})
        rc, r = run(-1.5000001)
        self.assertEqual((rc, r["ok"], r["agreement"]["recompute"]["differ"]), (1, False, ["d0-ttft", "d1-ttft"]))
        rc, r = run(-1.5000001, tutti_invariant=False)
        self.assertEqual((rc, r["ok"], r["batch_invariant"], r["agreement"]["recompute"]["differ"]),
                         (0, True, False, []))



class ResetTest(unittest.TestCase):
    """drive.py's prefix-cache reset before the questions: vLLM refuses it
    while a block is held (a connector run's last frees wait for a later
    step), so it steps the engine until the reset succeeds, or fails."""

    class Engine:
        def __init__(self, held_steps):
            self.held, self.steps = held_steps, 0

        def step(self):
            self.steps += 1
            self.held = max(0, self.held - 1)
            return []

    class LLM:
        def __init__(self, engine):
            self.engine = engine

        def reset_prefix_cache(self):
            return self.engine.held == 0

    def test_steps_until_the_reset_succeeds(self):
        e = self.Engine(held_steps=2)
        self.assertEqual(drive.reset_prefix_cache(self.LLM(e), e), 2)
        self.assertEqual(e.steps, 2)
        e = self.Engine(held_steps=0)
        self.assertEqual(drive.reset_prefix_cache(self.LLM(e), e), 0)

    def test_a_reset_that_never_succeeds_raises(self):
        e = self.Engine(held_steps=10 ** 6)
        with self.assertRaisesRegex(RuntimeError, "could not be reset"):
            drive.reset_prefix_cache(self.LLM(e), e)
        self.assertEqual(e.steps, drive.RESET_MAX_STEPS)


class HitCountsTest(unittest.TestCase):
    def test_vllms_and_the_connectors_hits_summed_over_labels(self):
        """drive.py's hit_counts: vLLM's own prefix-cache hits and a
        connector's, whatever labels vLLM puts on them."""
        from types import SimpleNamespace as N

        class LLM:
            def get_metrics(self):
                return [N(name="vllm:prefix_cache_hits", value=5, labels={"model_name": "m"}),
                        N(name="vllm:external_prefix_cache_hits", value=7, labels={"engine": "0"}),
                        N(name="vllm:external_prefix_cache_hits", value=1, labels={"engine": "1"}),
                        N(name="vllm:prefix_cache_queries", value=99, labels={})]
        self.assertEqual(drive.hit_counts(LLM()), {"prefix_cache_hits": 5, "external_prefix_cache_hits": 8})


if __name__ == "__main__":
    unittest.main()
