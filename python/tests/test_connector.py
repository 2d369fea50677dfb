"""The engine-neutral connector (tutti.scheduler_side over tutti.worker_side,
what tutti.vllm.TuttiConnector and hf_serve.py run on) on the CPU path,
stdlib only: tensor validation (each wrong property raises the exception
naming it), a two-request flow whose second request's prefix is restored
layer by layer, bit-exact, and a batched step."""

import shutil
import tempfile
import unittest
from types import SimpleNamespace as NS

import tutti
from tutti import worker_side as ws
from tutti.scheduler_side import LocalMatcher, SchedulerSide

from helpers import SMALL, SMALL_IO, HostBuffer, StoreFixture

PT, H, D, L = SMALL.page_tokens, SMALL.kv_heads, SMALL.head_dim, SMALL.layers
PAGE = PT * H * D  # elements of one page of one plane (fp16: 2 bytes each)
SEED = 0x5EED


def layer_name(i):
    return f"model.layers.{i}.self_attn.attn"


class DuckTensor:
    """Has exactly the torch.Tensor attributes the binding reads. Lets the
    torch code path (describe()) run where torch is not installed."""

    def __init__(self, ptr, shape, strides, dtype, device):
        self._ptr, self.shape, self._strides, self.dtype, self.device = ptr, tuple(shape), tuple(strides), dtype, device

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides

    def is_contiguous(self):
        return self._strides == tutti.contiguous_strides(self.shape)


class TensorValidationTest(unittest.TestCase):
    """WorkerSide.register against a store of SMALL's geometry."""

    def setUp(self):
        self.fx = StoreFixture()
        self.addCleanup(self.fx.close)
        self.good = self.fx.tensors()
        self.name = list(self.good)[2]

    def register(self, kv):
        w = ws.WorkerSide(lambda lay: self.fx.store)
        self.addCleanup(w.close, False)  # the fixture closes the store
        return w.register(kv, PT)

    def with_bad(self, **change):
        t = self.good[self.name]
        d = dict(data_ptr=t.data_ptr, shape=t.shape, strides=t.strides, dtype=t.dtype, device=t.device)
        d.update(change)
        kv = dict(self.good)
        kv[self.name] = tutti.RawTensor(**d)
        return kv

    def assertNames(self, exc_cls, field, kv, *fragments, name=None):
        with self.assertRaises(exc_cls) as cm:
            self.register(kv)
        msg = str(cm.exception)
        self.assertIsInstance(cm.exception, tutti.LayoutError)
        self.assertEqual(cm.exception.field, field)
        self.assertIn(name or self.name, msg)
        self.assertIn(field, msg)
        for f in fragments:
            self.assertIn(f, msg)

    def test_good(self):
        lay = self.register(self.good)
        self.assertEqual((lay.geometry, lay.layout, lay.num_pages), (SMALL, "per_layer", self.fx.num_pages))

    def test_one_tensor_for_two_layers(self):
        kv = dict(self.good)
        names = list(kv)
        kv[names[1]] = kv[names[0]]
        with self.assertRaises(ValueError) as cm:
            self.register(kv)
        self.assertIn(repr(names[0]), str(cm.exception))
        self.assertIn(repr(names[1]), str(cm.exception))

    def test_dtype(self):
        self.assertNames(tutti.DTypeMismatch, "dtype", self.with_bad(dtype="bfloat16"), "bfloat16", "fp16")
        self.assertNames(tutti.DTypeMismatch, "dtype", self.with_bad(dtype="int64"), "int64")
        # Every layer of another dtype than the store's: named against the store.
        first = list(self.good)[0]
        kv = {n: tutti.RawTensor(t.data_ptr, t.shape, t.strides, "bf16") for n, t in self.good.items()}
        self.assertNames(tutti.DTypeMismatch, "dtype", kv, "bf16", "fp16", name=first)

    def test_shape(self):
        t = self.good[self.name]
        shape = (t.shape[0], t.shape[1], t.shape[2], t.shape[3], t.shape[4] * 2)
        self.assertNames(tutti.ShapeMismatch, "shape", self.with_bad(shape=shape, strides=tutti.contiguous_strides(shape)),
                         str(list(shape)))
        self.assertNames(tutti.ShapeMismatch, "shape", self.with_bad(shape=t.shape[1:], strides=t.strides[1:]))
        self.assertNames(tutti.ShapeMismatch, "shape", self.with_bad(shape=(7,) + t.shape, strides=(1,) + t.strides),
                         "none of")

    def test_stride(self):
        t = self.good[self.name]
        # K and V of a page neither planes apart nor side by side.
        s = list(t.strides)
        s[0], s[1] = s[1], t.shape[2] * t.shape[3] * t.shape[4]
        self.assertNames(tutti.StrideMismatch, "stride", self.with_bad(strides=tuple(s)), "K/V stride")
        # A gap inside a page.
        s = list(t.strides)
        s[3] *= 2
        self.assertNames(tutti.StrideMismatch, "stride", self.with_bad(strides=tuple(s)), "dense")

    def test_alignment(self):
        self.assertNames(tutti.AlignmentError, "alignment", self.with_bad(data_ptr=self.good[self.name].data_ptr + 2), "16-byte")

    def test_device(self):
        self.assertNames(tutti.DeviceMismatch, "device", self.with_bad(device="cuda:0"), "cuda:0", "cpu")
        # Every layer on a GPU, the store on the CPU path: named against the path.
        first = list(self.good)[0]
        kv = {n: tutti.RawTensor(t.data_ptr, t.shape, t.strides, t.dtype, "cuda:0") for n, t in self.good.items()}
        self.assertNames(tutti.DeviceMismatch, "device", kv, "cuda:0", "cpu path", name=first)

    def test_null(self):
        self.assertNames(tutti.AddressError, "address", self.with_bad(data_ptr=0), "NULL")

    def test_not_a_tensor(self):
        kv = dict(self.good)
        kv[self.name] = [1, 2, 3]
        self.assertNames(tutti.NotATensor, "type", kv, "list")

    def test_torch_like(self):
        kv = {}
        for n, t in self.good.items():
            kv[n] = DuckTensor(t.data_ptr, t.shape, t.strides, "torch.float16", "cpu")
        bad = dict(kv)
        bad[self.name] = DuckTensor(kv[self.name].data_ptr(), kv[self.name].shape, kv[self.name].stride(), "torch.float32", "cpu")
        self.assertNames(tutti.DTypeMismatch, "dtype", bad, "torch.float32")
        self.register(kv)

    def test_layer_count(self):
        kv = dict(self.good)
        kv.pop(self.name)
        with self.assertRaises(tutti.LayoutError) as cm:
            self.register(kv)
        self.assertIn("3 layers", str(cm.exception))


class Engine:
    """Host KV tensors of one layout, both connector halves over a CPU-path
    store that the worker side opens from them: ``per_layer`` is vLLM's
    tensor per layer (2, pages, tokens, heads, dim); ``cross_layer`` is
    per-layer views of one buffer with the blocks outermost (tutti's
    cross-layer layout, K and V of a page side by side)."""

    def __init__(self, test, layout="per_layer", chunk_pages=1, num_pages=64):
        self.dir, self.bufs = tempfile.mkdtemp(prefix="tutti-pytest-"), []
        test.addCleanup(self.close)
        self.layout, self.num_pages, self.chunk_pages = layout, num_pages, chunk_pages
        self.block_tokens = PT * chunk_pages
        if layout == "per_layer":
            self.bufs = [HostBuffer(2 * num_pages * PAGE * 2) for _ in range(L)]
            self.kv = {layer_name(i): tutti.RawTensor.contiguous(b.addr, (2, num_pages, PT, H, D), "fp16")
                       for i, b in enumerate(self.bufs)}
        else:
            self.bufs = [HostBuffer(num_pages * L * 2 * PAGE * 2)]
            base, strides = self.bufs[0].addr, (L * 2 * PAGE, PAGE, H * D, D, 1)
            self.kv = {layer_name(i): tutti.RawTensor(base + i * 2 * PAGE * 2, (num_pages, 2, PT, H, D), strides, "fp16")
                       for i in range(L)}
        self.worker = ws.WorkerSide(self.open)
        self.lay = self.worker.register(self.kv, PT, chunk_pages=chunk_pages)
        self.store = self.worker.store
        self.matcher = LocalMatcher(self.store)
        self.worker.holds = self.matcher  # a request's hold is released once its load started
        self.sched = SchedulerSide(self.matcher, self.block_tokens, chunk_pages)
        self.names = list(self.kv)

    def open(self, lay):
        return tutti.Store([self.dir], 64 << 20, lay.geometry, lay.num_pages, layout=lay.layout, path="cpu", io=SMALL_IO)

    def fill_random(self, seed):
        for i, b in enumerate(self.bufs):
            b.fill_random(seed + i)

    def page(self, layer, p):
        """Page p of ``layer``: its K then its V bytes."""
        n = PAGE * 2
        if self.layout == "per_layer":
            v = self.bufs[layer].view()
            return bytes(v[p * n:(p + 1) * n]) + bytes(v[(self.num_pages + p) * n:(self.num_pages + p + 1) * n])
        off = (p * L + layer) * 2 * n
        return bytes(self.bufs[0].view()[off:off + 2 * n])

    def step(self, meta, check_layer=None):
        """One forward: the step's loads, per layer the wait (then
        ``check_layer(l)``: the layer is in memory) and the save hook, the
        save point, the step's end."""
        w = self.worker
        w.bind(meta.loads, meta.saves, ended=meta.ended, dropped=meta.dropped, finished=meta.finished, reused=meta.reused)
        w.start_load()
        for layer, n in enumerate(self.names):
            w.wait_for_layer(n)
            if check_layer is not None:
                check_layer(layer)
            w.save_layer(n)
        w.wait_for_save()
        res = w.finish_step()
        w.unbind()
        return res

    def close(self):
        try:
            if hasattr(self, "matcher"):
                self.matcher.close()
            if hasattr(self, "worker"):
                self.worker.close()
        finally:
            for b in self.bufs:
                b.close()
            shutil.rmtree(self.dir, ignore_errors=True)


def new_req(req_id, block_ids, computed=0):
    return NS(req_id=req_id, block_ids=list(block_ids), num_computed_tokens=computed)


class ConnectorFlowTest(unittest.TestCase):
    def flow(self, layout, chunk_pages=1):
        e = Engine(self, layout, chunk_pages)
        sched, cp, bt = e.sched, chunk_pages, e.block_tokens
        prompt = [(i * 7919) % 32000 for i in range(3 * bt + 5)]  # 3 full blocks + a partial one
        chain = tutti.chain_from_tokens(prompt, bt, SEED)
        self.assertEqual(len(chain), 3)
        pages_a = list(range(0, 4 * cp))
        pages_b = list(range(20, 20 + 4 * cp))

        # Request A: nothing cached; its prefill writes KV (random bytes here) and saves its full blocks.
        self.assertEqual(sched.get_num_new_matched_tokens("a", chain, len(prompt), 0), 0)
        sched.track("a", chain)
        e.fill_random(77)
        meta = sched.build_meta(NS(scheduled_new_reqs=[new_req("a", pages_a)], num_scheduled_tokens={"a": len(prompt)}))
        self.assertEqual([(s.req_id, s.chain, s.block_ids) for s in meta.saves], [("a", chain, pages_a[:3 * cp])])
        res = e.step(meta)
        self.assertEqual((res.restored_blocks, res.error_block_ids, res.failures), ({}, set(), {}))
        self.assertFalse(sched.request_finished("a"))  # its pages are never held for the save
        e.store.wait_saves()
        self.assertEqual(e.store.lookup(chain), 3)
        want = {(l, i): e.page(l, pages_a[i]) for l in range(L) for i in range(3 * cp)}

        # Request B: the same prompt plus more; its 3 full blocks hit (2 after a local one).
        prompt_b = prompt + [1, 2, 3]
        chain_b = tutti.chain_from_tokens(prompt_b, bt, SEED)
        self.assertEqual(sched.get_num_new_matched_tokens("b", chain_b, len(prompt_b), bt), 2 * bt)
        self.assertEqual(sched.get_num_new_matched_tokens("b", chain_b, len(prompt_b), 0), 3 * bt)
        sched.update_state_after_alloc("b", pages_b, 3 * bt)  # as vLLM's scheduler would
        meta = sched.build_meta(NS(num_scheduled_tokens={}, finished_req_ids={"a"}))
        self.assertEqual((meta.ended, meta.finished), ([], ["a"]))  # its pages keep its KV until allocated again
        self.assertEqual(sorted(meta.reused), pages_b[:3 * cp])  # b's load writes these
        self.assertEqual([(x.req_id, x.chain, x.skip, x.block_ids) for x in meta.loads], [("b", chain, 0, pages_b[:3 * cp])])

        def layer_restored(layer):  # bit-exact once its wait returned, before the next layer's
            for i in range(3 * cp):
                self.assertEqual(e.page(layer, pages_b[i]), want[(layer, i)], f"layer {layer} page {i}")

        res = e.step(meta, layer_restored)
        self.assertEqual(res.restored_blocks, {"b": 3})
        self.assertEqual((res.error_block_ids, res.failures), (set(), {}))

        # A prompt that is entirely cached reports one token less (its logits are
        # needed); loading that many tokens still restores every block.
        prompt_c = prompt[:3 * bt]
        n = sched.get_num_new_matched_tokens("c", tutti.chain_from_tokens(prompt_c, bt, SEED), len(prompt_c), 0)
        self.assertEqual(n, 3 * bt - 1)
        pages_c = list(range(40, 40 + 3 * cp))
        sched.update_state_after_alloc("c", pages_c, n)
        res = e.step(sched.build_meta(NS(num_scheduled_tokens={})))
        self.assertEqual(res.restored_blocks, {"c": 3})
        self.assertEqual(e.page(1, pages_c[-1]), want[(1, 3 * cp - 1)])

    def test_per_layer(self):
        self.flow("per_layer")

    def test_cross_layer(self):
        self.flow("cross_layer")

    def test_chunked(self):
        self.flow("per_layer", chunk_pages=2)

    def test_batch_step(self):
        # One step with two loads (one a partial hit), a promise the store no
        # longer keeps and a save, as a batched forward.
        e = Engine(self)
        sched, bt = e.sched, e.block_tokens
        e.fill_random(900)
        p1 = list(range(1000, 1000 + 3 * bt))
        p2 = list(range(5000, 5000 + 2 * bt))
        c1, c2 = tutti.chain_from_tokens(p1, bt), tutti.chain_from_tokens(p2, bt)
        sched.track("s1", c1)
        sched.track("s2", c2[:1])
        meta = sched.build_meta(NS(scheduled_new_reqs=[new_req("s1", [0, 1, 2]), new_req("s2", [3])],
                                   num_scheduled_tokens={"s1": 3 * bt, "s2": bt}))
        self.assertEqual([(s.req_id, s.block_ids) for s in meta.saves], [("s1", [0, 1, 2]), ("s2", [3])])
        self.assertEqual(e.step(meta).error_block_ids, set())
        e.store.wait_saves()

        self.assertEqual(sched.get_num_new_matched_tokens("l1", c1, len(p1) + 1, 0), 3 * bt)
        self.assertEqual(sched.get_num_new_matched_tokens("l2", c2, len(p2) + 1, 0), bt)  # one of two blocks stored
        sched.update_state_after_alloc("l1", [10, 11, 12, 13], 3 * bt)
        sched.update_state_after_alloc("l2", [20, 21, 22], bt)
        sched.track("s3", c2)
        meta = sched.build_meta(NS(scheduled_new_reqs=[new_req("s3", [3, 4])], num_scheduled_tokens={"s3": 2 * bt}))
        self.assertEqual({x.req_id: x.block_ids for x in meta.loads}, {"l1": [10, 11, 12], "l2": [20]})
        self.assertEqual([(s.req_id, s.block_ids) for s in meta.saves], [("s3", [3, 4])])
        meta.loads.append(ws.LoadSpec("l3", c2, 0, [30, 31]))  # promised by a stale view: block 2 is not stored
        res = e.step(meta)
        self.assertEqual(res.restored_blocks, {"l1": 3, "l2": 1, "l3": 1})
        self.assertEqual(res.error_block_ids, {31})  # l3's second block was not stored
        for layer in range(L):
            for src, dst in ((0, 10), (1, 11), (2, 12), (3, 20), (3, 30)):
                self.assertEqual(e.page(layer, dst), e.page(layer, src), f"layer {layer} page {dst}")
        e.store.wait_saves()
        self.assertEqual(e.store.lookup(c2), 2)  # s3 saved p2's second block

    def test_chain_ids_straight(self):
        """A save keyed by the engine's own uint64 chain ids; wait_for_save
        starts the step's saves itself when save_layer was not called."""
        e = Engine(self)
        e.worker.bind(saves=[ws.SaveSpec("x", [11, 22], [1, 2])])
        e.worker.wait_for_save()
        e.worker.finish_step()
        e.store.wait_saves()
        self.assertEqual(e.store.lookup([11, 22, 33]), 2)

    def test_missing_block_ids(self):
        e = Engine(self)
        e.worker.bind(loads=[ws.LoadSpec("y", [11, 22], 0, [1])])
        with self.assertRaises(ValueError) as cm:
            e.worker.start_load()
        self.assertIn("'y'", str(cm.exception))

    def test_unknown_layer(self):
        e = Engine(self)
        with self.assertRaises(KeyError):
            e.worker.wait_for_layer("nope")


if __name__ == "__main__":
    unittest.main()
