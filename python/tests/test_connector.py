"""The vLLM-shaped connector on the CPU path: tensor validation (each wrong
property raises an exception naming it) and a two-request flow where the
second request's prefix is loaded layer by layer, bit-exact."""

import unittest

import tutti

from helpers import NUM_PAGES, SMALL, StoreFixture, small_geometry


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
    def setUp(self):
        self.fx = StoreFixture()
        self.addCleanup(self.fx.close)
        self.conn = tutti.TuttiConnector(self.fx.store)
        self.good = self.fx.tensors()
        self.name = list(self.good)[2]

    def with_bad(self, **change):
        t = self.good[self.name]
        d = dict(data_ptr=t.data_ptr, shape=t.shape, strides=t.strides, dtype=t.dtype, device=t.device)
        d.update(change)
        kv = dict(self.good)
        kv[self.name] = tutti.RawTensor(**d)
        return kv

    def assertNames(self, exc_cls, field, kv, *fragments):
        with self.assertRaises(exc_cls) as cm:
            self.conn.register_kv_caches(kv)
        msg = str(cm.exception)
        self.assertEqual(cm.exception.field, field)
        self.assertIn(self.name, msg)
        self.assertIn(field, msg)
        for f in fragments:
            self.assertIn(f, msg)

    def test_good(self):
        self.conn.register_kv_caches(self.good)

    def test_one_tensor_for_two_layers(self):
        kv = dict(self.good)
        names = list(kv)
        kv[names[1]] = kv[names[0]]
        with self.assertRaises(ValueError) as cm:
            self.conn.register_kv_caches(kv)
        self.assertIn(repr(names[0]), str(cm.exception))
        self.assertIn(repr(names[1]), str(cm.exception))

    def test_dtype(self):
        self.assertNames(tutti.DTypeMismatch, "dtype", self.with_bad(dtype="bfloat16"), "bfloat16", "fp16")
        self.assertNames(tutti.DTypeMismatch, "dtype", self.with_bad(dtype="int64"), "int64")

    def test_shape(self):
        t = self.good[self.name]
        shape = (t.shape[0], t.shape[1], t.shape[2], t.shape[3], t.shape[4] * 2)
        self.assertNames(tutti.ShapeMismatch, "shape", self.with_bad(shape=shape, strides=tutti.contiguous_strides(shape)),
                         str(list(shape)))
        self.assertNames(tutti.ShapeMismatch, "shape", self.with_bad(shape=t.shape[1:], strides=t.strides[1:]))

    def test_stride(self):
        t = self.good[self.name]
        # A [planes, pages, tokens, heads, dim] view of a [pages, planes, ...] tensor (not vLLM's layout).
        s = list(t.strides)
        s[0], s[1] = s[1], s[0] * 0 + t.shape[2] * t.shape[3] * t.shape[4]
        self.assertNames(tutti.StrideMismatch, "stride", self.with_bad(strides=tuple(s)), "dimension")

    def test_alignment(self):
        self.assertNames(tutti.AlignmentError, "alignment", self.with_bad(data_ptr=self.good[self.name].data_ptr + 2), "16-byte")

    def test_device(self):
        self.assertNames(tutti.DeviceMismatch, "device", self.with_bad(device="cuda:0"), "cuda:0", "cpu")

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
        self.conn.register_kv_caches(kv)
        kv[self.name] = DuckTensor(kv[self.name].data_ptr(), kv[self.name].shape, kv[self.name].stride(), "torch.float32", "cpu")
        self.assertNames(tutti.DTypeMismatch, "dtype", kv, "torch.float32")

    def test_layer_count(self):
        kv = dict(self.good)
        kv.pop(self.name)
        with self.assertRaises(ValueError):
            tutti.TuttiConnector(self.fx.store).register_kv_caches(kv)


class Request:
    """vLLM-like request: prompt token ids."""

    def __init__(self, req_id, prompt):
        self.request_id, self.prompt_token_ids = req_id, prompt


class ConnectorFlowTest(unittest.TestCase):
    def flow(self, geometry, layout):
        fx = StoreFixture(geometry=geometry, layout=layout)
        self.addCleanup(fx.close)
        conn = tutti.TuttiConnector(fx.store, hash_seed=0x5EED)
        kv = fx.tensors()
        conn.register_kv_caches(kv)
        names = list(kv)
        g = geometry
        bt = g.block_tokens
        prompt = [(i * 7919) % 32000 for i in range(3 * bt + 5)]  # 3 full blocks + a partial one
        pages_a = list(range(0, 4 * g.chunk_pages))
        pages_b = list(range(20, 20 + 4 * g.chunk_pages))

        # Request A: nothing cached; its prefill writes KV (random bytes here) and saves.
        req_a = Request("a", prompt)
        self.assertEqual(conn.get_num_new_matched_tokens(req_a, 0), (0, False))
        for i, b in enumerate(fx.bufs):
            b.fill_random(77 + i)
        conn.add_save(tutti.ReqMeta("a", pages_a, token_ids=prompt))
        conn.bind_connector_metadata(conn.build_connector_meta(None))
        conn.start_load_kv()
        for n in names:
            conn.wait_for_layer_load(n)
            conn.save_kv_layer(n, kv[n], None)
        conn.wait_for_save()
        sending, recving = conn.get_finished({"a"})
        self.assertEqual(sending, {"a"})
        self.assertIsNone(recving)
        conn.clear_connector_metadata()
        fx.store.wait_saves()
        want = {(l, pl, i): fx.page_bytes(l, pl, pages_a[i]) for l in range(g.layers) for pl in range(g.planes)
                for i in range(3 * g.chunk_pages)}

        # Request B: same prompt plus more; the 3 full blocks hit.
        req_b = Request("b", prompt + [1, 2, 3])
        self.assertEqual(conn.get_num_new_matched_tokens(req_b, 0), (3 * bt, False))
        self.assertEqual(conn.get_num_new_matched_tokens(req_b, bt), (2 * bt, False))
        conn.update_state_after_alloc(req_b, pages_b, 3 * bt)  # as vLLM's scheduler would
        self.assertEqual(conn.request_finished(req_b, pages_b), (False, None))
        conn.bind_connector_metadata(conn.build_connector_meta(None))
        conn.start_load_kv()
        for l, n in enumerate(names):
            conn.wait_for_layer_load(n)
            for pl in range(g.planes):
                for i in range(3 * g.chunk_pages):
                    self.assertEqual(fx.page_bytes(l, pl, pages_b[i]), want[(l, pl, i)], f"layer {l} plane {pl} page {i}")
            conn.save_kv_layer(n, kv[n], None)
        conn.wait_for_save()
        self.assertEqual(conn.get_finished(set()), (None, {"b"}))
        self.assertEqual(conn.loaded_blocks["b"], 3)
        self.assertEqual(conn.get_block_ids_with_load_errors(), set())
        conn.clear_connector_metadata()

        # A prompt that is entirely cached reports one token less (its logits are
        # needed); loading that many tokens still restores every block.
        req_c = Request("c", prompt[: 3 * bt])
        n, _ = conn.get_num_new_matched_tokens(req_c, 0)
        self.assertEqual(n, 3 * bt - 1)
        pages_c = list(range(40, 40 + 3 * g.chunk_pages))
        conn.bind_connector_metadata(tutti.ConnectorMetadata(loads=[
            tutti.ReqMeta("c", pages_c, token_ids=req_c.prompt_token_ids, num_tokens=n)]))
        conn.start_load_kv()
        for name in names:
            conn.wait_for_layer_load(name)
        self.assertEqual(conn.loaded_blocks["c"], 3)
        self.assertEqual(fx.page_bytes(1, 0, pages_c[-1]), want[(1, 0, 3 * g.chunk_pages - 1)])

    def test_per_layer(self):
        self.flow(SMALL, "per_layer")

    def test_cross_layer(self):
        self.flow(SMALL, "cross_layer")

    def test_chunked(self):
        self.flow(small_geometry(chunk_pages=2), "per_layer")

    def test_batch_step(self):
        # One step with two loads (one a partial hit) and a save, as a batched forward.
        fx = StoreFixture(num_pages=64)
        self.addCleanup(fx.close)
        conn = tutti.TuttiConnector(fx.store)
        kv = fx.tensors()
        names = list(kv)
        conn.register_kv_caches(kv)
        for i, b in enumerate(fx.bufs):
            b.fill_random(900 + i)
        bt = SMALL.block_tokens
        p1 = list(range(1000, 1000 + 3 * bt))
        p2 = list(range(5000, 5000 + 2 * bt))
        conn.bind_connector_metadata(tutti.ConnectorMetadata(saves=[
            tutti.ReqMeta("s1", [0, 1, 2], token_ids=p1), tutti.ReqMeta("s2", [3, 4], token_ids=p2[:bt])]))
        for n in names:
            conn.save_kv_layer(n, kv[n], None)
        conn.wait_for_save()
        self.assertEqual(conn.get_finished(set()), ({"s1", "s2"}, None))
        fx.store.wait_saves()
        conn.bind_connector_metadata(tutti.ConnectorMetadata(
            loads=[tutti.ReqMeta("l1", [10, 11, 12], token_ids=p1), tutti.ReqMeta("l2", [20, 21], token_ids=p2)],
            saves=[tutti.ReqMeta("s3", [3, 4], token_ids=p2)]))
        conn.start_load_kv()
        self.assertEqual(conn.planned_blocks, {"l1": 3, "l2": 1})
        for n in names:
            conn.wait_for_layer_load(n)
            conn.save_kv_layer(n, kv[n], None)
        conn.wait_for_save()
        self.assertEqual(conn.get_finished(set()), ({"s3"}, {"l1", "l2"}))
        self.assertEqual(conn.loaded_blocks, {"l1": 3, "l2": 1})
        self.assertEqual(conn.get_block_ids_with_load_errors(), {21})  # l2's second block was not stored
        for l in range(SMALL.layers):
            for src, dst in ((0, 10), (1, 11), (2, 12), (3, 20)):
                self.assertEqual(fx.page_bytes(l, 1, dst), fx.page_bytes(l, 1, src))
        fx.store.wait_saves()
        self.assertEqual(fx.store.lookup(tutti.chain_from_tokens(p2, bt)), 2)

    def test_block_hashes(self):
        fx = StoreFixture()
        self.addCleanup(fx.close)
        conn = tutti.TuttiConnector(fx.store)
        conn.register_kv_caches(fx.tensors())
        meta = tutti.ConnectorMetadata(saves=[tutti.ReqMeta("x", [1, 2], block_hashes=[11, 22])])
        conn.bind_connector_metadata(meta)
        conn.wait_for_save()  # starts the saves itself when save_kv_layer was not called
        fx.store.wait_saves()
        self.assertEqual(fx.store.lookup([11, 22, 33]), 2)

    def test_block_hash_forms(self):
        class H:
            hash_value = 22

        conn = tutti.TuttiConnector(self._fixture().store)
        chain = conn.chain_of(tutti.ReqMeta("z", [], block_hashes=[11, H(), (7).to_bytes(8, "little") + b"rest", -1]))
        self.assertEqual(chain, [11, 22, 7, 0xFFFFFFFFFFFFFFFF])

    def _fixture(self):
        fx = StoreFixture()
        self.addCleanup(fx.close)
        return fx

    def test_missing_block_ids(self):
        fx = StoreFixture()
        self.addCleanup(fx.close)
        conn = tutti.TuttiConnector(fx.store)
        conn.register_kv_caches(fx.tensors())
        conn.bind_connector_metadata(tutti.ConnectorMetadata(loads=[tutti.ReqMeta("y", [1], block_hashes=[11, 22])]))
        with self.assertRaises(ValueError) as cm:
            conn.start_load_kv()
        self.assertIn("'y'", str(cm.exception))

    def test_unknown_layer(self):
        fx = StoreFixture()
        self.addCleanup(fx.close)
        conn = tutti.TuttiConnector(fx.store)
        conn.register_kv_caches(fx.tensors())
        with self.assertRaises(KeyError):
            conn.wait_for_layer_load("nope")


if __name__ == "__main__":
    unittest.main()
