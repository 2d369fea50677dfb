"""eval/vllm/compare.py, the verdict of one run.sh check case: greedy outputs
against the baseline's (required equal only where both runs had vLLM's
batch-invariant kernels), finished requests, tutti's hits in the second
process."""

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

import compare  # noqa: E402


class CompareTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tutti-compare-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_json(self, name, tokens, invariant, hits=0, finish="length"):
        p = os.path.join(self.dir, name + ".json")
        reqs = {f"d0q{i}": {"tokens": t, "finish_reason": finish, "top": [[[t[0], -1.0]]]} for i, t in enumerate(tokens)}
        with open(p, "w") as f:
            json.dump({"requests": reqs, "batch_invariant": invariant,
                       "metrics": {"vllm:tutti_hit_tokens": hits, "vllm:tutti_load_error_blocks": 0}}, f)
        return p

    def verdict(self, run_tokens, invariant, base_invariant=True, finish="length"):
        out = os.path.join(self.dir, "out.json")
        with contextlib.redirect_stdout(io.StringIO()):
            rc = compare.main(["--case", "m:loops:gpu", "--json", out,
                               "--baseline", self.run_json("base", [[1, 2, 3], [4, 5, 6]], base_invariant),
                               "--first", self.run_json("first", run_tokens, invariant, finish=finish),
                               "--second", self.run_json("second", run_tokens, invariant, hits=64, finish=finish)])
        with open(out) as f:
            return rc, json.load(f)

    def test_outputs(self):
        for name, tokens, invariant, base_invariant, finish, want_rc, want_parted in (
            ("equal, invariant", [[1, 2, 3], [4, 5, 6]], True, True, "length", 0, 0),
            ("part, invariant: fails", [[1, 2, 3], [4, 7, 6]], True, True, "length", 1, 1),
            ("part, no invariant kernels: reported", [[1, 2, 3], [4, 7, 6]], False, False, "length", 0, 1),
            ("part, invariant in one run only: reported", [[1, 2, 3], [4, 7, 6]], True, False, "length", 0, 1),
            ("an error finish fails", [[1, 2, 3], [4, 5, 6]], False, False, "error", 1, 0),
        ):
            with self.subTest(name):
                rc, r = self.verdict(tokens, invariant, base_invariant, finish)
                self.assertEqual(rc, want_rc)
                self.assertEqual(len(r["phases"]["first"]["parted"]), want_parted)
                self.assertEqual(r["phases"]["first"]["batch_invariant"], invariant and base_invariant)
                if want_parted:
                    self.assertEqual(r["phases"]["first"]["parted"][0]["position"], 1)

    def test_control_is_reported_not_judged(self):
        """--control: vLLM's OffloadingConnector's first phase against the
        baseline, tutti's against it, with the cached tokens of each; the
        verdict stays the baseline's."""
        out = os.path.join(self.dir, "out.json")
        base = self.run_json("base", [[1, 2, 3], [4, 5, 6]], True)
        first = self.run_json("first", [[1, 2, 3], [4, 7, 6]], True)
        control = self.run_json("control", [[1, 2, 3], [4, 7, 8]], True)
        with open(first) as f:
            r = json.load(f)
        r["requests"]["d0q1"]["num_cached_tokens"] = 6144
        with open(first, "w") as f:
            json.dump(r, f)
        with contextlib.redirect_stdout(io.StringIO()):
            rc = compare.main(["--case", "m:loops:gpu", "--json", out, "--baseline", base, "--first", first,
                               "--second", self.run_json("second", [[1, 2, 3], [4, 5, 6]], True, hits=64),
                               "--control", control])
        with open(out) as f:
            c = json.load(f)["control"]
        self.assertEqual(rc, 1)  # tutti's d0q1 parts from the baseline under invariant kernels: still a failure
        self.assertEqual((c["equal_to_baseline"], len(c["parted_from_baseline"]), c["tutti_equal_to_control"]), (1, 1, 1))
        d = c["tutti_parted_from_control"][0]
        self.assertEqual((d["request"], d["position"], d["tutti_cached_tokens"]), ("d0q1", 2, 6144))


if __name__ == "__main__":
    unittest.main()
