"""eval/vllm/harness_check.py: the replay harness's designs against the real
systems' runs, on fixtures in the formats their writers give (the replay's
--json rows with --at-rates: eval/harness.BackendResult and RateTTFT, pinned
by cmd/tutti's TestReplayAtRates; headline.py's result files: its amain and
run_record). No vLLM, no GPU."""

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "eval", "vllm"))

import docqa  # noqa: E402
import harness_check as hc  # noqa: E402

N = 20  # requests
RATES = [2.0, 3.0, 4.0]
PLAN = docqa.load_plan(first=N)
WORKLOAD = PLAN.workload
# The real SLO: 2 x p90 of the unloaded pass = 2 x 0.1 s.
UNLOADED = [0.1] * 24
SLO_S = 0.2


def ttfts(base_s, spread=0.01):
    """N TTFTs around base_s, in arrival order (not sorted)."""
    return [base_s + spread * ((i * 7) % N) / N for i in range(N)]


def real_file(backend, per_rate, rounds=2, storage="8 loops", requests=N, describe=WORKLOAD):
    """headline.py's result JSON: per_rate {rate: ttft_s list} for every round."""
    runs = [{"rate": rate, "round": rnd, "salt": f"r{rnd}-{rate:g}", "wall_s": 10.0, "n": requests, "failed": 0,
             "ttft_s": t, "requests": [], "local_hit_tokens": 0, "external_hit_tokens": 0, "preemptions": 0,
             "max_sent_late_s": 0.0}
            for rnd in range(rounds) for rate, t in sorted(per_rate.items())]
    return {"backend": backend, "note": "", "storage": "" if backend == "none" else storage,
            "args": {"rates": ",".join(f"{r:g}" for r in RATES), "requests": requests}, "kv_transfer_config": None,
            "engine_start_s": 40.0, "import_s": 5.0, "runs": runs, "skipped": [],
            "unloaded": {"ttft_s": UNLOADED, "failed": 0, "requests": [], "slo_s": SLO_S} if backend == "none" else None,
            "workload": {"describe": describe, "params": PLAN.params, "requests": requests}}


def replay_row(design, per_rate, requests=N, own_rate=9.5, skipped="", workload=WORKLOAD):
    """One `tutti replay --json --at-rates` row: per_rate {rate: ttft_s list}."""
    row = {"backend": design, "requests": requests, "ttft_ms_p50": 50.0, "ttft_ms_p90": 90.0, "ttft_ms_p99": 99.0,
           "max_rate_at_slo": own_rate, "bytes_per_s": 1e9, "compute": "gpu", "workload": workload}
    if skipped:
        row["skipped"] = skipped
    else:
        row["at_rates"] = [{"rate_per_s": r, "ttft_ms_p50": 0, "ttft_ms_p90": 0, "ttft_ms_p99": 0,
                            "ttft_ms": [x * 1e3 for x in t]} for r, t in sorted(per_rate.items())]
    return row


class Files:
    """Writes the fixtures to a temporary directory; paths out."""

    def __init__(self, test):
        self.d = tempfile.TemporaryDirectory()
        test.addCleanup(self.d.cleanup)

    def put(self, name, obj):
        p = os.path.join(self.d.name, name)
        with open(p, "w") as f:
            f.write(obj if isinstance(obj, str) else json.dumps(obj))
        return p


def run_main(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = hc.main(args)
    return code, out.getvalue(), err.getvalue()


class CompareTest(unittest.TestCase):
    def setUp(self):
        self.f = Files(self)

    def check(self, rows, reals, slo_ms=0):
        rp = self.f.put("replay.json", rows)
        paths = [self.f.put(f"headline-{r['backend']}.json", r) for r in reals]
        js = os.path.join(self.f.d.name, "check.json")
        args = ["check", "--replay", rp, "--json", js] + (["--slo-ms", str(slo_ms)] if slo_ms else []) + paths
        code, out, err = run_main(args)
        self.assertEqual(code, 0, err)
        with open(js) as fh:
            got = json.load(fh)
        return {e["design"]: e for e in got["designs"]}, got, out

    def test_table(self):
        base = {r: ttfts(0.05 + 0.01 * r) for r in RATES}
        for name, scale, flagged in [("equal", 1.0, False), ("10% off", 1.10, False), ("20% off", 1.20, True),
                                     ("20% under", 0.80, True)]:
            with self.subTest(name):
                harness = {r: [x * scale for x in t] for r, t in base.items()}
                got, _, out = self.check([replay_row("tutti-gpu", harness)], [real_file("tutti-gpu", base),
                                                                               real_file("none", base)])
                e = got["tutti-gpu"]
                self.assertEqual([row["rate"] for row in e["rates"]], RATES)
                for row in e["rates"]:
                    for q in ("p50", "p90", "p99"):
                        self.assertAlmostEqual(row[q]["ratio"], scale, places=9)
                        self.assertEqual(row[q]["flag"], flagged, (row["rate"], q))
                self.assertEqual(e["flagged"], flagged)
                self.assertIn("tutti-gpu" if flagged else "none (each", out.split("Off by more than")[1])

    def test_rate_at_slo_under_the_real_slo(self):
        # Real: p90 under 0.2 s at every rate (a lower bound, 4). Harness:
        # misses at 4 under the real SLO, though its own SLO gave it 9.5.
        real = {r: ttfts(0.1) for r in RATES}
        harness = {2.0: ttfts(0.1), 3.0: ttfts(0.15), 4.0: ttfts(0.3)}
        got, doc, out = self.check([replay_row("lmcache-gds", harness, own_rate=9.5)],
                                   [real_file("lmcache-gds", real), real_file("none", real)])
        self.assertAlmostEqual(doc["slo_s"], SLO_S)
        s = got["lmcache-gds"]["rate_at_slo"]
        self.assertEqual((s["harness"], s["real"], s["real_lower_bound"], s["harness_own"]), (3.0, 4.0, True, 9.5))
        self.assertAlmostEqual(s["ratio"], 0.75)
        self.assertTrue(s["flag"])
        self.assertIn("3 / >= 4", out)
        # --slo-ms overrides the unloaded pass: at 400 ms the harness meets every rate too.
        got, doc, _ = self.check([replay_row("lmcache-gds", harness)], [real_file("lmcache-gds", real)], slo_ms=400)
        self.assertAlmostEqual(doc["slo_s"], 0.4)
        self.assertEqual((got["lmcache-gds"]["rate_at_slo"]["harness"], got["lmcache-gds"]["rate_at_slo"]["flag"]),
                         (4.0, False))

    def test_not_compared(self):
        t = {r: ttfts(0.1) for r in RATES}
        rows = [replay_row("tutti-gpu", t), replay_row("dram", t), replay_row("lmcache-gds", {}, skipped="no cuFile")]
        got, _, out = self.check(rows, [real_file("tutti-gpu", t), real_file("none", t), real_file("lmcache-gds", t)])
        self.assertEqual(got["dram"]["not_compared"], "real offload-cpu not run")
        self.assertIn("skipped it: no cuFile", got["lmcache-gds"]["not_compared"])
        self.assertEqual(got["recompute"]["not_compared"], "the replay did not run it")
        self.assertNotIn("not_compared", got["tutti-gpu"])
        self.assertIn("| dram (offload-cpu) | not compared", out)

    def test_no_common_rate(self):
        t = {r: ttfts(0.1) for r in RATES}
        got, _, _ = self.check([replay_row("tutti-cpu", {7.0: t[2.0]})], [real_file("tutti-cpu", t), real_file("none", t)])
        self.assertIn("no rate both ran", got["tutti-cpu"]["not_compared"])

    def test_missing_rate_is_said(self):
        t = {r: ttfts(0.1) for r in RATES}
        got, _, _ = self.check([replay_row("tutti-cpu", {2.0: t[2.0], 3.0: t[3.0]})],
                               [real_file("tutti-cpu", t), real_file("none", t)])
        self.assertIn("[4.0]", got["tutti-cpu"]["note"])
        self.assertEqual(got["tutti-cpu"]["rate_at_slo"]["grid"], [2.0, 3.0])


class InputErrorTest(unittest.TestCase):
    def setUp(self):
        self.f = Files(self)
        self.t = {r: ttfts(0.1) for r in RATES}

    def test_malformed_and_mismatched(self):
        t = self.t
        no_at = replay_row("tutti-gpu", t)
        del no_at["at_rates"]
        short = replay_row("tutti-gpu", t)
        short["at_rates"][0]["ttft_ms"] = short["at_rates"][0]["ttft_ms"][:5]
        bad_run = real_file("tutti-gpu", t)
        bad_run["runs"][1]["ttft_s"] = "fast"
        loops, disk = real_file("tutti-gpu", t), real_file("tutti-cpu", t, storage="disk")
        for name, rows, reals, want in [
            ("not JSON", "{", [real_file("none", t)], "replay.json: not JSON"),
            ("not an array", {"backend": "x"}, [real_file("none", t)], "want the replay's --json array"),
            ("no at_rates", [no_at], [real_file("none", t)], "row 0 (tutti-gpu): no field 'at_rates'"),
            ("short ttft_ms", [short], [real_file("none", t)], "at_rates[0]: 5 TTFTs, the row has 20"),
            ("other requests", [replay_row("tutti-gpu", t)], [real_file("none", t, requests=64)],
             "field 'workload.requests' 64"),
            ("other workload", [replay_row("tutti-gpu", t)], [real_file("none", t, describe="docqa: 3 docs")],
             "field 'workload.describe'"),
            ("bad run", [replay_row("tutti-gpu", t)], [real_file("none", t), bad_run], "runs[1]: field 'ttft_s'"),
            ("no backend", [replay_row("tutti-gpu", t)], [{"runs": []}], "no field 'backend'"),
            ("two storages", [replay_row("tutti-gpu", t)], [real_file("none", t), loops, disk], "of 2 storages"),
            ("no SLO", [replay_row("tutti-gpu", t)], [real_file("tutti-gpu", t)], "no SLO: give --slo-ms"),
        ]:
            with self.subTest(name):
                rp = self.f.put("replay.json", rows)
                paths = [self.f.put(f"real-{i}.json", r) for i, r in enumerate(reals)]
                code, out, err = run_main(["check", "--replay", rp] + paths)
                self.assertEqual(code, 1, out)
                self.assertIn(want, err)
                self.assertTrue(err.startswith("harness_check: "), err)

    def test_missing_file_is_named(self):
        code, _, err = run_main(["check", "--replay", "/nonexistent/replay.json", "/nonexistent/h.json"])
        self.assertEqual(code, 1)
        self.assertIn("/nonexistent/replay.json", err)


class ReplayArgsTest(unittest.TestCase):
    def test_the_plans_parameters(self):
        code, out, _ = run_main(["replay-args", "--requests", "102", "--rates", "2,3,4"])
        self.assertEqual(code, 0)
        a = out.split()
        got = dict(zip(a[::2], a[1::2]))
        p = docqa.load_plan().params
        self.assertEqual((got["--workload"], got["--docqa-docs"], got["--docqa-min-doc-tokens"],
                          got["--docqa-max-doc-tokens"], got["--docqa-questions"], got["--block-tokens"],
                          got["--requests"], got["--at-rates"]),
                         ("docqa", str(p["Documents"]), str(p["MinDocTokens"]), str(p["MaxDocTokens"]),
                          str(p["QuestionsPerDoc"]), str(p["BlockTokens"]), "102", "2,3,4"))
        self.assertFalse(math.isnan(float(got["--docqa-rate"])))
        self.assertNotIn("--backends", got)

    def test_backends_become_their_designs(self):
        code, out, _ = run_main(["replay-args", "--requests", "64", "--rates", "3", "--backends", "none tutti-gpu offload-cpu"])
        self.assertEqual(code, 0)
        a = out.split()
        self.assertEqual(a[a.index("--backends") + 1], "recompute,tutti-gpu,dram")
        code, _, err = run_main(["replay-args", "--requests", "64", "--rates", "3", "--backends", "none,nosuch"])
        self.assertEqual(code, 1)
        self.assertIn("'nosuch'", err)


class HeadlineShellTest(unittest.TestCase):
    """headline.sh's harness_run, sourced with the storage stubbed and a
    stand-in for the replay: it asks for the plan's flags, the call's rates
    and backends' designs and the storage's own directories (named harness),
    then checks the replay's rows against this call's headline results."""

    def test_harness_run(self):
        f = Files(self)
        d = f.d.name
        t = {r: ttfts(0.1) for r in RATES}
        f.put("headline-none-loops.json", real_file("none", t))
        f.put("headline-tutti-gpu-loops.json", real_file("tutti-gpu", t))
        rows = f.put("rows.json", [replay_row("recompute", t), replay_row("tutti-gpu", t)])
        testkit = f.put("libtutti_testkit.so", "")
        cli = f.put("tutti", f'#!/bin/sh\necho "$@" >{d}/args.txt\necho "$TUTTI_TESTKIT_LIB" >{d}/testkit.txt\ncat {rows}\n')
        os.chmod(cli, 0o755)
        script = (f'. eval/vllm/headline.sh\nTUTTI_CLI={cli}; T0=$SECONDS\n'
                  f'loops_up() {{ LOOPDIRS=\'"{d}/l0/tutti","{d}/l1/tutti"\'; }}\n'
                  'harness_run loops; echo "rc=$?"')
        env = dict(os.environ, OUT=d, REQUESTS=str(N), RATES="2,3,4", BACKENDS="none tutti-gpu", BUDGET_S="540",
                   TESTKIT_LIB=testkit)
        p = subprocess.run(["bash", "-c", script, os.path.join(ROOT, "eval", "vllm", "t")], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertIn("rc=0", p.stdout, p.stdout + p.stderr)
        with open(os.path.join(d, "args.txt")) as fh:
            args = fh.read().split()
        self.assertEqual(args[args.index("--at-rates") + 1], "2,3,4")
        self.assertEqual(args[args.index("--backends") + 1], "recompute,tutti-gpu")
        self.assertEqual(args[args.index("--requests") + 1], str(N))
        with open(os.path.join(d, "testkit.txt")) as fh:  # its GPU prefill's library (a device run lacked it)
            self.assertEqual(fh.read().strip(), testkit)
        self.assertEqual(args[args.index("--dir") + 1], f"{d}/l0/harness,{d}/l1/harness")
        with open(os.path.join(d, "harness-check-loops.json")) as fh:
            got = {e["design"]: e for e in json.load(fh)["designs"]}
        self.assertFalse(got["tutti-gpu"]["flagged"])
        self.assertTrue(os.path.exists(os.path.join(d, "harness-check-loops.md")))


if __name__ == "__main__":
    unittest.main()
