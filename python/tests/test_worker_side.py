"""tutti.worker_side with real torch tensors (CPU path): every KV layout vLLM's
attention backends hand out, read from shape and strides, saved and restored
after local hits through the per-layer hooks; bytes compared. Skips where
torch is missing (pyenv python3; /usr/bin/python3 sees Debian's python3-torch)."""

import os
import shutil
import tempfile
import unittest

import tutti
from tutti import worker_side as ws

try:
    import torch
except ImportError:
    torch = None

NO_TORCH = "torch is not installed for this interpreter (Debian's python3-torch serves /usr/bin/python3)"
L, NB, BS, H, D = 3, 12, 16, 2, 32


def path_under_test():
    return os.environ.get("TUTTI_TEST_PATH", "cpu")


def device():
    return "cuda" if path_under_test() == "gpu" else "cpu"


def layouts(dev=None):
    """name → (per-layer tensors on ``dev``, default the path's device; block dimension of each tensor)."""
    dev, dt = dev or device(), torch.bfloat16
    out = {}
    out["flash-nhd"] = ({f"l{i}": torch.zeros(2, NB, BS, H, D, dtype=dt, device=dev) for i in range(L)}, 1)
    out["flash-hnd"] = ({f"l{i}": torch.zeros(2, NB, H, BS, D, dtype=dt, device=dev).permute(0, 1, 3, 2, 4) for i in range(L)}, 1)
    out["flash-kv-in-block"] = ({f"l{i}": torch.zeros(NB, 2, BS, H, D, dtype=dt, device=dev).transpose(0, 1) for i in range(L)}, 1)
    out["flashinfer"] = ({f"l{i}": torch.zeros(NB, 2, BS, H, D, dtype=dt, device=dev) for i in range(L)}, 0)
    out["mla"] = ({f"l{i}": torch.zeros(NB, BS, 4 * D, dtype=dt, device=dev) for i in range(L)}, 0)
    one = torch.zeros(L, NB, H, BS, 2 * D, dtype=dt, device=dev)  # per-layer views cut from one buffer, layers outermost
    out["views-layer-major"] = ({f"l{i}": one[i] for i in range(L)}, 0)
    cross = torch.zeros(NB, L, 2, BS, H, D, dtype=dt, device=dev)  # blocks outermost: tutti's cross-layer layout
    out["views-block-major"] = ({f"l{i}": cross[:, i].transpose(0, 1) for i in range(L)}, 1)
    tok = torch.zeros(NB, L, BS, H, 2 * D, dtype=dt, device=dev)
    out["views-block-major-4d"] = ({f"l{i}": tok[:, i] for i in range(L)}, 0)
    return out


def page(t, block_dim, p):
    return t.select(block_dim, p).clone()


def run_step(w, names, loads=(), saves=(), start_first=True):
    """One engine step through the per-layer hooks; its StepResult."""
    w.bind(loads, saves)
    if start_first:
        w.start_load()
    for n in names:
        w.wait_for_layer(n)
        w.save_layer(n)
    w.wait_for_save()
    if not start_first:
        w.start_load()  # after the forward: a no-op, the waits started the loads
    res = w.finish_step()
    w.unbind()
    return res


@unittest.skipIf(torch is None, NO_TORCH)
class DescribeTest(unittest.TestCase):
    def test_layouts_read_from_strides(self):
        want = {"flash-nhd": ("per_layer", 2, H, D), "flash-hnd": ("per_layer", 2, H, D),
                "flash-kv-in-block": ("per_layer", 1, H, 2 * D), "flashinfer": ("per_layer", 1, H, 2 * D),
                "mla": ("per_layer", 1, 1, 4 * D), "views-layer-major": ("per_layer", 1, H, 2 * D),
                "views-block-major": ("cross_layer", 1, H, 2 * D), "views-block-major-4d": ("cross_layer", 1, H, 2 * D)}
        tags = set()
        for name, (kv, _) in layouts().items():
            lay = ws.describe_kv_caches(kv, BS)
            g = lay.geometry
            self.assertEqual((lay.layout, g.planes, g.kv_heads, g.head_dim), want[name], name)
            self.assertEqual((g.layers, g.page_tokens, lay.num_pages), (L, BS, NB), name)
            tags.add(lay.tag)
        self.assertIn("per_layer.kv.block.token.head.dim.bf16", tags)
        self.assertIn("per_layer.kv.block.head.token.dim.bf16", tags)  # HND never shares a store with NHD

    def test_refusals(self):
        base = torch.zeros(2, NB, BS, H, 2 * D, dtype=torch.bfloat16)
        cases = {
            "gap inside a page": ({"a": base[..., :D]}, "dense range"),
            "unknown shape": ({"a": torch.zeros(NB, 7, H, D, dtype=torch.bfloat16)}, "none of"),
            "mixed layouts": ({"a": torch.zeros(2, NB, BS, H, D, dtype=torch.bfloat16),
                               "b": torch.zeros(2, NB, H, BS, D, dtype=torch.bfloat16).permute(0, 1, 3, 2, 4)}, "one layout"),
            "layers out of place": ({f"l{i}": torch.zeros(NB, 2, 2, BS, H, D, dtype=torch.bfloat16)[:, 1 - i].transpose(0, 1)
                                     for i in range(2)}, "layers in order"),
        }
        for what, (kv, frag) in cases.items():
            with self.assertRaises(ws.LayoutError, msg=what) as cm:
                ws.describe_kv_caches(kv, BS)
            self.assertIn(frag, str(cm.exception), what)


    def test_one_tensor_for_two_layers(self):
        """Refused, naming both layers (vLLM passes one tensor under two names
        for layers that share a KV cache)."""
        t = torch.zeros(2, NB, BS, H, D, dtype=torch.bfloat16)
        for kv in ({"a": t, "b": t, "c": torch.zeros_like(t)}, {"c": torch.zeros_like(t), "a": t, "b": t[:, :]}):
            with self.assertRaises(ValueError) as cm:
                ws.describe_kv_caches(kv, BS)
            msg = str(cm.exception)
            self.assertIn("'a'", msg)
            self.assertIn("'b'", msg)
            self.assertIn("two layers", msg)


@unittest.skipIf(torch is None, NO_TORCH)
class RoundTripTest(unittest.TestCase):
    def open_worker(self, d):
        def opener(lay):
            return tutti.Store([d], 64 << 20, lay.geometry, lay.num_pages, layout=lay.layout, path=path_under_test(),
                               io=tutti.IOOptions(staging_bytes=4 << 20, staging_slot_bytes=1 << 20))
        return ws.WorkerSide(opener)

    def registered(self, layout: str):
        """A worker over a new store with layout's tensors registered: (worker, tensors)."""
        kv, _ = layouts()[layout]
        d = tempfile.mkdtemp(prefix="tutti-ws-")
        self.addCleanup(shutil.rmtree, d, True)
        w = self.open_worker(d)
        w.register(kv, BS)
        self.addCleanup(w.close)
        return w, kv

    def step(self, w, names, loads=(), saves=(), start_first=True):
        return run_step(w, names, loads, saves, start_first)

    def test_every_layout(self):
        for name, (kv, bdim) in layouts().items():
            for start_first in (True, False):
                with self.subTest(layout=name, start_load_first=start_first):
                    self.round_trip(kv, bdim, start_first)

    def round_trip(self, kv, bdim, start_first):
        d = tempfile.mkdtemp(prefix="tutti-ws-")
        self.addCleanup(shutil.rmtree, d, True)
        w = self.open_worker(d)
        lay = w.register(kv, BS)
        self.addCleanup(w.close)
        names = list(kv)
        gen = torch.Generator().manual_seed(5)
        for t in kv.values():
            t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
        chain = tutti.chain_from_tokens(list(range(5 * BS)), BS)
        src = [1, 2, 3, 4, 5]
        want = {(n, i): page(kv[n], bdim, p) for n in names for i, p in enumerate(src)}
        res = self.step(w, names, saves=[ws.SaveSpec("r1", chain, src)], start_first=start_first)
        self.assertEqual(res.error_block_ids, set())
        w.store.wait_saves()
        for t in kv.values():
            t.zero_()
        local, dst = [7, 8], [9, 10, 11]  # the engine has blocks 0-1 itself
        for n in names:
            for i, p in enumerate(local):
                kv[n].select(bdim, p).copy_(want[(n, i)])
        res = self.step(w, names, loads=[ws.LoadSpec("r2", chain, 2, dst)], start_first=start_first)
        self.assertEqual(res.restored_blocks, {"r2": 3}, lay.tag)
        self.assertEqual(res.error_block_ids, set())
        for n in names:
            for i, p in enumerate(local + dst):
                self.assertTrue(torch.equal(page(kv[n], bdim, p), want[(n, i)]), f"{lay.tag} {n} block {i}")
            for p in (0, 6):
                self.assertFalse(bool(page(kv[n], bdim, p).any()), f"{lay.tag}: page {p} written by a load")

    @unittest.skipUnless(path_under_test() == "gpu", "the GPU path's test (TUTTI_TEST_PATH=gpu, kernels/device-test.sh)")
    def test_saves_wait_for_writes_still_queued(self):
        """GPU path: each layer's KV is written on torch's stream behind a
        spin, still queued when the step hands its saves over; the saves
        (ordered by an event of that stream, not by the host) hold the
        written KV, not the zeros before it."""
        w, kv = self.registered("flash-nhd")
        self.assertTrue(w._save_event, "the GPU path with torch orders saves by an event")
        names = list(kv)
        gen = torch.Generator().manual_seed(8)
        want = {n: torch.randn(t.shape, generator=gen).to(t.dtype).to(t.device) for n, t in kv.items()}
        chain = tutti.chain_from_tokens(list(range(4 * BS)), BS)
        w.bind(saves=[ws.SaveSpec("r", chain, [0, 1, 2, 3])])
        for n in names:
            w.wait_for_layer(n)
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU clock before the layer's writes
            kv[n].copy_(want[n])
            w.save_layer(n)
        w.wait_for_save()
        w.finish_step()
        w.end_requests(ended=["r"])
        w.unbind()
        w.store.wait_saves()
        for t in kv.values():
            t.zero_()
        res = self.step(w, names, loads=[ws.LoadSpec("s", chain, 0, [4, 5, 6, 7])])
        self.assertEqual((res.restored_blocks, res.error_block_ids), ({"s": 4}, set()))
        for n in names:
            self.assertTrue(torch.equal(kv[n][:, 4:8], want[n][:, 0:4]), n)

    def test_failed_promise_is_a_load_error(self):
        w, kv = self.registered("flash-nhd")
        chain = tutti.chain_from_tokens(list(range(4 * BS)), BS)
        self.step(w, list(kv), saves=[ws.SaveSpec("a", chain[:2], [0, 1])])
        w.store.wait_saves()
        # Blocks 2 and 3 were promised (say, by a scheduler with a stale view)
        # but are not stored: their pages are errors, blocks 0-1 restored.
        res = self.step(w, list(kv), loads=[ws.LoadSpec("b", chain, 0, [4, 5, 6, 7])])
        self.assertEqual(res.restored_blocks, {"b": 2})
        self.assertEqual(res.error_block_ids, {6, 7})

    def test_load_whose_wait_fails_ends_with_the_step(self):
        w, kv = self.registered("flash-nhd")
        names = list(kv)
        chain = tutti.chain_from_tokens(list(range(4 * BS)), BS)
        self.step(w, names, saves=[ws.SaveSpec("a", chain, [0, 1, 2, 3])])
        w.store.wait_saves()
        w.bind([ws.LoadSpec("b", chain, 0, [4, 5, 6, 7]), ws.LoadSpec("c", chain, 0, [8, 9, 10, 11])])
        w.start_load()
        for n in names:
            w.wait_for_layer(n)
        broken = w._loads["b"][0]
        real_wait = broken.wait

        def wait():
            real_wait()
            raise tutti.TuttiError("the mover failed", op="tutti_load_wait")
        broken.wait = wait
        res = w.finish_step()  # b's end is unknown: all its blocks are recomputed; c is restored
        w.unbind()
        self.assertEqual(res.restored_blocks, {"b": 0, "c": 4})
        self.assertEqual(res.error_block_ids, {4, 5, 6, 7})
        self.assertIsInstance(res.failures["b"], tutti.TuttiError)
        self.assertEqual((broken.handle, w._loads), (0, {}))
        res = self.step(w, names, loads=[ws.LoadSpec("d", chain, 0, [4, 5, 6, 7])])  # the next step waits on its own loads only
        self.assertEqual((res.restored_blocks, res.error_block_ids), ({"d": 4}, set()))

    def test_sending_reported_once_after_saves(self):
        w, kv = self.registered("mla")
        chain = tutti.chain_from_tokens(list(range(2 * BS)), BS)
        w.bind(saves=[ws.SaveSpec("x", chain, [0, 1])], await_sending=["x"])
        for n in kv:
            w.save_layer(n)
        w.wait_for_save()
        self.assertEqual(w.finish_step(["x"]).sending, {"x"})
        w.bind()
        self.assertEqual(w.finish_step().sending, set())

    def test_background_load_is_reported_once_when_it_ended(self):
        """A background load (vLLM's asynchronous loads): no layer of its
        step waits for it, a step's finish reports it in ``recving`` once it
        ended (never before), and its bytes are restored; one whose promise
        fails is still reported, with its blocks as load errors."""
        w, kv = self.registered("flash-nhd")
        names = list(kv)
        gen = torch.Generator().manual_seed(9)
        for t in kv.values():
            t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
        chain = tutti.chain_from_tokens(list(range(4 * BS)), BS)
        want = {(n, i): page(kv[n], 1, p) for n in names for i, p in enumerate([0, 1, 2, 3])}
        self.step(w, names, saves=[ws.SaveSpec("a", chain, [0, 1, 2, 3])])
        w.store.wait_saves()
        for t in kv.values():
            t.zero_()
        other = tutti.chain_from_tokens(list(range(100, 100 + 2 * BS)), BS)  # never saved: its promise fails
        loads = [ws.LoadSpec("b", chain, 0, [4, 5, 6, 7], background=True),
                 ws.LoadSpec("c", other, 0, [8, 9], background=True)]
        res = self.step(w, names, loads=loads)
        seen, steps = set(res.recving), 1
        got = dict(res.restored_blocks)
        errors = set(res.error_block_ids)
        while seen != {"b", "c"} and steps < 10000:
            res = self.step(w, names)
            self.assertFalse(res.recving & seen, "a background load reported twice")
            seen |= res.recving
            got.update(res.restored_blocks)
            errors |= res.error_block_ids
            steps += 1
        self.assertEqual(seen, {"b", "c"})
        self.assertEqual(got, {"b": 4, "c": 0})
        self.assertEqual(errors, {8, 9})
        self.assertEqual((w._loads, w._recving), ({}, {}))
        for n in names:
            for i, p in enumerate([4, 5, 6, 7]):
                self.assertTrue(torch.equal(page(kv[n], 1, p), want[(n, i)]), f"{n} block {i}")
        self.assertEqual(self.step(w, names).recving, set())


class Watched:
    """A Save whose waits and release are logged as (event, request)."""

    def __init__(self, sv, rid, log):
        self.sv, self.rid, self.log = sv, rid, log

    def wait_gathered(self):
        self.log.append(("wait", self.rid))
        self.sv.wait_gathered()

    def gathered(self):
        return self.sv.gathered()

    def release(self):
        self.log.append(("release", self.rid))
        self.sv.release()


@unittest.skipIf(torch is None, NO_TORCH)
class SaveAfterStepTest(unittest.TestCase):
    """ends_requests: a save reads its request's pages after the step, until
    the engine ends the request; the step never waits for it."""

    def worker(self, ends_requests, **kw):
        d = tempfile.mkdtemp(prefix="tutti-ws-")
        self.addCleanup(shutil.rmtree, d, True)

        def opener(lay):
            return tutti.Store([d], 64 << 20, lay.geometry, lay.num_pages, layout=lay.layout, path=path_under_test(),
                               io=tutti.IOOptions(staging_bytes=4 << 20, staging_slot_bytes=1 << 20))
        w = ws.WorkerSide(opener, ends_requests=ends_requests, **kw)
        kv, _ = layouts()["flash-nhd"]
        w.register(kv, BS)
        self.addCleanup(w.close)
        log, real = [], w.store.save
        w.store.save = lambda chain, pages, **kw: Watched(real(chain, pages, **kw), self.rid, log)
        return w, kv, log

    def step(self, w, kv, rid, saves=(), loads=()):
        self.rid = rid  # the request the next saves are logged under
        return run_step(w, list(kv), loads, saves)

    def test_when_the_pages_are_let_go(self):
        for ends, after_step in ((False, [("wait", "r"), ("release", "r")]), (True, [])):
            with self.subTest(ends_requests=ends):
                w, kv, log = self.worker(ends)
                gen = torch.Generator().manual_seed(9)
                for t in kv.values():
                    t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
                want = {n: t[:, :4].clone() for n, t in kv.items()}
                chain = tutti.chain_from_tokens(list(range(4 * BS)), BS)
                self.step(w, kv, "r", saves=[ws.SaveSpec("r", chain, [0, 1, 2, 3])])
                self.assertEqual(log, after_step)
                self.assertEqual(sorted(w._inflight), ["r"] if ends else [])
                w.end_requests(ended=["r"])  # the engine may reuse r's pages from here on
                self.assertEqual(log, [("wait", "r"), ("release", "r")])
                self.assertEqual(w._inflight, {})
                waits = w.finish_step().counters  # the wait at end_requests, counted only where it happened
                self.assertEqual(waits.get("save_end_waits", 0), 1 if ends else 0)
                self.assertEqual(waits.get("save_end_wait_s", 0) > 0, ends)
                w.unbind()
                w.store.wait_saves()
                for t in kv.values():
                    t[:, :4].zero_()
                res = self.step(w, kv, "s", loads=[ws.LoadSpec("s", chain, 0, [4, 5, 6, 7])])
                self.assertEqual((res.restored_blocks, res.error_block_ids), ({"s": 4}, set()))
                for n, t in kv.items():
                    self.assertTrue(torch.equal(t[:, 4:8], want[n]), n)

    def test_saves_wait_for_the_engines_event(self):
        """save_event: each hand-over makes one event, every save of it is
        given that event, and the host never waits for the stream; False:
        the host waits (device_sync) and no save gets an event."""
        class Event:
            cuda_event = 0xE0

        for use_event in (True, False):
            with self.subTest(save_event=use_event):
                events, syncs, got = [], [], []

                def make():
                    events.append(Event())
                    return events[-1]
                w, kv, _ = self.worker(True, save_event=make if use_event else False,
                                       device_sync=lambda: syncs.append(1))
                real = w.store.save

                def save(chain, pages, after_event=None, **kw):
                    got.append(after_event)  # the CPU path refuses events: the real save gets none
                    return real(chain, pages, **kw)
                w.store.save = save
                self.rid = "r"
                chain = tutti.chain_from_tokens(list(range(4 * BS)), BS)
                run_step(w, list(kv), saves=[ws.SaveSpec("r", chain[:2], [0, 1]), ws.SaveSpec("q", chain[2:], [2, 3])])
                w.end_requests(ended=["r", "q"])
                self.assertEqual(len(events), 1 if use_event else 0)
                self.assertEqual(got, [events[0]] * 2 if use_event else [None, None])
                self.assertEqual(len(syncs), 0 if use_event else 1)

    def test_finished_request_ends_when_its_pages_are_reused(self):
        """A finished request's saves in flight go on reading its pages, no
        wait, until a step writes one of them afresh (reused), then they are
        waited for; the bound ends the oldest; a finished request's saves
        that gathered are released at a step's end, no wait."""
        w, kv, log = self.worker(True)
        chain = tutti.chain_from_tokens(list(range(4 * BS)), BS)
        self.step(w, kv, "r", saves=[ws.SaveSpec("r", chain, [0, 1, 2, 3])])
        w.end_requests(finished=["r"], reused=[8, 9])
        w.end_requests(reused=[10])
        self.assertEqual((log, sorted(w._inflight), w._deferred.requests()), ([], ["r"], ["r"]))
        w.end_requests(reused=[11, 2])  # a page r's save reads
        self.assertEqual(log, [("wait", "r"), ("release", "r")])
        self.assertEqual((w._inflight, w._deferred.requests()), ({}, []))
        c = w.finish_step().counters
        self.assertEqual([c.get(k, 0) for k in ("save_ends_deferred", "save_end_reuses", "save_end_waits")], [1, 1, 1])
        w.unbind()

        log.clear()
        old, ws.MAX_DEFERRED_ENDS = ws.MAX_DEFERRED_ENDS, 1
        self.addCleanup(setattr, ws, "MAX_DEFERRED_ENDS", old)
        w2, kv2, log2 = self.worker(True)
        for rid, pages in (("a", [0, 1]), ("b", [2, 3])):
            self.step(w2, kv2, rid, saves=[ws.SaveSpec(rid, chain[:2], pages)])
        w2.end_requests(finished=["a", "b"])
        self.assertEqual((log2, w2._deferred.requests()), ([("wait", "a"), ("release", "a")], ["b"]))
        self.assertEqual(w2.finish_step().counters.get("save_ends_deferred_cap", 0), 1)
        w2.store.wait_saves()  # b's save gathered: released at the step's end, never waited for
        w2.finish_step()
        self.assertEqual(log2[2:], [("release", "b")])
        self.assertEqual((w2._inflight, w2._deferred.requests()), ({}, []))

    def test_finished_request_with_a_queued_chunk_ends_now(self):
        """A queued chunk is handed over only at a step, and the engine may
        not step again: a finished request with one is ended at once."""
        w, kv, log = self.worker(True, save_flush_wait_ms=20)
        chain = tutti.chain_from_tokens(list(range(4 * BS)), BS)
        w.queue._lookup = lambda c: 0  # nothing commits: the second chunk stays queued
        self.step(w, kv, "q", saves=[ws.SaveSpec("q", chain[:2], [0, 1])])
        self.step(w, kv, "q", saves=[ws.SaveSpec("q", chain, [0, 1, 2, 3], start=2)])
        self.assertTrue(w.queue.pending("q"))
        w.end_requests(finished=["q"])
        self.assertEqual((w.queue.pending("q"), w._deferred.requests(), w._inflight), (False, [], {}))
        c = w.finish_step().counters
        self.assertEqual([c.get(k, 0) for k in ("save_ends_deferred", "save_end_waits", "save_flush_timeouts")], [0, 1, 1])

    def test_saves_in_flight_are_bounded(self):
        w, kv, log = self.worker(True)
        chain = tutti.chain_from_tokens(list(range(6 * BS)), BS)
        old, ws.MAX_INFLIGHT_SAVES = ws.MAX_INFLIGHT_SAVES, 2
        self.addCleanup(setattr, ws, "MAX_INFLIGHT_SAVES", old)
        counts = []
        for i, rid in enumerate(("a", "b", "c")):
            res = self.step(w, kv, rid, saves=[ws.SaveSpec(rid, chain[:2 * i + 2], list(range(2 * i + 2)))])
            counts.append(res.counters.get("save_inflight_cap_waits", 0))
        self.assertEqual(counts, [0, 0, 1])
        self.assertEqual(log, [("wait", "a"), ("release", "a")])  # the oldest
        self.assertEqual(sorted(w._inflight), ["b", "c"])
        w.close()  # waits for the rest
        self.assertEqual(sorted(log), sorted([("wait", r) for r in "abc"] + [("release", r) for r in "abc"]))


if __name__ == "__main__":
    unittest.main()
