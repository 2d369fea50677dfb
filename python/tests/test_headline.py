"""eval/vllm/headline.py's pieces that run without a GPU: the docqa prompts
against the replay's plan and chains (eval/workload/testdata/docqa-headline.json,
pinned to the Go generator by eval/workload's golden test), the SLO and
rate-at-SLO arithmetic on synthetic runs, the report end to end on synthetic
result files, every backend's configuration, and (in the vLLM environment of
scripts/vllm-venv.sh, where it exists) those configurations built by vLLM
0.26's own config and connector classes (eval/vllm/headline_check.py)."""

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
import headline  # noqa: E402
import headline_stats as hs  # noqa: E402

from vllm_venv import PY as VENV_PY, missing as venv_missing  # noqa: E402
VOCAB = 128256


class DocQATest(unittest.TestCase):
    def test_plan_is_the_replays(self):
        p = docqa.load_plan()
        self.assertEqual(len(p.requests), 12 * 17)
        self.assertEqual((p.params["Documents"], p.params["QuestionsPerDoc"], p.block_tokens), (12, 17, 256))
        self.assertEqual(sorted({q.doc for q in p.requests}), list(range(12)))
        # Every question of every document, once.
        self.assertEqual(len({(q.doc, q.question) for q in p.requests}), 12 * 17)
        self.assertEqual(len(docqa.load_plan(first=64).requests), 64)

    def test_prompts_share_exactly_the_replays_blocks(self):
        p = docqa.load_plan()
        toks = docqa.prompts(p, VOCAB, "r0-3")
        self.assertEqual(docqa.check_blocks(p, toks), sum(len(q.hash_ids) for q in p.requests))
        self.assertTrue(all(docqa.TOKEN_MARGIN <= t < VOCAB - docqa.TOKEN_MARGIN for t in toks[0]))
        # The same salt gives the same ids in another call; another salt none of the same documents.
        self.assertEqual(docqa.prompts(p, VOCAB, "r0-3")[5], toks[5])
        other = docqa.prompts(p, VOCAB, "r1-3")
        self.assertEqual([len(t) for t in other], [len(t) for t in toks])
        self.assertNotEqual(other[0][:256], toks[0][:256])

    def test_check_blocks_catches_a_wrong_prompt(self):
        p = docqa.load_plan(first=40)
        toks = docqa.prompts(p, VOCAB, "x")
        # Another document's question gets this document's first token wrong: its chain says shared.
        d0 = p.requests[0].doc
        j = next(i for i, q in enumerate(p.requests) if i > 0 and q.doc == d0)
        bad = [list(t) for t in toks]
        bad[j][3] += 1
        with self.assertRaises(ValueError):
            docqa.check_blocks(p, bad)
        # Two documents made equal: the chains say different.
        k = next(i for i, q in enumerate(p.requests) if q.doc != d0 and q.doc_tokens >= 256)
        bad = [list(t) for t in toks]
        bad[k][:256] = toks[0][:256]
        with self.assertRaises(ValueError):
            docqa.check_blocks(p, bad)

    def test_arrivals_scale_with_the_rate(self):
        p = docqa.load_plan(first=64)
        one, four = docqa.arrivals_s(p, 1.0), docqa.arrivals_s(p, 4.0)
        self.assertEqual(one[0], 0.0)
        for a, b in zip(one, four):
            self.assertAlmostEqual(a / 4, b, places=9)
        # Poisson at 1/s: 63 gaps average about 1 s.
        self.assertTrue(0.6 < one[-1] / 63 < 1.5, one[-1])
        with self.assertRaises(ValueError):
            docqa.arrivals_s(p, 0)

    def test_bad_plan_is_named(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"params": {"RatePerS": 1, "BlockTokens": 256, "Seed": 1}, "requests": [
                {"doc": 0, "question": 0, "doc_tokens": 10, "question_tokens": 2, "arrival_ms": 5, "hash_ids": []},
                {"doc": 0, "question": 1, "doc_tokens": 10, "question_tokens": 2, "arrival_ms": 1, "hash_ids": []}]}, f)
        self.addCleanup(os.unlink, f.name)
        with self.assertRaisesRegex(ValueError, "out of order"):
            docqa.load_plan(f.name)


def run(rate, rnd, ttft_ms, failed=0, restored=None, secs=None):
    return {"rate": rate, "round": rnd, "ttft_s": [x / 1e3 for x in ttft_ms], "failed": failed,
            "restored_bytes": restored, "restore_s": secs}


class StatsTest(unittest.TestCase):
    def test_percentile_is_nearest_rank(self):
        v = list(range(1, 11))  # 1..10
        self.assertEqual(hs.percentile(v, 0.5), 5)
        self.assertEqual(hs.percentile(v, 0.9), 9)
        self.assertEqual(hs.percentile(v, 0.99), 10)
        self.assertEqual(hs.percentile([3.0], 0.9), 3.0)
        self.assertTrue(math.isnan(hs.percentile([], 0.5)))

    def test_slo_and_rate_at_slo(self):
        self.assertAlmostEqual(hs.slo_s([0.1] * 9 + [0.3]), 0.2)  # p90 of ten is the 9th
        with self.assertRaises(ValueError):
            hs.slo_s([])
        slo = 0.2
        rs = [run(3, 0, [50] * 10), run(6, 0, [100] * 10), run(12, 0, [100] * 8 + [300] * 2)]
        self.assertEqual(hs.rate_at_slo(rs, slo), (6, False))
        self.assertEqual(hs.rate_at_slo(rs[:2], slo), (6, True))  # none missed: a lower bound
        self.assertEqual(hs.rate_at_slo([run(3, 0, [500] * 10)] + rs[1:], slo), (0.0, False))
        # A failed request is a miss, and a rate after the first miss does not count.
        self.assertEqual(hs.rate_at_slo([rs[0], run(6, 0, [10] * 10, failed=1), run(12, 0, [10] * 10)], slo), (3, False))

    def test_backend_summary_and_spread(self):
        slo = 0.2
        rs = [run(rate, rnd, ms, restored=2 << 30, secs=0.5)
              for rate, rnd, ms in ((3, 0, [50] * 10), (6, 0, [300] * 10), (3, 1, [60] * 10), (6, 1, [150] * 10))]
        s = hs.backend_summary(rs, slo)
        self.assertEqual(s["rate_at_slo_rounds"], [3, 6])
        self.assertEqual((s["rate_at_slo"]["min"], s["rate_at_slo"]["median"], s["rate_at_slo"]["max"]), (3, 4.5, 6))
        r6 = hs.row_at(s, 6)
        self.assertEqual(r6["n"], 20)
        self.assertAlmostEqual(r6["p90_rounds"][0], 0.3)
        self.assertAlmostEqual(r6["restore_gbps"], (4 << 30) / 1.0 / 1e9)
        self.assertEqual(r6["meets"], [False, True])
        self.assertEqual(hs.tried_at_or_below(s, 4.5), 3)

    def test_ttft_by_what_was_cached(self):
        """A request nothing was cached for (a document's first) and one that
        found a prefix are told apart, from vLLM's num_cached_tokens."""
        r = run(3, 0, [400, 100, 120, 90])
        r["requests"] = [{"ttft_s": t / 1e3, "num_cached_tokens": c, "queue_s": qs / 1e3}
                         for t, c, qs in ((400, 0, 300), (100, 4096, 20), (120, 6144, 40), (90, 256, 10))]
        r["requests"] += [{"ttft_s": None}, {"ttft_s": 0.05, "num_cached_tokens": 16}]  # no queue time: not in its p50
        row = hs.row_at(hs.backend_summary([r], 0.2), 3)["by_cache"]
        self.assertEqual((row["cold"]["n"], row["cold"]["p50"], row["cold"]["queue_p50"]), (1, 0.4, 0.3))
        self.assertEqual((row["cached"]["n"], row["cached"]["max"], row["cached"]["queue_p50"]), (4, 0.12, 0.02))
        md = hs.markdown({"tutti-gpu": hs.backend_summary([r], 0.2)}, 0.2, ["tutti-gpu"], {})
        self.assertIn("| tutti-gpu | 3 | 1, 400.0, 400.0, 300.0 | 4, 90.0, 120.0, 20.0 |", md)

    def test_goals(self):
        slo = 0.2
        summ = {
            "tutti-gpu": hs.backend_summary([run(2, 0, [40] * 100), run(4, 0, [50] * 100), run(8, 0, [90] * 100)], slo),
            "lmcache-gds": hs.backend_summary([run(2, 0, [100] * 90 + [900] * 10), run(4, 0, [400] * 100)], slo),
            "offload-cpu": hs.backend_summary([run(2, 0, [35] * 100), run(4, 0, [45] * 100), run(8, 0, [80] * 100)], slo),
        }
        g = {x["goal"].split(" (")[0]: x for x in hs.goals(summ)}
        rate = g["rate at SLO >= 2.0x lmcache-gds"]
        self.assertAlmostEqual(rate["value"], 4.0)  # >= 8 against 2
        self.assertTrue(rate["met"])
        p99 = g["p99 at lmcache-gds's rate >= 4.6x lower"]
        self.assertAlmostEqual(p99["value"], 900 / 40)
        p50 = g["p50 within 1.2x of offload-cpu"]
        self.assertAlmostEqual(p50["value"], 40 / 35)
        self.assertTrue(p50["met"])
        self.assertFalse(g["tutti-gpu at or above offload-cpu on every rate"]["met"])  # p90 worse at every rate
        self.assertIsNone(hs.goals({"tutti-gpu": summ["tutti-gpu"]})[0]["met"])  # GDS did not run: n/a

    def test_json_safe_is_strict_json(self):
        """A GDS rate at SLO of zero makes tutti's ratio infinite: the report
        writes it as "inf" (strict JSON), an empty sample's NaN as null."""
        g = hs.goals({"tutti-gpu": hs.backend_summary([run(2, 0, [40] * 10)], 0.2),
                      "lmcache-gds": hs.backend_summary([run(2, 0, [900] * 10)], 0.2)})
        self.assertEqual(g[0]["value"], float("inf"))
        o = hs.json_safe({"goals": g, "p50": float("nan"), "low": (-float("inf"), 1.5)})
        back = json.loads(json.dumps(o, allow_nan=False))
        self.assertEqual((back["goals"][0]["value"], back["p50"], back["low"]), ("inf", None, ["-inf", 1.5]))

    def test_report_end_to_end(self):
        d = tempfile.mkdtemp(prefix="headline-report-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        files = {
            "none": {"backend": "none", "storage": "", "note": "no connector", "runs": [run(3, 0, [200] * 10)],
                     "unloaded": {"ttft_s": [0.05] * 8 + [0.1] * 2}},
            "tutti-gpu": {"backend": "tutti-gpu", "storage": "8 loops", "note": "tutti", "skipped": [],
                          "runs": [run(rate, rnd, ms, restored=1 << 30, secs=0.1) for rate, rnd, ms in
                                   ((3, 0, [60] * 10), (6, 0, [150] * 10), (3, 1, [70] * 10), (6, 1, [250] * 10))]},
            "lmcache-gds": {"backend": "lmcache-gds", "storage": "8 loops", "note": "LMCache", "skipped": [],
                            "runs": [dict(run(3, 0, [90] * 10), implied_restored_bytes=1 << 29)]},
        }
        for name, r in files.items():
            with open(os.path.join(d, f"headline-{name}-loops.json"), "w") as f:
                json.dump(r, f)
        a = headline.parse_args(["report", "--out-dir", d, os.path.join(d, "headline-*-loops.json")])
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(headline.report(a), 0)
        with open(os.path.join(d, "headline.json")) as f:
            out = json.load(f)
        st = out["storages"]["8 loops"]
        self.assertAlmostEqual(st["slo_s"], 0.2)
        self.assertEqual(st["backends"]["tutti-gpu"]["rate_at_slo_rounds"], [6, 3])
        with open(os.path.join(d, "headline.md")) as f:
            md = f.read()
        self.assertIn("| lmcache-gds | 3 | 10 | 90.0 |", md)
        self.assertIn("| 0.50 (vLLM's external hits x KV bytes/token) | — |", md)
        # Round 0 met the SLO at every rate tried: its 6 and the median are lower bounds.
        self.assertIn("| tutti-gpu | >= 4.5 | >= 6, 3 |", md)
        self.assertIn("| none | >= 3 | >= 3 |", md)


class ConfigTest(unittest.TestCase):
    def args(self, *extra):
        return headline.parse_args(["configs", "--dirs", json.dumps([f"/mnt/l{i}" for i in range(8)]),
                                    "--work-dir", "/tmp/h", *extra])

    def test_every_backend(self):
        a = self.args()
        got = {b: headline.backend_config(b, a) for b in headline.BACKENDS}
        self.assertIsNone(got["none"]["kv_transfer_config"])
        self.assertEqual(got["offload-cpu"]["kv_transfer_config"]["kv_connector_extra_config"],
                         {"cpu_bytes_to_use": 16 << 30})
        fs = got["offload-fs"]["kv_transfer_config"]["kv_connector_extra_config"]
        self.assertEqual(fs["spec_name"], "TieringOffloadingSpec")
        self.assertEqual(fs["secondary_tiers"], [{"type": "fs", "root_dir": "/mnt/l0/offload-fs"}])
        t = got["tutti-cpu"]["kv_transfer_config"]
        self.assertEqual((t["kv_connector"], t["kv_connector_module_path"]), ("TuttiConnector", "tutti.vllm"))
        self.assertEqual(t["kv_connector_extra_config"]["dirs"], [f"/mnt/l{i}/tutti-cpu" for i in range(8)])
        self.assertEqual(t["kv_connector_extra_config"]["path"], "cpu")
        self.assertEqual(t["kv_connector_extra_config"]["host_staging_bytes"], 4 << 30)  # LMCache's CPU buffer's size
        self.assertNotIn("host_staging_bytes", got["tutti-gpu"]["kv_transfer_config"]["kv_connector_extra_config"])
        for b, want, role, wait in (("tutti-gpu", None, "kv_both", None), ("tutti-gpu-async", True, "kv_both", None),
                                    ("tutti-gpu-auto", "auto", "kv_both", None),
                                    ("tutti-gpu-save", None, "kv_producer", None),
                                    ("tutti-gpu-hostwait", None, "kv_both", "host")):
            extra = got[b]["kv_transfer_config"]["kv_connector_extra_config"]
            self.assertEqual((extra["path"], extra.get("async_loads"), got[b]["kv_transfer_config"]["kv_role"],
                              extra.get("save_wait")), ("gpu", want, role, wait), b)
        for b in ("lmcache-disk", "lmcache-gds"):
            (path, text), = got[b]["files"].items()
            self.assertEqual(got[b]["env"]["LMCACHE_CONFIG_FILE"], path)
            cfg = {k: json.loads(v) for k, v in (line.split(": ", 1) for line in text.splitlines())}
            self.assertEqual((cfg["chunk_size"], cfg["local_cpu"]), (256, False))
        self.assertEqual(json.loads(got["lmcache-gds"]["files"]["/tmp/h/lmcache-lmcache-gds.yaml"].splitlines()[-1]
                                    .split(": ", 1)[1]), 4096)
        with self.assertRaisesRegex(ValueError, "want one of"):
            headline.backend_config("lmcache", a)
        with self.assertRaisesRegex(ValueError, "--dirs is empty"):
            headline.backend_config("tutti-gpu", headline.parse_args(["configs"]))

    def test_one_path_backends_say_which_path(self):
        a = self.args("--one-path-label", "one dm-stripe over 8 loops")
        for b in ("offload-fs", "lmcache-disk", "lmcache-gds"):
            cfg = headline.backend_config(b, a)
            self.assertEqual(cfg["dirs"], [f"/mnt/l0/{b}"])
            self.assertIn("one dm-stripe over 8 loops", cfg["note"])
        self.assertIn("the first of the 8 dirs", headline.backend_config("offload-fs", self.args())["note"])

    def test_fs_tier_files_dropped_between_runs(self):
        d = tempfile.mkdtemp(prefix="headline-fs-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        base = os.path.join(d, "_model_ab12_r0", "abc", "de_g0")
        os.makedirs(base)
        for name in ("1.bin", "2.bin", "3.tmp"):
            open(os.path.join(base, name), "w").close()
        open(os.path.join(d, "config.json"), "w").close()
        self.assertEqual(headline.drop_fs_tier_files(d), 3)
        self.assertEqual(os.listdir(base), [])
        self.assertTrue(os.path.exists(os.path.join(d, "config.json")))

    def test_gds_files_dropped_between_runs(self):
        d = tempfile.mkdtemp(prefix="headline-gds-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        base = os.path.join(d, "12", "34")
        os.makedirs(base)
        k = "vllm%40model%401%400%401234abcd%40bfloat16"
        for name in (k + ".kvcache.safetensors", k + ".kvcache.safetensors.metadata",
                     k + ".kvcache.safetensors.tmpAbCdEfGh", "other.txt"):
            open(os.path.join(base, name), "w").close()
        self.assertEqual(headline.drop_unevicted_files("lmcache-gds", d), 3)
        self.assertEqual(os.listdir(base), ["other.txt"])  # its directories stay: LMCache remembers making them
        self.assertEqual(set(headline.NO_EVICTION), {"offload-fs", "lmcache-gds"})

    def test_every_prompt_fits_max_model_len(self):
        # vLLM fails a request whose prompt and output exceed max_model_len: a row of failed requests.
        a = headline.parse_args(["run", "--backend", "none", "--out", "x", "--requests", "0"])
        plan = docqa.load_plan(a.plan, 0)
        self.assertLessEqual(max(q.prompt_tokens for q in plan.requests) + a.max_tokens, a.max_model_len)
        self.assertGreaterEqual(a.gpu_blocks * a.block_size, a.max_model_len)

    def test_engine_is_the_same_but_the_connector(self):
        a = self.args()
        none, tutti = headline.engine_kwargs(a, None), headline.engine_kwargs(a, {"kv_connector": "x"})
        self.assertEqual({k: v for k, v in tutti.items() if k != "kv_transfer_config"}, none)
        self.assertEqual((none["num_gpu_blocks_override"], none["max_num_batched_tokens"]), (2048, 8192))
        self.assertGreaterEqual(none["max_model_len"], max(q.prompt_tokens for q in docqa.load_plan().requests) + 8)

    @unittest.skipIf(venv_missing(), venv_missing())
    def test_vllm_builds_every_backend(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        env.setdefault("TUTTI_LIB", os.path.join(ROOT, "bin", "libtutti.so"))
        p = subprocess.run([VENV_PY, os.path.join(ROOT, "eval", "vllm", "headline_check.py")],
                           env=env, capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        for b in ("none", "offload-cpu", "offload-fs", "tutti-gpu", "tutti-cpu"):
            self.assertRegex(p.stdout, f"(?m)^{b}: ok")
        self.assertRegex(p.stdout, "offload-fs: ok.*TieringOffloadingManager, tier FileSystemTierManager")


class FakeEngine:
    """AsyncLLM's surface that headline.amain uses: a request's first token
    comes after 5 ms when its first block was seen before, 30 ms when not,
    1 ms more per request in flight; vLLM's request metrics filled as the
    output processor fills them."""

    class Out:
        def __init__(self, ttft, cached):
            self.outputs = [type("C", (), {"token_ids": [7], "finish_reason": "length"})()]
            self.metrics = type("M", (), {"first_token_latency": ttft, "queued_ts": 1.0, "scheduled_ts": 1.001,
                                          "first_token_ts": 1.0 + ttft})()
            self.num_cached_tokens = cached

    def __init__(self):
        self.seen, self.inflight, self.resets, self.loaded = set(), 0, 0, 0
        self.refuse = set()  # reset calls (1-based) answered False
        self.requests = []

    async def generate(self, prompt, sp, rid):
        import asyncio
        toks = prompt["prompt_token_ids"]
        self.requests.append((rid, len(toks)))
        hit = tuple(toks[:256]) in self.seen
        self.seen.add(tuple(toks[:256]))
        self.inflight += 1
        t = (0.005 if hit else 0.03) + 0.001 * self.inflight
        await asyncio.sleep(t)
        self.inflight -= 1
        self.loaded += (len(toks) // 256 * 256) * 131072 if hit else 0
        yield self.Out(t, 256 if hit else 0)

    async def reset_prefix_cache(self):
        self.resets += 1
        return self.resets not in self.refuse  # vLLM 0.26: False when a block is still held

    def shutdown(self):
        pass

    def metrics(self):
        return {("vllm:tutti_load_bytes", "", "value"): self.loaded,
                ("vllm:tutti_load_time_seconds", "", "sum"): self.loaded / 10e9,
                ("vllm:external_prefix_cache_hits", "", "value"): self.loaded // 131072}


class DriverTest(unittest.TestCase):
    def drive(self, *flags):
        d = tempfile.mkdtemp(prefix="headline-driver-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        out = os.path.join(d, "r.json")
        a = headline.parse_args(["run", "--backend", "tutti-gpu", "--out", out, "--dirs", json.dumps([d]),
                                 "--work-dir", d, "--requests", "12", "--rates", "40,80", "--settle-s", "0", *flags])
        eng = FakeEngine()
        import asyncio
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(asyncio.run(headline.amain(a, lambda a, cfg: (eng, None, VOCAB, eng.metrics))), 0)
        with open(out) as f:
            return json.load(f), eng

    def test_rounds_and_rates(self):
        r, eng = self.drive("--unloaded", "4")
        self.assertEqual(r["backend"], "tutti-gpu")
        self.assertEqual(len(r["unloaded"]["ttft_s"]), 4)
        self.assertEqual([(x["round"], x["rate"]) for x in r["runs"]], [(0, 40), (0, 80), (1, 40), (1, 80)])
        for x in r["runs"]:
            self.assertEqual((x["n"], x["failed"], len(x["ttft_s"])), (12, 0, 12))
            # Same requests in the same order: the plan's prompt lengths, this run's salt in every id.
            self.assertEqual([q["prompt_tokens"] for q in x["requests"]],
                             [q.prompt_tokens for q in docqa.load_plan(first=12).requests])
            self.assertIn("max_sent_late_s", x)  # how late the client sent (a load figure, not asserted)
            self.assertGreater(x["restored_bytes"], 0)  # later questions of a document hit
            self.assertAlmostEqual(x["restore_s"], x["restored_bytes"] / 10e9)
        # 2 warm-up + 4 unloaded + 4 runs of 12, each run after a reset of the GPU cache.
        self.assertEqual(len(eng.requests), 2 + 4 + 48)
        self.assertEqual(eng.resets, 5)
        self.assertEqual({rid.rsplit("-", 1)[0] for rid, _ in eng.requests},
                         {"warmup", "unloaded", *(f"tutti-gpu-r{k}-{r}" for k in (0, 1) for r in (40, 80))})

    def test_refused_reset_is_retried_and_recorded(self):
        async def go():
            eng = FakeEngine()
            eng.refuse = {1, 2}
            ok = await headline.reset_gpu_cache(eng, tries=3, wait_s=0)
            eng2 = FakeEngine()
            eng2.refuse = {1, 2, 3}
            return ok, eng.resets, await headline.reset_gpu_cache(eng2, tries=3, wait_s=0)

        import asyncio
        self.assertEqual(asyncio.run(go()), (True, 3, False))
        r, _ = self.drive()
        self.assertTrue(all(x["gpu_cache_reset"] for x in r["runs"]))

    def test_a_missed_rate_skips_the_higher_ones(self):
        r, _ = self.drive("--slo-ms", "1")
        self.assertEqual([(x["round"], x["rate"]) for x in r["runs"]], [(0, 40), (1, 40)])
        self.assertEqual([(x["round"], x["rate"]) for x in r["skipped"]], [(0, 80), (1, 80)])

    def test_no_request_metrics_stops_at_warm_up(self):
        class NoMetrics(FakeEngine):
            class Out(FakeEngine.Out):
                def __init__(self, ttft, cached):
                    super().__init__(ttft, cached)
                    self.metrics = None  # an engine without log_stats

        d = tempfile.mkdtemp(prefix="headline-driver-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        out = os.path.join(d, "r.json")
        a = headline.parse_args(["run", "--backend", "none", "--out", out, "--requests", "4", "--rates", "40"])
        eng = NoMetrics()
        import asyncio
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(asyncio.run(headline.amain(a, lambda a, cfg: (eng, None, VOCAB, eng.metrics))), 1)
        with open(out) as f:
            r = json.load(f)
        self.assertIn("no first token in vLLM's request metrics", r["error"])
        self.assertEqual((r["runs"], len(eng.requests)), ([], 1))

    def test_deadline(self):
        r, _ = self.drive("--deadline-s", "0.01")
        self.assertEqual(r["runs"], [])
        self.assertEqual(len(r["skipped"]), 4)



_FAKE_LMCACHE = {
    "lmcache/__init__.py": "torch_device_type = {dev!r}\n",
    "lmcache/native_storage_ops.py": "",
    "lmcache/v1/__init__.py": "",
    "lmcache/v1/platform/__init__.py": (
        "import math\n"
        "class CudaDeviceOps:\n"
        "    def copy(self): pass\n"
        "def resolve_device_ops(dev):\n"
        "    ops = CudaDeviceOps()\n"
        "    for i, f in enumerate({bound}):\n"
        "        setattr(ops, f'op{{i}}', getattr(math, f) if isinstance(f, str) else f)\n"
        "    return ops\n"),
}


class LMCacheOpsTest(unittest.TestCase):
    """eval/vllm/lmcache_ops.py against stand-ins of LMCache 0.5's layout:
    compiled functions (builtins) bound on the CUDA ops object pass; pure
    Python ones, a missing extension file or a CPU device fail, saying why."""

    def check(self, dev, bound, so=True):
        d = tempfile.mkdtemp(prefix="tutti-lmc-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        for rel, text in _FAKE_LMCACHE.items():
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as f:
                f.write(text.format(dev=dev, bound=bound))
        if so:
            open(os.path.join(d, "lmcache", "c_ops.cpython-312-x86_64-linux-gnu.so"), "w").close()
        os.makedirs(os.path.join(d, "torch"))
        with open(os.path.join(d, "torch", "__init__.py"), "w") as f:
            f.write("__version__ = '2.11.0+cu130'\nclass cuda:\n    is_available = staticmethod(lambda: False)\n")
        p = subprocess.run([sys.executable, os.path.join(ROOT, "eval", "vllm", "lmcache_ops.py")], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=d), timeout=60)
        return p.returncode, p.stdout

    def test_compiled_ops_bound(self):
        rc, out = self.check("cuda", ["sqrt", "floor", "ceil", "fabs", "exp", "log", "sin", "cos", "tan", "atan", "erf"])
        self.assertEqual(rc, 0, out)
        self.assertIn("11 compiled functions", out)

    def test_pure_python_ops_or_no_extension_or_cpu(self):
        for dev, bound, so, why in (("cuda", "[lambda: 0] * 12", True, "0 compiled functions"),
                                    ("cuda", ["sqrt"] * 3, True, "3 compiled functions"),
                                    ("cuda", ["sqrt", "floor", "ceil", "fabs", "exp", "log", "sin", "cos", "tan", "atan",
                                              "erf"], False, "extension files: none"),
                                    ("cpu", ["sqrt"] * 11, True, "not 'cuda'")):
            with self.subTest(dev=dev, bound=bound, so=so):
                rc, out = self.check(dev, bound, so)
                self.assertEqual(rc, 1, out)
                self.assertIn(why, out)

if __name__ == "__main__":
    unittest.main()


class ShellTest(unittest.TestCase):
    """eval/vllm/headline.sh's functions, sourced with the machine's pieces
    stubbed: what a caller captures holds no log line, and a missing stripe
    or a full /dev/shm is said, not met mid-start."""

    def sh(self, script):
        d = tempfile.mkdtemp(prefix="headline-sh-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        env = dict(os.environ, OUT=d)
        # $0 beside the script: run.sh and headline.sh find the root from it; not the script's name: sourced.
        p = subprocess.run(["bash", "-c", f'. eval/vllm/headline.sh\n{script}', os.path.join(ROOT, "eval", "vllm", "t")],
                           cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout

    def test_storage_dirs_prints_only_the_json(self):
        out = self.sh('loops_up() { log "storage: a log line"; LOOPDIRS=\'"/nonexistent/a/tutti","/nonexistent/b/tutti"\'; }\n'
                      'x=$(storage_dirs loops); echo "$x"')
        self.assertEqual(json.loads(out), ["/nonexistent/a/headline", "/nonexistent/b/headline"])

    def test_stripe_refused_on_a_full_dev_shm(self):
        out = self.sh('dmsetup() { :; }; shm_avail_gib() { echo 20; }; loops_make() { echo MADE; }\n'
                      'stripe_up >/dev/null; echo "rc=$? why=$STRIPE_WHY"')
        self.assertIn("rc=1", out)
        self.assertIn("/dev/shm has 20 GiB free", out)
        self.assertNotIn("MADE", out)

    def test_cpu_tiers_need_dev_shm(self):
        out = self.sh('echo $(shm_need_gib offload-cpu) $(shm_need_gib offload-fs) $(shm_need_gib tutti-gpu)')
        self.assertEqual(out.split(), ["17", "3", "0"])
