"""tutti.hoststage through tutti.worker_side: the CPU path serving a KV cache
that is not in host memory, through a bounded pool of host pages. In CI the
engine's tensors are CPU tensors standing in for a GPU cache (the pool is
separate memory, every transfer goes pool <-> tensors by per-layer copies:
the same code as on CUDA); where torch sees a GPU, every test runs again on
CUDA tensors (HostStagingCUDATest), skipping with the reason elsewhere.
Bytes compared, counters checked."""

import shutil
import tempfile
import threading
import unittest

import tutti
from tutti import worker_side as ws

try:
    import torch
except ImportError:
    torch = None

from test_worker_side import BS, L, NB, NO_TORCH, layouts, page

BLOCK_BYTES = L * 2 * BS * 2 * 32 * 2  # one chain block of every layout in layouts(): L layers x 4 KiB


class _Gated:
    """A copies' event that also waits for a gate: copies not yet complete
    (on CPU tensors, where copies are synchronous, the gate alone)."""

    def __init__(self, gate, ev):
        self.gate, self.ev = gate, ev

    def query(self):
        return self.gate.is_set() and (self.ev is None or self.ev.query())

    def synchronize(self):
        if not self.gate.wait(60):
            raise TimeoutError("the test never opened the gate")
        if self.ev is not None:
            self.ev.synchronize()


class Base:
    DEV = "cpu"

    def sync(self):
        if self.DEV == "cuda":
            torch.cuda.synchronize()

    def worker(self, kv, pool_blocks, ends_requests=False, **store_kw):
        d = tempfile.mkdtemp(prefix="tutti-hs-")
        self.addCleanup(shutil.rmtree, d, True)
        opened = []

        def opener(lay):
            opened.append(lay)
            return tutti.Store([d], 64 << 20, lay.geometry, lay.num_pages, layout=lay.layout, path="cpu",
                               io=tutti.IOOptions(staging_bytes=4 << 20, staging_slot_bytes=1 << 20), **store_kw)
        w = ws.WorkerSide(opener, ends_requests=ends_requests)
        w.register(kv, BS, host_staging_bytes=pool_blocks * BLOCK_BYTES)
        self.addCleanup(w.close)
        self.assertEqual((opened[0].device, opened[0].num_pages, opened[0].layout), ("cpu", pool_blocks, "per_layer"))
        self.assertEqual(w.kv_layout.num_pages, NB)  # the engine's layout stays the tensors'
        return w

    @staticmethod
    def durable(w):
        """Every save so far handed to the store (on CUDA the staging's thread
        hands each once its copies completed) and durable."""
        w.staging.drain()
        w.store.wait_saves()

    @staticmethod
    def gate_copies(stg):
        """Copies from now on complete only once the returned function is
        called (which ends the gating)."""
        gate, mark = threading.Event(), stg._streams.mark
        stg._streams.mark = lambda blocking=False: _Gated(gate, mark(blocking))

        def open_gate():
            stg._streams.mark = mark
            gate.set()
        return open_gate

    def fill(self, kv):
        gen = torch.Generator().manual_seed(11)
        for t in kv.values():
            t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype).to(t.device))
        self.sync()

    def step(self, w, names, loads=(), saves=()):
        w.bind(loads, saves)
        w.start_load()
        for n in names:
            w.wait_for_layer(n)
            w.save_layer(n)
        w.wait_for_save()
        res = w.finish_step()
        w.unbind()
        self.sync()
        return res

    def saved(self, kv, bdim, w, chain, src):
        """Saves ``src``'s pages under ``chain``, waits until durable, zeroes
        the tensors; returns what each (layer, block) held."""
        want = {(n, i): page(kv[n], bdim, p) for n in kv for i, p in enumerate(src)}
        res = self.step(w, list(kv), saves=[ws.SaveSpec("s", chain, src)])
        self.assertEqual(res.error_block_ids, set())
        self.durable(w)
        for t in kv.values():
            t.zero_()
        self.sync()
        return want

    def assert_pages(self, kv, bdim, want, pages, what):
        for n in kv:
            for i, p in enumerate(pages):
                self.assertTrue(torch.equal(page(kv[n], bdim, p), want[(n, i)]), f"{what}: {n} block {i} (page {p})")

    # ---------------------------------------------------------------- tests
    def test_round_trip_every_layout(self):
        for name, (kv, bdim) in layouts(self.DEV).items():
            with self.subTest(layout=name):
                w = self.worker(kv, pool_blocks=5)
                self.fill(kv)
                chain = tutti.chain_from_tokens(list(range(5 * BS)), BS)
                want = self.saved(kv, bdim, w, chain, [1, 2, 3, 4, 5])
                # The save's pool pages stay its own (the step did not wait for
                # the disks) until a load needs them.
                self.assertEqual(w.staging.pages_in_use, 5)
                local, dst = [7, 8], [9, 10, 11]
                for n in kv:
                    for i, p in enumerate(local):
                        kv[n].select(bdim, p).copy_(want[(n, i)])
                res = self.step(w, list(kv), loads=[ws.LoadSpec("r", chain, 2, dst)])
                self.assertEqual((res.restored_blocks, res.error_block_ids), ({"r": 3}, set()), name)
                self.assert_pages(kv, bdim, want, local + dst, name)
                for n in kv:
                    for p in (0, 6):
                        self.assertFalse(bool(page(kv[n], bdim, p).any()), f"{name}: page {p} written by a load")
                self.assertEqual(w.take_stats(), {"staging_saves": 1, "staging_loads": 1, "staging_d2h_bytes": 5 * BLOCK_BYTES,
                                                  "staging_h2d_bytes": 3 * BLOCK_BYTES})
                self.assertEqual(w.take_stats(), {})
                self.assertEqual(w.staging.pages_in_use, 0)
                w.close()

    def test_load_larger_than_pool_runs_in_rounds(self):
        kv, bdim = layouts(self.DEV)["flash-hnd"]
        w = self.worker(kv, pool_blocks=3)
        self.fill(kv)
        chain = tutti.chain_from_tokens(list(range(7 * BS)), BS)
        want = self.saved(kv, bdim, w, chain[:3], [0, 1, 2])  # a save is at most the pool
        for t in kv.values():
            t.copy_(torch.randn(t.shape).to(t.dtype).to(t.device))
        self.sync()
        want.update({(n, 3 + i): page(kv[n], bdim, p) for n in kv for i, p in enumerate([3, 4, 5])})
        # Blocks 0-2 are stored: only 3-5 take pool pages (the pool holds 3).
        self.step(w, list(kv), saves=[ws.SaveSpec("s2", chain[:6], [0, 1, 2, 3, 4, 5])])
        self.durable(w)
        w.take_stats()
        dst = [11, 10, 9, 8, 7, 6]
        res = self.step(w, list(kv), loads=[ws.LoadSpec("big", chain[:6], 0, dst)])
        self.assertEqual((res.restored_blocks, res.error_block_ids), ({"big": 6}, set()))
        self.assert_pages(kv, bdim, want, dst, "rounds")
        st = w.take_stats()
        self.assertEqual((st["staging_load_rounds"], st.get("staging_short_blocks", 0)), (1, 0))
        # Promised past what is stored (a stale view): the round that comes
        # up short ends the load; the rest are errors, as on the GPU path.
        res = self.step(w, list(kv), loads=[ws.LoadSpec("stale", chain, 0, [0, 1, 2, 3, 4, 5, 6])])
        self.assertEqual((res.restored_blocks, res.error_block_ids), ({"stale": 6}, {6}))
        self.assert_pages(kv, bdim, want, [0, 1, 2, 3, 4, 5], "rounds, stale promise")
        self.assertEqual(w.staging.pages_in_use, 0)

    def test_background_load_ends_with_its_step(self):
        """A background load (vLLM's asynchronous loads) through host staging:
        no layer of its step waits for it (the layers' waits see only the
        step's own loads), it ends within that step, reported in recving and
        counted (loads_background_staged), its bytes restored."""
        kv, bdim = layouts(self.DEV)["flash-nhd"]
        w = self.worker(kv, pool_blocks=4)
        self.fill(kv)
        chain = tutti.chain_from_tokens(list(range(3 * BS)), BS)
        want = self.saved(kv, bdim, w, chain, [0, 1, 2])
        waited = []
        w.bind([ws.LoadSpec("bg", chain, 0, [5, 6, 7], background=True)])
        w.start_load()
        (ld, _), = w._loads.values()
        ld.wait_layer = lambda layer: (waited.append(layer), type(ld).wait_layer(ld, layer))
        for n in kv:
            w.wait_for_layer(n)
            w.save_layer(n)
        w.wait_for_save()
        del ld.wait_layer  # finish_step's wait copies every layer through it
        res = w.finish_step()
        w.unbind()
        self.sync()
        self.assertEqual(waited, [])
        self.assertEqual((res.recving, res.restored_blocks, res.error_block_ids), ({"bg"}, {"bg": 3}, set()))
        self.assertEqual(res.counters["loads_background_staged"], 1)
        self.assert_pages(kv, bdim, want, [5, 6, 7], "background")
        self.assertEqual(w.staging.pages_in_use, 0)

    def test_concurrent_loads_exhaust_the_pool(self):
        kv, bdim = layouts(self.DEV)["flash-nhd"]
        w = self.worker(kv, pool_blocks=2)
        self.fill(kv)
        chain = tutti.chain_from_tokens(list(range(2 * BS)), BS)
        want = self.saved(kv, bdim, w, chain, [0, 1])
        w.take_stats()
        loads = [ws.LoadSpec("a", chain, 0, [2, 3]), ws.LoadSpec("b", chain, 0, [4, 5]), ws.LoadSpec("c", chain, 0, [6, 7])]
        res = self.step(w, list(kv), loads=loads)
        # Two free blocks for three loads of two: two loads get one page each
        # and run in two rounds, one gets none and restores nothing.
        self.assertEqual(sorted(res.restored_blocks.values()), [0, 2, 2])
        short = [k for k, v in res.restored_blocks.items() if v == 0][0]
        short_pages = {l.req_id: l.block_ids for l in loads}[short]
        self.assertEqual(res.error_block_ids, set(short_pages))
        self.assertIsInstance(res.failures[short], tutti.hoststage.HostStagingExhausted)
        for l in loads:
            if l.req_id != short:
                self.assert_pages(kv, bdim, want, l.block_ids, l.req_id)
        st = w.take_stats()
        self.assertEqual((st["staging_short_blocks"], st["staging_load_rounds"], st["staging_loads"]), (2, 2, 3))
        self.assertEqual(w.staging.pages_in_use, 0)

    def test_save_skipped_for_want_of_staging(self):
        kv, bdim = layouts(self.DEV)["mla"]
        w = self.worker(kv, pool_blocks=2)
        self.fill(kv)
        chain = tutti.chain_from_tokens(list(range(3 * BS)), BS)
        res = self.step(w, list(kv), saves=[ws.SaveSpec("big", chain, [0, 1, 2])])
        self.assertEqual(res.error_block_ids, set())
        self.durable(w)
        self.assertEqual(w.store.lookup(chain), 0)
        self.assertEqual(w.take_stats(), {"staging_skipped_saves": 1, "staging_skipped_save_blocks": 3})
        # A step's save after its loads: their pages come back once copied.
        self.step(w, list(kv), saves=[ws.SaveSpec("small", chain[:2], [0, 1])])
        self.durable(w)
        self.assertEqual(w.take_stats()["staging_saves"], 1)
        want = {(n, i): page(kv[n], bdim, p) for n in kv for i, p in enumerate([0, 1, 2])}
        res = self.step(w, list(kv), loads=[ws.LoadSpec("l", chain[:2], 0, [4, 5])],
                        saves=[ws.SaveSpec("next", chain[:2] + [777], [0, 1, 2])])
        self.assertEqual(res.restored_blocks, {"l": 2})
        self.assert_pages(kv, bdim, want, [4, 5], "load beside a save")
        st = w.take_stats()
        self.assertEqual((st["staging_saves"], st.get("staging_skipped_saves", 0)), (1, 0))
        self.durable(w)
        self.assertEqual(w.store.lookup(chain[:2] + [777]), 3)

    def test_saves_go_to_the_store_once_their_copies_completed(self):
        kv, bdim = layouts(self.DEV)["flash-nhd"]
        w = self.worker(kv, pool_blocks=4, ends_requests=True)
        self.fill(kv)
        stg = w.staging
        open_gate = self.gate_copies(stg)
        chain = tutti.chain_from_tokens(list(range(2 * BS)), BS)
        want = {(n, i): page(kv[n], bdim, p) for n in kv for i, p in enumerate([0, 1])}
        self.step(w, list(kv), saves=[ws.SaveSpec("s", chain, [0, 1])])  # nothing waits for the copies
        w.store.wait_saves()
        self.assertEqual(w.store.lookup(chain), 0, "handed to the store before its copies completed")
        self.assertEqual(stg.pages_in_use, 2)
        (sv, pages), = w._inflight["s"]
        self.assertEqual((sv.gathered(), list(pages)), (False, [0, 1]))  # the request's pages are still read
        open_gate()
        self.durable(w)
        self.assertEqual(w.store.lookup(chain), 2)
        w.end_requests(ended=["s"])
        self.assertEqual(w._inflight, {})
        for t in kv.values():
            t.zero_()
        self.sync()
        res = self.step(w, list(kv), loads=[ws.LoadSpec("l", chain, 0, [4, 5])])
        self.assertEqual(res.restored_blocks, {"l": 2})
        self.assert_pages(kv, bdim, want, [4, 5], "restored")
        # Every pool page came back: a save of the whole pool goes.
        self.fill(kv)
        four = tutti.chain_from_tokens(list(range(500, 500 + 4 * BS)), BS)
        self.step(w, list(kv), saves=[ws.SaveSpec("all", four, [0, 1, 2, 3])])
        w.end_requests(ended=["all"])
        self.durable(w)
        self.assertEqual(w.store.lookup(four), 4)
        st = w.take_stats()
        self.assertEqual((st["staging_saves"], st.get("staging_skipped_saves", 0)), (2, 0))

    def test_a_save_refused_once_its_copies_completed_is_counted(self):
        kv, _ = layouts(self.DEV)["flash-nhd"]
        w = self.worker(kv, pool_blocks=2, ends_requests=True)
        self.fill(kv)
        stg = w.staging
        open_gate = self.gate_copies(stg)
        chain = tutti.chain_from_tokens(list(range(2 * BS)), BS)
        self.step(w, list(kv), saves=[ws.SaveSpec("s", chain, [0, 1])])
        save = stg.store.save

        def refuse(*a, **kw):
            raise tutti._lib.Busy("store busy", op="tutti_save")
        stg.store.save = refuse
        open_gate()
        self.durable(w)
        stg.store.save = save
        self.assertEqual(w.store.lookup(chain), 0)
        self.assertEqual(w.take_stats(), {"staging_saves": 1, "staging_failed_saves": 1, "staging_d2h_bytes": 2 * BLOCK_BYTES})
        w.end_requests(ended=["s"])  # not committed: handed over again at its end (tutti.save_queue)
        self.durable(w)
        self.assertEqual(w.store.lookup(chain), 2)
        # Its pages came back: the next save of the whole pool goes.
        other = tutti.chain_from_tokens(list(range(300, 300 + 2 * BS)), BS)
        self.step(w, list(kv), saves=[ws.SaveSpec("t", other, [2, 3])])
        w.end_requests(ended=["t"])
        self.durable(w)
        self.assertEqual(w.store.lookup(other), 2)
        st = w.take_stats()
        self.assertEqual((st["staging_saves"], st.get("staging_failed_saves", 0), st.get("staging_skipped_saves", 0)), (2, 0, 0))

    def test_close_releases_everything(self):
        kv, _ = layouts(self.DEV)["flashinfer"]
        w = self.worker(kv, pool_blocks=4)
        self.fill(kv)
        chain = tutti.chain_from_tokens(list(range(2 * BS)), BS)
        self.step(w, list(kv), saves=[ws.SaveSpec("s", chain, [0, 1])])
        self.durable(w)
        stg, st = w.staging, w.store
        pool = stg._pool
        seen = []
        close = pool.close
        pool.close = lambda: (seen.append(pool.free_pages), close())
        # A step cut off mid-forward: a load with one layer copied, a save started.
        other = tutti.chain_from_tokens(list(range(100, 100 + 2 * BS)), BS)
        w.bind([ws.LoadSpec("l", chain, 0, [5, 6])], [ws.SaveSpec("s2", other, [2, 3])])
        w.start_load()
        names = list(kv)
        w.wait_for_layer(names[0])
        w._start_saves()
        self.assertEqual(stg.pages_in_use, 4)
        stg.drain()  # on CUDA the save reaches the store once its copies completed
        handles = [ld._ld for ld, _ in w._loads.values()] + [sv._sv for svs in w._saves.values() for sv, _ in svs]
        w.close()
        self.assertEqual(seen, [4], "pages still in use when the pool was freed")
        self.assertIsNone(pool._mm)
        self.assertIsNone(w.staging)
        self.assertTrue(st.closed)
        self.assertEqual([h.handle for h in handles], [0, 0])

    def test_pool_sized_for_the_longest_request(self):
        """host_staging_bytes by default: room for two requests of the
        engine's longest, within [1 GiB, 16 GiB] (each divided among a hybrid
        model's groups), then cut to the engine's cache."""
        from tutti import hoststage
        g = tutti.Geometry(32, 8, 128, "bf16", 2, 16)  # Llama-3-8B: 2 MiB a block of 16 tokens
        mib = 1 << 20
        for sized, want in ((hoststage.SizedFor(8704), 2 * 544 * 2 * mib), (hoststage.SizedFor(100), 1 << 30),
                            (hoststage.SizedFor(131072), 16 << 30), (hoststage.SizedFor(100, 4), 256 * mib),
                            (hoststage.SizedFor(8704, 2), 2 * 544 * 2 * mib), (hoststage.SizedFor(131072, 4), 4 << 30)):
            with self.subTest(sized=sized):
                self.assertEqual(hoststage.default_bytes(g, sized), want)
        for bad in ((0, 1), (5, 0), (True, 1), (1.5, 1)):
            with self.assertRaises(ValueError):
                hoststage.SizedFor(*bad)
        kv, _ = layouts(self.DEV)["flash-nhd"]
        d = tempfile.mkdtemp(prefix="tutti-hs-")
        self.addCleanup(shutil.rmtree, d, True)
        w = ws.WorkerSide(lambda lay: tutti.Store([d], 1 << 20, lay.geometry, lay.num_pages, layout=lay.layout, path="cpu"))
        self.addCleanup(w.close)
        w.register(kv, BS, host_staging_bytes=hoststage.SizedFor(4 * BS))
        self.assertEqual((w.staging.pages, w.staging.host_staging_bytes), (NB, 1 << 30))  # the floor, cut to the cache

    def test_refusals(self):
        kv, _ = layouts(self.DEV)["flash-nhd"]
        d = tempfile.mkdtemp(prefix="tutti-hs-")
        self.addCleanup(shutil.rmtree, d, True)
        for bad, frag in ((BLOCK_BYTES - 1, "less than one chain block"), (0, "host_staging_bytes = 0"),
                          (tutti.hoststage.HOST_STAGING_BYTES_MAX + 1, "64 GiB")):
            with self.assertRaises(ValueError) as cm:
                ws.WorkerSide(lambda lay: None).register(kv, BS, host_staging_bytes=bad)
            self.assertIn(frag, str(cm.exception))
        w = ws.WorkerSide(lambda lay: tutti.Store([d], 1 << 20, lay.geometry, lay.num_pages, layout=lay.layout, path="cpu"))
        self.addCleanup(w.close)
        w.register(kv, BS, host_staging_bytes=100 * NB * BLOCK_BYTES)
        self.assertEqual(w.staging.pages, NB)  # never more pages than the engine's cache


@unittest.skipIf(torch is None, NO_TORCH)
class HostStagingCPUTest(Base, unittest.TestCase):
    DEV = "cpu"


@unittest.skipIf(torch is None, NO_TORCH)
class HostStagingCUDATest(Base, unittest.TestCase):
    DEV = "cuda"

    def setUp(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device visible to torch: the CUDA copies (side stream, events, pinned pool) run on the GPU machine")


if __name__ == "__main__":
    unittest.main()
