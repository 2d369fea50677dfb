"""tutti.vllm.TuttiConnector driven in vLLM's call order through a contract
double of vLLM (tests/vllm_double: vLLM's module paths, classes and factory,
NOT vLLM), with real torch tensors: the scheduler role in this process, the
worker role in TP = 2 other processes (spawned), a store per rank, no
PYTHONHASHSEED anywhere. Covered: construction through the factory, a miss,
chunked prefill saves, a local prefix hit, a full hit (last token left to
compute), eviction between lookup and load (the hold keeps the promise), a
restart that hits again, metadata through pickle, both start_load_kv orders,
lookups answered later (the ranks are other processes), stats; every loaded
page compared with what the forward that saved it wrote."""

import hashlib
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import unittest

import tutti

HERE = os.path.dirname(os.path.abspath(__file__))
DOUBLE = os.path.join(HERE, "vllm_double")

try:
    import torch
except ImportError:
    torch = None

NO_TORCH = "torch is not installed for this interpreter (Debian's python3-torch serves /usr/bin/python3)"
L, H, D, BS, NB, TP = 2, 2, 32, 16, 160, 2
PATH = os.environ.get("TUTTI_TEST_PATH", "cpu")  # "gpu" on the GPU machine: tensors on cuda:0, tutti's GPU path
DEV = "cuda" if PATH == "gpu" else "cpu"


def _config(store_root, extra=None, engine_id="e1"):
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig, VllmConfig
    ex = {"dirs": [os.path.join(store_root, "d0")], "capacity_bytes": 320 << 10,
          "path": PATH, "lookup_socket_dir": store_root,
          # Prefill priced far above these tiny reads: the planner never
          # trades a stored block for recompute here (that choice is the
          # planner's, tested in Go), so the test's hits are deterministic.
          "store_options": {"compute": {"fixed_ns": 1e7, "per_token_ns": 1e5, "per_pair_ns": 0}}}
    ex.update(extra or {})
    return VllmConfig(kv_transfer_config=KVTransferConfig("TuttiConnector", "tutti.vllm", "kv_both", ex, engine_id),
                      cache_config=CacheConfig(BS), parallel_config=ParallelConfig(TP), model_config=ModelConfig("test/model"))


def _content(key, layer, rank, dev=DEV):
    """What the double's attention writes for a block: (2 planes, BS, heads, D)."""
    g = torch.Generator().manual_seed((key ^ (layer * 7919 + rank * 104729)) & 0x7FFFFFFFFFFFFFFF)
    return torch.randn(2, BS, H // TP, D, generator=g).to(torch.bfloat16).to(dev)


def _block_keys(tokens):
    """A key of every block the request touches (full or not): a stable hash
    of the tokens up to the block's end (the KV of a block depends on them)."""
    keys = []
    for end in range(BS, len(tokens) + BS, BS):
        d = hashlib.blake2b(repr(list(tokens[:end])).encode(), digest_size=8).digest()
        keys.append(int.from_bytes(d, "little"))
    return keys


def worker_main(pipe, rank, store_root, engine_id, extra=None, dev=DEV):
    sys.path.insert(0, DOUBLE)
    torch.set_num_threads(1)  # tiny tensors; the CI machine has 2 cores
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.parallel_state import set_rank_for_test
    set_rank_for_test(rank)
    if extra and "host_staging_bytes" in extra and dev == "cpu":
        # No GPU here: CPU tensors stand in for the GPU KV cache, so the path
        # decision (staging for a cache outside host memory) is told to stage.
        import tutti.vllm
        tutti.vllm.TuttiConnector._host_staging_bytes = lambda self, kv: self._staging_size()
    conn = KVConnectorFactory.create_connector(_config(store_root, extra, engine_id=engine_id), KVConnectorRole.WORKER, None)
    kv = {f"model.layers.{i}.self_attn.attn": torch.zeros(2, NB, BS, H // TP, D, dtype=torch.bfloat16, device=dev)
          for i in range(L)}
    conn.register_kv_caches(kv)
    pipe.send("ready")
    names = list(kv)
    while True:
        msg = pipe.recv()
        if msg == "stop":
            conn.shutdown()
            pipe.send("stopped")
            return
        if msg == "sync":
            conn._worker.store.wait_saves()
            pipe.send("synced")
            continue
        so, reqs = pickle.loads(msg)  # the scheduler output crosses processes pickled, as in vLLM
        meta = so.kv_connector_metadata
        conn.handle_preemptions(meta)
        if not so.total_num_scheduled_tokens:  # vLLM's kv_connector_no_forward
            conn.bind_connector_metadata(meta)
            conn.start_load_kv(None)
            sending, recving = conn.get_finished(so.finished_req_ids)
            conn.clear_connector_metadata()
            pipe.send({"sending": sending, "recving": recving, "errors": set(), "bad": [], "stats": {}})
            continue
        conn.bind_connector_metadata(meta)
        if so.has_sync_kv_loads:
            conn.start_load_kv(None)
        for li, name in enumerate(names):
            conn.wait_for_layer_load(name)
            for rid, n in so.num_scheduled_tokens.items():
                tokens, blocks, start = reqs[rid]
                keys = _block_keys(tokens)
                for pos_block in range(start // BS, (start + n + BS - 1) // BS):
                    lo, hi = max(start, pos_block * BS) - pos_block * BS, min(start + n, (pos_block + 1) * BS) - pos_block * BS
                    c = _content(keys[pos_block], li, rank, dev)
                    kv[name][:, blocks[pos_block], lo:hi] = c[:, lo:hi]
            conn.save_kv_layer(name, kv[name], None)
        conn.wait_for_save()
        if not so.has_sync_kv_loads:
            conn.start_load_kv(None)  # the newest tree's order: after the forward
        sending, recving = conn.get_finished(so.finished_req_ids)  # ends the step's loads
        if dev == "cuda":
            torch.cuda.synchronize()
        bad = []
        for ld in meta.loads:
            keys = _block_keys(reqs[ld.req_id][0])
            for i in range(len(ld.chain)):
                page = reqs[ld.req_id][1][i]
                for li, name in enumerate(names):
                    if not torch.equal(kv[name][:, page], _content(keys[i], li, rank, dev)):
                        bad.append((ld.req_id, i, page, li))
        errors = conn.get_block_ids_with_load_errors()
        stats = conn.get_kv_connector_stats()
        conn.clear_connector_metadata()
        pipe.send({"sending": sending, "recving": recving, "errors": errors, "bad": bad[:5],
                   "stats": stats.data if stats is not None else {}})


@unittest.skipIf(torch is None, NO_TORCH)
class VLLMAdapterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, DOUBLE)

    @classmethod
    def tearDownClass(cls):
        sys.path.remove(DOUBLE)

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="tutti-vllm-")
        self.addCleanup(shutil.rmtree, self.root, True)
        self.ctx = mp.get_context("spawn")
        self.procs = []

    def start(self, engine_id, extra=None, dev=DEV):
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        self.pipes = []
        self.worker_stats = {}
        for r in range(TP):
            a, b = self.ctx.Pipe()
            p = self.ctx.Process(target=worker_main, args=(b, r, self.root, engine_id, extra, dev), daemon=True)
            p.start()
            self.procs.append(p)
            self.pipes.append(a)
        for a in self.pipes:  # the workers register before the scheduler-role connector is built
            self.assertTrue(a.poll(120), "a worker did not start")
            self.assertEqual(a.recv(), "ready")
        self.sched = KVConnectorFactory.create_connector(_config(self.root, extra, engine_id=engine_id), KVConnectorRole.SCHEDULER, None)
        self.free = list(range(NB))
        self.finished = set()

    def stop(self):
        for a in self.pipes:
            a.send("stop")
        for a, p in zip(self.pipes, self.procs):
            self.assertEqual(a.recv(), "stopped")
            p.join(30)
        self.sched.shutdown()
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            p.kill()

    def call(self, msg):
        for a in self.pipes:
            a.send(msg)
        out = []
        for a in self.pipes:
            self.assertTrue(a.poll(120), "a worker did not answer")
            out.append(a.recv())
        return out

    def step(self, so, reqs):
        from vllm.v1.core.sched.output import SchedulerOutput  # noqa: F401 (the type crossing)
        so.kv_connector_metadata = self.sched.build_connector_meta(so)
        so.has_sync_kv_loads = bool(so.kv_connector_metadata.loads)
        outs = self.call(pickle.dumps((so, reqs)))
        for o in outs:
            self.assertEqual((o["sending"], o["recving"]), (None, None))  # loads sync, saves gathered in the step
            self.assertEqual(o["errors"], set())
            self.assertEqual(o["bad"], [], "loaded pages differ from what was saved")
            for k, v in o["stats"].items():
                self.worker_stats[k] = self.worker_stats.get(k, 0) + v
        self.finished = set()
        return outs

    def lookup(self, req, local):
        """vLLM's scheduler asks again, at later steps, while the answer is None."""
        import time
        for _ in range(10000):
            ext, is_async = self.sched.get_num_new_matched_tokens(req, local)
            self.assertIs(is_async, False)
            if ext is not None:
                return ext
            time.sleep(0.001)
        self.fail("the lookup never answered")

    def run_request(self, rid, tokens, local_blocks=(), chunks=None):
        """vLLM's scheduler for one request: lookup after local hits,
        allocation of all its blocks, then prefill steps; returns
        (external tokens, blocks)."""
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
        from vllm.v1.request import Request
        req = Request(rid, tokens, BS)
        local = len(local_blocks) * BS
        ext = self.lookup(req, local)
        again = self.lookup(req, local)  # may be called again: same answer
        self.assertEqual(again, ext)
        need = -(-len(tokens) // BS)
        blocks = list(local_blocks) + [self.free.pop(0) for _ in range(need - len(local_blocks))]
        self.sched.update_state_after_alloc(req, KVCacheBlocks([blocks]), ext)
        computed = local + ext
        rest = len(tokens) - computed
        chunks = chunks or [rest]
        self.assertEqual(sum(chunks), rest)
        req.num_computed_tokens = computed
        for i, n in enumerate(chunks):
            if i == 0:
                so = SchedulerOutput([NewRequestData.from_request(req, (blocks,))], CachedRequestData.make_empty(),
                                     {rid: n}, n, set(self.finished))
            else:
                so = SchedulerOutput([], CachedRequestData([rid], set(), [], {}, [None], [computed], [0]), {rid: n}, n,
                                     set(self.finished))
            self.step(so, {rid: (tokens, blocks, computed)})
            computed += n
        delay, params = self.sched.request_finished(req, blocks)
        self.assertEqual((delay, params), (False, None))
        self.finished.add(rid)
        return ext, blocks

    def lookup_only(self, rid, tokens):
        from vllm.v1.request import Request
        req = Request(rid, tokens, BS)
        return req, self.lookup(req, 0)

    def sync(self):
        """vLLM steps once more after a request finished (its id in the
        step's finished_req_ids, no tokens): then every save is durable."""
        from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
        if self.finished:
            self.step(SchedulerOutput([], CachedRequestData.make_empty(), {}, 0, set(self.finished)), {})
        self.assertEqual(self.call("sync"), ["synced"] * TP)

    def test_call_order_tp2(self):
        self.start("engine-1")
        a = list(range(1000, 1000 + 5 * BS + 3))
        ext, a_blocks = self.run_request("A", a, chunks=[40, 43])  # a miss, chunked prefill: saves in two steps
        self.assertEqual(ext, 0)
        self.sync()
        ext, _ = self.run_request("B", a, local_blocks=a_blocks[:2])  # local hit of 2 blocks: 3 loaded after them
        self.assertEqual(ext, 3 * BS)
        ext, _ = self.run_request("C", a[:5 * BS])  # a full hit: the last token is computed
        self.assertEqual(ext, 5 * BS - 1)
        ext, _ = self.run_request("D", list(range(7000, 7000 + 3 * BS)))  # a miss
        self.assertEqual(ext, 0)
        e = list(range(9000, 9000 + 4 * BS + 5))
        self.run_request("E", e)
        self.sync()
        req, ext = self.lookup_only("E2", e)  # the lookup holds E's blocks; E2 is not allocated this step
        self.assertEqual(ext, 4 * BS)
        for i in range(3):  # saves of other requests fill the store: everything not held is evicted
            last_fill = list(range(20000 + 5000 * i, 20000 + 5000 * i + 30 * BS))
            _, blocks = self.run_request(f"F{i}", last_fill)
            self.free.extend(blocks)
            self.sync()
        _, gone = self.lookup_only("probe", a)
        self.sched.request_finished(self.lookup_only("probe", a)[0], [])
        self.assertEqual(gone, 0, "the fills did not evict A: the test proves nothing about the hold")
        ext, _ = self.run_request("E2", e)  # allocated now: loads what the lookup promised
        self.assertEqual(ext, 4 * BS)
        stats = self.sched.get_kv_connector_stats()
        self.assertGreater(stats.data.get("hit_tokens", 0), 0)
        self.stop()

        # A restart (new processes, new engine id, vLLM's hashes other): the
        # newest fill (E went once its hold ended: the oldest in a full store)
        # hits again, as far as the store admitted it (a full store admits a
        # save in part), every loaded page compared by the workers.
        self.start("engine-2")
        ext, _ = self.run_request("F6-again", last_fill)
        self.assertGreater(ext, 0)
        self.assertEqual(ext % BS if ext < 30 * BS - 1 else 0, 0)
        self.stop()

    def test_cpu_path_host_staged(self):
        """path "cpu" on a KV cache outside host memory: the CPU path through
        host staging (tensors on cuda:0 where torch sees a GPU, else CPU
        tensors standing in for them), every loaded page compared."""
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        block_bytes = L * 2 * BS * (H // TP) * D * 2
        self.start("engine-staged", {"path": "cpu", "host_staging_bytes": 5 * block_bytes}, dev)
        a = list(range(3000, 3000 + 5 * BS + 3))
        ext, a_blocks = self.run_request("A", a, chunks=[40, 43])
        self.assertEqual(ext, 0)
        self.sync()
        ext, _ = self.run_request("B", a, local_blocks=a_blocks[:2])  # 3 blocks through the pool
        self.assertEqual(ext, 3 * BS)
        ext, _ = self.run_request("C", a[:5 * BS])  # 5 blocks: the whole pool
        self.assertEqual(ext, 5 * BS - 1)
        s = self.worker_stats
        # A's two chunks are two saves (each copies only its new blocks out).
        self.assertEqual((s.get("staging_loads"), s.get("staging_saves")), (2 * TP, 2 * TP))
        self.assertEqual(s.get("staging_h2d_bytes"), TP * 8 * block_bytes)
        self.assertEqual(s.get("staging_d2h_bytes"), TP * 5 * block_bytes)
        self.assertEqual(s.get("staging_short_blocks", 0) + s.get("staging_skipped_saves", 0), 0)
        self.stop()

    def test_gpu_path_unavailable_says_set_cpu(self):
        """path "auto" on a GPU KV cache takes the GPU path, with no fallback:
        where it cannot open, the error says to set path "cpu"."""
        import dataclasses
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.parallel_state import set_rank_for_test
        from tutti import worker_side as ws
        set_rank_for_test(0)
        conn = KVConnectorFactory.create_connector(_config(self.root, {"path": "auto"}), KVConnectorRole.WORKER, None)
        kv = {f"l{i}": torch.zeros(2, NB, BS, H // TP, D, dtype=torch.bfloat16) for i in range(L)}
        lay = dataclasses.replace(ws.describe_kv_caches(kv, BS), device="cuda:0")  # as a GPU cache reads
        try:
            st = conn._open_store(lay)
        except RuntimeError as e:
            self.assertIn('path = "cpu"', str(e))
            self.assertIsInstance(e.__cause__, (tutti._lib.NoGPU, tutti._lib.NotSupported))
            return
        finally:
            conn.shutdown()
        st.close()
        self.skipTest("the GPU path opens here (a GPU and the kernels library)")

    def test_host_staging_sized_for_max_model_len(self):
        """host_staging_bytes left out: host staging is sized for vLLM's
        max_model_len (tutti.hoststage.default_bytes); given, as given; no
        max_model_len to size by: the start fails naming the key."""
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from tutti import hoststage
        cfg = _config(self.root, {"path": "cpu"})
        cfg.model_config.max_model_len = 8704
        conn = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, None)
        self.assertEqual(conn._staging_size(), hoststage.SizedFor(8704))
        cfg = _config(self.root, {"path": "cpu", "host_staging_bytes": 3 << 20})
        self.assertEqual(KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, None)._staging_size(), 3 << 20)
        cfg = _config(self.root, {"path": "cpu"})
        cfg.model_config.max_model_len = None
        with self.assertRaisesRegex(ValueError, "host_staging_bytes"):
            KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, None)._staging_size()

    def test_pythonhashseed_is_deprecated(self):
        """No PYTHONHASHSEED is needed; the old key is accepted with a warning,
        a wrong value of it still refused."""
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from unittest import mock
        with mock.patch.dict(os.environ):
            os.environ.pop("PYTHONHASHSEED", None)
            self.assertIsNotNone(KVConnectorFactory.create_connector(_config(self.root), KVConnectorRole.SCHEDULER, None))
        with self.assertLogs("tutti.vllm", "WARNING"):
            KVConnectorFactory.create_connector(_config(self.root, {"pythonhashseed": "require"}), KVConnectorRole.SCHEDULER, None)
        with self.assertRaises(ValueError) as cm:
            KVConnectorFactory.create_connector(_config(self.root, {"pythonhashseed": "yes"}), KVConnectorRole.SCHEDULER, None)
        self.assertIn("pythonhashseed", str(cm.exception))

    def test_factory_and_settings(self):
        from vllm.config import KVTransferConfig, VllmConfig
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        import tutti.vllm as tv
        self.assertTrue(issubclass(tv.TuttiConnector, sys.modules["vllm.distributed.kv_transfer.kv_connector.v1.base"].KVConnectorBase_V1))
        # One TuttiConnector, vLLM's: the older engine-driven class and its module are gone.
        self.assertFalse(hasattr(tutti, "TuttiConnector"))
        old = VllmConfig(kv_transfer_config=KVTransferConfig("TuttiConnector", "tutti.connector", "kv_both", {}))
        with self.assertRaises(ImportError):
            KVConnectorFactory.create_connector(old, KVConnectorRole.SCHEDULER, None)
        for bad, frag in (({"dirs": "/x"}, "list"), ({"path": "tpu"}, "path"), ({"nope": 1}, "unknown"),
                          ({"store_options": {"x": 1}}, "store_options"), ({"host_staging_bytes": 0}, "host_staging_bytes"),
                          ({"host_staging_bytes": "1G"}, "host_staging_bytes"), ({"check": {"dir": ""}}, "check"),
                          ({"check": {"dir": "/x", "zap": 1}}, "check"), ({"check": "/x"}, "check"),
                          ({"check": {"dir": "/x", "max_records": 0}}, "max_records"),
                          ({"save_flush_wait_ms": -1}, "save_flush_wait_ms"), ({"async_loads": 1}, "async_loads"),
                          ({"async_loads": "always"}, "async_loads"), ({"save_wait": "gpu"}, "save_wait"),
                          ({"save_wait": None}, "save_wait")):
            with self.assertRaises(ValueError) as cm:
                KVConnectorFactory.create_connector(_config(self.root, bad), KVConnectorRole.SCHEDULER, None)
            self.assertIn(frag, str(cm.exception))
        # vLLM's kv_role: a producer only saves, a consumer only loads; another role is refused, named.
        for role, want in (("kv_both", (True, True)), ("kv_producer", (False, True)), ("kv_consumer", (True, False))):
            cfg = _config(self.root)
            cfg.kv_transfer_config.kv_role = role
            conn = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, None)
            sched = conn._scheduler()
            self.assertEqual((sched._loads_on, sched._saves_on), want, role)
        cfg = _config(self.root)
        cfg.kv_transfer_config.kv_role = "kv_relay"
        with self.assertRaisesRegex(ValueError, "kv_role = 'kv_relay'"):
            KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, None)
        # Prometheus: vLLM passes its metric classes in; tutti's own names.
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import Counter, Gauge, Histogram
        made = {}

        class Metric:
            def __init__(self, name, documentation, labelnames, buckets=None):
                self.name, self.values = name, {}
                made[name] = self

            def labels(self, *lv):
                m = self

                class Child:
                    def inc(self, v=1):
                        m.values[lv] = m.values.get(lv, 0) + v

                    def observe(self, v):
                        m.values.setdefault(lv, []).append(v)
                return Child()
        prom = tv.TuttiConnector.build_prom_metrics(_config(self.root), {Gauge: Metric, Counter: Metric, Histogram: Metric},
                                                    ["engine"], {0: ["0"]})
        prom.observe({"load_bytes": 4096, "hit_tokens": 32, "load_time_s": 0.01})
        self.assertEqual(made["vllm:tutti_load_bytes"].values, {("0",): 4096})
        self.assertEqual(made["vllm:tutti_hit_tokens"].values, {("0",): 32})
        self.assertEqual(made["vllm:tutti_load_time_seconds"].values, {("0",): [0.01]})
        st = tv.TuttiConnector.build_kv_connector_stats({"load_bytes": 1})
        st.aggregate(tv.TuttiConnector.build_kv_connector_stats({"load_bytes": 2, "lookups": 1}))
        self.assertEqual(st.reduce(), {"load_bytes": 3, "lookups": 1})
        self.assertFalse(st.is_empty())
        m = tv.TuttiConnectorMetadata(loads=[], saves=[])
        self.assertEqual(pickle.loads(pickle.dumps(m)), m)
        self.assertIsNone(tv.TuttiConnector.get_required_kvcache_layout(None))
        self.assertTrue(tv.TuttiConnector.requires_piecewise_for_cudagraph({}))


class ImportWithoutVLLMTest(unittest.TestCase):
    def test_import_fails_with_a_message(self):
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
        r = subprocess.run([sys.executable, "-c", "import tutti.vllm"], env=env, capture_output=True, text=True, timeout=60)
        if "No module named 'vllm'" not in r.stderr and r.returncode == 0:
            self.skipTest("a real vLLM is installed for this interpreter")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("tutti.vllm is tutti's vLLM connector and needs vLLM installed", r.stderr)
        r = subprocess.run([sys.executable, "-c", "import tutti, tutti.worker_side, tutti.scheduler_side, tutti.lookup_service"],
                           env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
