"""tutti's connector under vLLM 0.26.0's own scheduler (no double): eval/vllm/sched_cpu.py
in the virtual environment of scripts/vllm-venv.sh (made by `make test-deps`), a first
process and then a second one with another PYTHONHASHSEED, each checking every restored
token's KV in every layer. Skipped, saying why, where that environment is missing
(VLLM_VENV, default .venv-vllm); `make test` makes it where the disk holds it."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from vllm_venv import PY, ROOT, missing


@unittest.skipIf(missing(), missing())
class RealSchedulerTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tutti-vllm-real-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def phase(self, name, hashseed, script="sched_cpu.py", args=(), extra=None):
        """``extra``: kv_connector_extra_config keys over the script's (TUTTI_EXTRA)."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "TUTTI_EXTRA")}
        if extra:
            env["TUTTI_EXTRA"] = json.dumps(extra)
        if hashseed is not None:
            env["PYTHONHASHSEED"] = hashseed
        env["PYTHONPATH"] = os.path.join(ROOT, "python")
        env.setdefault("TUTTI_LIB", os.path.join(ROOT, "bin", "libtutti.so"))
        out = os.path.join(self.dir, f"{name}.json")
        p = subprocess.run([PY, os.path.join(ROOT, "eval", "vllm", script), *args, "--model",
                            os.path.join(ROOT, "eval", "vllm", "models", "llama3-8b"), "--dir",
                            os.path.join(self.dir, "store"), "--phase", name, "--json", out],
                           env=env, cwd=self.dir, capture_output=True, text=True, timeout=600)
        if not os.path.exists(out):
            self.fail(f"sched_cpu.py {name} wrote no result (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f), p

    def test_first_then_restart(self):
        self.first_then_restart()

    def test_async_loads_first_then_restart(self):
        """async_loads: vLLM holds each hit in WAITING_FOR_REMOTE_KVS until a
        worker reports its load ended; the same checks hold."""
        first, second = self.first_then_restart({"async_loads": True})
        self.assertIn("doc-again", first["waited_remote"])
        self.assertEqual(sorted(second["waited_remote"]), ["doc-restart"] + [f"long{i}-restart" for i in range(3)])

    def first_then_restart(self, extra=None):
        first, p = self.phase("first", "1", extra=extra)
        self.assertEqual(first.get("waited_remote") != [], bool(extra), p.stdout)
        self.assertEqual(first["bad"], [], p.stdout)
        self.assertEqual(first["checks"]["chunked"]["matched"], 480, p.stdout)
        self.assertGreater(first["checks"]["preempt"]["preemptions"], 0, p.stdout)
        self.assertEqual(first["checks"]["preempt"]["finished"], 3, p.stdout)
        # finished requests' saves went on reading their blocks, no wait, until vLLM allocated them again
        self.assertGreater(first["stats"]["save_ends_deferred"], 0, p.stdout)
        self.assertTrue(first["ok"], p.stdout)
        # A new process: vLLM's NONE_HASH is random again (no PYTHONHASHSEED).
        second, p = self.phase("restart", None, extra=extra)
        self.assertEqual(second["bad"], [], p.stdout)
        self.assertEqual(second["checks"]["restart"]["doc-restart"], 592, p.stdout)
        self.assertGreater(second["verified_tokens"], 0, p.stdout)
        # The connector's check mode: every restored block equals what the first process saved.
        self.assertGreater(second["check"]["match"], 0, p.stdout)
        self.assertEqual((second["check"]["mismatch"], second["check"]["unknown"]), (0, 0), p.stdout)
        self.assertTrue(second["ok"], p.stdout)
        return first, second


    def test_hybrid_first_then_restart(self):
        """vLLM's hybrid KV cache manager on (tutti.groups): full attention, a
        48-token sliding window and Mamba state in "align" mode; every
        restored block and state checked (eval/vllm/sched_cpu_hybrid.py)."""
        args = ("--groups", "full,sliding:48,state")
        first, p = self.phase("first", "1", "sched_cpu_hybrid.py", args)
        self.assertEqual(first["bad"], [], p.stdout)
        self.assertTrue(first["supports_hma"], p.stdout)  # vLLM's own test of SupportsHMA
        # The states kept (step ends at 256, 512, 640 tokens) bound the hit of 480 shared tokens to 256.
        self.assertEqual(first["checks"]["chunked"]["matched"], 256, p.stdout)
        self.assertGreater(first["checks"]["preempt"]["preemptions"], 0, p.stdout)
        self.assertGreater(first["verified"]["state"], 0, p.stdout)
        self.assertLessEqual(first["store_bytes"], (1 << 30) + (16 << 20), p.stdout)  # capacity_bytes over every group
        self.assertTrue(first["ok"], p.stdout)
        second, p = self.phase("restart", None, "sched_cpu_hybrid.py", args)
        self.assertEqual(second["bad"], [], p.stdout)
        self.assertEqual(second["checks"]["restart"]["doc-restart"], 512, p.stdout)
        self.assertGreater(second["verified"]["sliding"], 0, p.stdout)
        self.assertTrue(second["ok"], p.stdout)

    def test_hybrid_mamba_groups_first(self):
        """Qwen3-Next's order (the Mamba groups before the attention group):
        tutti's hits and states as in the other order; a preempted request
        vLLM resumes from its own hit without its state (evicted first) is
        counted, saved no more, and its wrong states are told apart as vLLM's."""
        r, p = self.phase("first", "1", "sched_cpu_hybrid.py", ("--groups", "state,state,full"))
        self.assertEqual(r["checks"]["chunked"]["matched"], 256, p.stdout)
        self.assertGreater(r["checks"]["preempt"]["preemptions"], 0, p.stdout)
        self.assertEqual(r["bad"], [], p.stdout)
        self.assertTrue(r["ok"], p.stdout)

    def test_hybrid_ttft_workload(self):
        """drive.py's ttft phase in Qwen3-Next's order at its proportions (4
        documents that do not all fit the cache, prefilled together, then one
        question each after a prefix-cache reset): every question hits every
        whole block of its document, and every state and token restored is
        the one its prefix gives (on the GPU, 2 of qwen3-next-tiny's 4 answers
        part: BENCHMARKS.md)."""
        # drive.py's 6,144-token documents, 64-token questions and 2,048-token steps over 272-token blocks, in 16-token ones
        r, p = self.phase("ttft", "1", "sched_cpu_hybrid.py", ("--groups", "state,state,state,full", "--blocks", "64",
                                                               "--budget-tokens", "120", "--doc-tokens", "361",
                                                               "--question-tokens", "4"))
        self.assertEqual(r["checks"]["ttft"]["matched"], {f"d{d}": 352 for d in range(4)}, p.stdout)
        self.assertEqual(r["bad"], [], p.stdout)
        self.assertTrue(r["ok"], p.stdout)

    def test_hybrid_mixed_hit(self):
        """A question whose document's first blocks are in vLLM's own cache
        and the rest in tutti's (what a prefix-cache reset that failed leaves
        drive.py's ttft phase): vLLM's hit then tutti's, every state and
        token restored the one its prefix gives."""
        r, p = self.phase("mixed", "1", "sched_cpu_hybrid.py", ("--groups", "state,state,state,full", "--blocks", "64",
                                                                "--budget-tokens", "120", "--doc-tokens", "361",
                                                                "--question-tokens", "4"))
        self.assertEqual(r["checks"]["mixed"], {"vllm_hit": 224, "tutti_hit": 128}, p.stdout)
        self.assertEqual(r["bad"], [], p.stdout)
        self.assertTrue(r["ok"], p.stdout)

    def test_hybrid_engine_hit_without_state(self):
        """vLLM 0.26 with a connector and Mamba layers takes its own hit group
        by group: its states evicted, the attention blocks still there, it
        resumes from its null block's state (vLLM's doing, docs/vllm.md);
        tutti counts it (vllm:tutti_engine_hit_incomplete)."""
        r, p = self.phase("evict-state", "1", "sched_cpu_hybrid.py", ("--groups", "full,sliding:48,state"))
        c = r["checks"]["evict-state"]
        self.assertEqual((c["engine_hit_incomplete"], c["resumed_at"]), (1, 480), p.stdout)
        self.assertGreater(c["vllm_wrong_states"], 0, p.stdout)
        self.assertTrue(r["ok"], p.stdout)

    def test_hybrid_worker_tensors(self):
        """The KV tensors vLLM 0.26's model runner hands a connector for the
        hybrid eval models (built by vLLM's own code on the CPU: groups,
        shared tensors, FlashAttention's layout, Mamba states' padded pages):
        tutti registers every group and moves its pages bit for bit, touching
        nothing else of the tensors the groups share (eval/vllm/worker_cpu_hybrid.py)."""
        out = os.path.join(self.dir, "worker.json")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        env.setdefault("TUTTI_LIB", os.path.join(ROOT, "bin", "libtutti.so"))
        p = subprocess.run([PY, os.path.join(ROOT, "eval", "vllm", "worker_cpu_hybrid.py"), "--dir",
                            os.path.join(self.dir, "store"), "--json", out], env=env, cwd=self.dir,
                           capture_output=True, text=True, timeout=600)
        if not os.path.exists(out):
            self.fail(f"worker_cpu_hybrid.py wrote no result (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        with open(out) as f:
            r = json.load(f)
        g3, qn = r["gemma3-1b"], r["qwen3-next-tiny"]
        self.assertEqual([g["spec"] for g in g3["groups"]], ["SlidingWindowSpec"] * 6 + ["FullAttentionSpec"], p.stdout)
        self.assertEqual(qn["block_size"], 272, p.stdout)  # the attention page aligned to the Mamba state's
        self.assertEqual([g["spec"] for g in qn["groups"]], ["MambaSpec"] * 3 + ["FullAttentionSpec"], p.stdout)
        self.assertEqual((r["ok"], g3["bad"], qn["bad"]), (True, [], []), p.stdout)

    def test_hybrid_drive_args_fit(self):
        """drive.py's workload, with each hybrid eval model's drive.args,
        finishes under vLLM 0.26's own scheduler with the model's KV cache
        groups (Gemma 3's 7 groups need about 1400 blocks; below, vLLM never
        admits a prompt and the GPU run would spin: eval/vllm/drive_fit.py)."""
        out = os.path.join(self.dir, "fit.json")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        p = subprocess.run([PY, os.path.join(ROOT, "eval", "vllm", "drive_fit.py"), "--json", out], env=env,
                           cwd=self.dir, capture_output=True, text=True, timeout=600)
        if not os.path.exists(out):
            self.fail(f"drive_fit.py wrote no result (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        with open(out) as f:
            r = json.load(f)
        self.assertEqual(r["qwen3-next-tiny"]["block_size"], 272, p.stdout)
        self.assertEqual(len(r["gemma3-1b"]["groups"]), 7, p.stdout)
        self.assertTrue(r["ok"], p.stdout)

    def test_hybrid_drive_async_restart(self):
        """drive.py's workload for gemma3-1b (its 7 real KV cache groups and
        tensors, smaller documents) as vLLM 0.26 on the GPU machine runs it:
        the AsyncScheduler with EngineCore's batch queue of 2 (step N+1
        scheduled and run before step N's output is applied), the V2 model
        runner's connector calls, a first process saving and a second one
        restoring every document's question and the aborted request's
        document in one step (10 loads of one group: two window runs per
        request), every restored token checked (eval/vllm/sched_cpu_drive.py;
        the first GPU run died in that step)."""
        cfg = ["--", "--doc-tokens", "1040", "--budget-tokens", "1024", "--gpu-blocks", "2048"]
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        env.setdefault("TUTTI_LIB", os.path.join(ROOT, "bin", "libtutti.so"))
        res = {}
        for phase in ("first", "second"):
            out = os.path.join(self.dir, f"{phase}.json")
            p = subprocess.run([PY, os.path.join(ROOT, "eval", "vllm", "sched_cpu_drive.py"), "--dir",
                                os.path.join(self.dir, "store"), "--capacity-mib", "512", "--phase", phase,
                                "--json", out, *cfg], env=env, cwd=self.dir, capture_output=True, text=True,
                               timeout=600)
            if not os.path.exists(out):
                self.fail(f"sched_cpu_drive.py {phase} wrote no result (rc {p.returncode}):\n{p.stdout[-3000:]}\n"
                          f"{p.stderr[-3000:]}")
            with open(out) as f:
                res[phase] = r = json.load(f)
            self.assertEqual((r["error"], r["bad"], r["load_error_blocks"]), (None, [], 0), p.stdout[-3000:])
            self.assertTrue(r["ok"], p.stdout[-3000:])
        second = res["second"]
        self.assertEqual(second["first_computed"], {f"d{d}q2": 1040 for d in range(4)} | {"x-after": 1040})
        self.assertGreaterEqual(second["max_group_loads"], 10)
        self.assertGreater(second["verified_tokens"], 0)
        self.assertEqual(len(second["check_per_group"]), 7)

    def test_sliding_window_first(self):
        """A gpt-oss/Gemma-3-shaped model (full attention and a sliding
        window): the hit is every shared block, the window restored only."""
        first, p = self.phase("first", "1", "sched_cpu_hybrid.py", ("--groups", "full,sliding:48"))
        self.assertEqual(first["bad"], [], p.stdout)
        self.assertEqual(first["checks"]["chunked"]["matched"], 480, p.stdout)
        self.assertTrue(first["ok"], p.stdout)

    def test_zero_output_steps_keep_their_stats(self):
        """vLLM 0.26's LLMEngine.step drops the scheduler stats of a step with
        no request outputs; drive.py records them (once, and only those)."""
        code = """
import sys
sys.path.insert(0, sys.argv[1])
import drive
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.metrics.stats import SchedulerStats

class Logger:
    def __init__(self): self.got = []
    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        self.got.append((scheduler_stats.kv_connector_stats, iteration_stats, engine_idx))

class Core:
    def __init__(self, outs): self.outs = list(outs)
    def get_output(self): return self.outs.pop(0)

class Engine: pass

e = Engine()
e.logger_manager = Logger()
def stats(n):
    return SchedulerStats(kv_connector_stats={"hit_tokens": n})

e.engine_core = Core([EngineCoreOutputs(outputs=[], scheduler_stats=stats(64), engine_index=1),
                      EngineCoreOutputs(outputs=[object()], scheduler_stats=stats(16)),
                      EngineCoreOutputs(outputs=[])])
print(drive.record_zero_output_steps(e))
for _ in range(3): e.engine_core.get_output()
print(e.logger_manager.got)
"""
        p = subprocess.run([PY, "-c", code, os.path.join(ROOT, "eval", "vllm")], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(p.stdout.splitlines()[-2:], ["True", "[({'hit_tokens': 64}, None, 1)]"], p.stderr[-3000:])


if __name__ == "__main__":
    unittest.main()


class VenvScriptTest(unittest.TestCase):
    def test_small_disk_skips_saying_why(self):
        """scripts/vllm-venv.sh on a disk with less free than the install
        needs: exit 0, no environment (nor a partial one), the reason in
        <venv>.skipped, which the tests above print as their skip reason."""
        d = tempfile.mkdtemp(prefix="tutti-venv-skip-")
        self.addCleanup(shutil.rmtree, d, True)
        venv = os.path.join(d, "venv")
        os.makedirs(os.path.join(venv, "bin"))  # a stale environment, no stamp: removed
        env = dict(os.environ, VLLM_VENV=venv, VLLM_VENV_NEED_MB=str(1 << 40))
        p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "vllm-venv.sh")], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertFalse(os.path.exists(venv), p.stdout)
        with open(venv + ".skipped") as f:
            reason = f.read()
        self.assertIn(f"needs {1 << 40} MB", reason)
        import vllm_venv
        old = vllm_venv.VENV
        vllm_venv.VENV = venv
        self.addCleanup(setattr, vllm_venv, "VENV", old)
        self.assertIn(reason.strip(), vllm_venv.missing())
