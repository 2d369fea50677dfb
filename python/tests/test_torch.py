"""PyTorch tensors through the binding (registered by the engine-neutral
worker side, tutti.worker_side, as vLLM's connector registers them). Needs
torch (the GPU machine has it; CI does not): every test here skips with a
message where torch, CUDA, or the GPU path is missing. The CPU-tensor tests
run wherever torch is installed."""

import shutil
import tempfile
import unittest

import tutti
from tutti import worker_side as ws

try:
    import torch
except ImportError:  # CI: no PyPI, no torch
    torch = None

from helpers import small_geometry

NO_TORCH = "torch is not installed (runs on the GPU machine)"
GEOM = small_geometry(layers=4, kv_heads=8, head_dim=128, dtype="bf16", page_tokens=16, chunk_pages=1)
PAGES = 32


def open_store(path, layout="per_layer", geometry=GEOM):
    d = tempfile.mkdtemp(prefix="tutti-torch-")
    st = tutti.Store([d], 256 << 20, geometry, PAGES, layout=layout, path=path,
                     io=tutti.IOOptions(staging_bytes=16 << 20, staging_slot_bytes=4 << 20))
    return st, d


def gpu_store_or_skip(test):
    if not torch.cuda.is_available():
        test.skipTest("no CUDA device visible to torch")
    try:
        st, d = open_store("gpu")
    except (tutti.NoGPU, tutti.NotSupported) as e:
        test.skipTest(f"tutti GPU path unavailable here: {e}")
    test.addCleanup(shutil.rmtree, d, True)
    test.addCleanup(st.close)
    return st


def per_layer_cache(device, dtype=None):
    dtype = dtype or torch.bfloat16
    shape = GEOM.tensor_shape("per_layer", PAGES)
    return {f"model.layers.{l}.self_attn.attn": torch.zeros(shape, dtype=dtype, device=device) for l in range(GEOM.layers)}


def register(test, st, kv, block_size=GEOM.page_tokens):
    """kv registered with ``st`` through a worker side (the test closes the store)."""
    w = ws.WorkerSide(lambda lay: st)
    test.addCleanup(w.close, False)
    w.register(kv, block_size)
    return w


def round_trip(test, st, kv, sync):
    register(test, st, kv)
    names = list(kv)
    g = torch.Generator(device="cpu").manual_seed(1234)
    for t in kv.values():
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    sync()
    chain = tutti.chain_from_tokens(list(range(5 * GEOM.block_tokens)), GEOM.block_tokens)
    src, dst = [1, 2, 3, 4, 5], [20, 21, 22, 23, 24]
    with st.save(chain, src) as sv:
        sv.wait_gathered()
    st.wait_saves()
    for t in kv.values():
        t[:, dst] = 0
    sync()
    with st.load(chain, dst) as ld:
        for l in range(GEOM.layers):
            ld.wait_layer(l)
        test.assertEqual(ld.wait(), 5)
    sync()
    for n in names:
        t = kv[n]
        test.assertTrue(torch.equal(t[:, dst], t[:, src]), f"{n}: restored pages differ from the saved ones")


@unittest.skipIf(torch is None, NO_TORCH)
class TorchCPUTest(unittest.TestCase):
    def setUp(self):
        self.st, d = open_store("cpu")
        self.addCleanup(shutil.rmtree, d, True)
        self.addCleanup(self.st.close)

    def test_round_trip_bit_exact(self):
        round_trip(self, self.st, per_layer_cache("cpu"), lambda: None)

    def test_wrong_dtype(self):
        kv = per_layer_cache("cpu", torch.float16)
        with self.assertRaises(tutti.DTypeMismatch) as cm:
            register(self, self.st, kv)
        self.assertIn("torch.float16", str(cm.exception))

    def test_wrong_shape(self):
        kv = per_layer_cache("cpu")
        kv["model.layers.1.self_attn.attn"] = torch.zeros(2, PAGES, 16, 8, 64, dtype=torch.bfloat16)
        with self.assertRaises(tutti.ShapeMismatch) as cm:
            register(self, self.st, kv)
        self.assertIn("model.layers.1", str(cm.exception))

    def test_non_contiguous(self):
        kv = per_layer_cache("cpu")
        shape = GEOM.tensor_shape("per_layer", PAGES)
        # [pages, planes, ...] storage seen as [planes, pages, ...]: right shape, wrong strides.
        kv["model.layers.2.self_attn.attn"] = torch.zeros(shape[1], shape[0], *shape[2:], dtype=torch.bfloat16).transpose(0, 1)
        with self.assertRaises(tutti.StrideMismatch):
            register(self, self.st, kv)

    def test_misaligned(self):
        kv = per_layer_cache("cpu")
        shape = GEOM.tensor_shape("per_layer", PAGES)
        n = 1
        for d in shape:
            n *= d
        kv["model.layers.3.self_attn.attn"] = torch.zeros(n + 1, dtype=torch.bfloat16)[1:].view(shape)
        with self.assertRaises(tutti.AlignmentError):
            register(self, self.st, kv)

    def test_cuda_tensor_on_cpu_path(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device visible to torch")
        with self.assertRaises(tutti.DeviceMismatch):
            register(self, self.st, per_layer_cache("cuda"))


@unittest.skipIf(torch is None, NO_TORCH)
class TorchGPUTest(unittest.TestCase):
    def test_round_trip_bit_exact(self):
        st = gpu_store_or_skip(self)
        round_trip(self, st, per_layer_cache("cuda"), torch.cuda.synchronize)

    def test_cross_layer_round_trip(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device visible to torch")
        # Per-layer views of one buffer with the blocks outermost: the worker
        # side reads them as tutti's cross-layer layout (K and V of a page
        # side by side: one plane of twice the head size).
        t = torch.zeros(GEOM.tensor_shape("cross_layer", PAGES), dtype=torch.bfloat16, device="cuda")
        views = {f"l{i}": t[:, i] for i in range(GEOM.layers)}
        lay = ws.describe_kv_caches(views, GEOM.page_tokens)
        self.assertEqual(lay.layout, "cross_layer")
        try:
            st, d = open_store("gpu", layout="cross_layer", geometry=lay.geometry)
        except (tutti.NoGPU, tutti.NotSupported) as e:
            self.skipTest(f"tutti GPU path unavailable here: {e}")
        self.addCleanup(shutil.rmtree, d, True)
        self.addCleanup(st.close)
        register(self, st, views)
        t.copy_(torch.randn(t.shape, device="cuda").to(torch.bfloat16))
        torch.cuda.synchronize()
        chain = [101, 202, 303]
        with st.save(chain, [0, 1, 2]) as sv:
            sv.wait_gathered()
        st.wait_saves()
        t[5:8].fill_(0)
        torch.cuda.synchronize()
        with st.load(chain, [5, 6, 7]) as ld:
            self.assertEqual(ld.wait(), 3)
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(t[5:8], t[0:3]))

    def test_worker_stream_wait(self):
        """wait_for_layer makes torch's stream wait (no host wait): kernels
        enqueued after it see the layer; finish_step ends the loads."""
        st = gpu_store_or_skip(self)
        kv = per_layer_cache("cuda")
        names = list(kv)
        w = register(self, st, kv)
        self.assertTrue(w.stream_wait)
        for t in kv.values():
            t.copy_(torch.randn(t.shape, device="cuda").to(t.dtype))
        chain = tutti.chain_from_tokens(list(range(4 * GEOM.block_tokens + 3)), GEOM.block_tokens)
        w.bind(saves=[ws.SaveSpec("a", chain, [0, 1, 2, 3])])
        for n in names:
            w.save_layer(n)
        w.wait_for_save()
        self.assertEqual(w.finish_step().error_block_ids, set())
        st.wait_saves()
        self.assertEqual(st.lookup(chain), 4)
        w.bind(loads=[ws.LoadSpec("b", chain, 0, [10, 11, 12, 13])])
        for t in kv.values():
            t[:, 10:14] = 0
        w.start_load()
        same = []
        for n in names:
            w.wait_for_layer(n)
            same.append(torch.equal(kv[n][:, 10:14], kv[n][:, 0:4]))  # ordered after the stream wait
        res = w.finish_step()
        self.assertEqual(res.restored_blocks, {"b": 4})
        self.assertEqual(res.error_block_ids, set())
        self.assertEqual(same, [True] * len(names))

    def test_cpu_tensor_on_gpu_path(self):
        st = gpu_store_or_skip(self)
        with self.assertRaises(tutti.DeviceMismatch) as cm:
            register(self, st, per_layer_cache("cpu"))
        self.assertIn("cuda", str(cm.exception))

    def test_wrong_dtype_on_gpu(self):
        st = gpu_store_or_skip(self)
        with self.assertRaises(tutti.DTypeMismatch):
            register(self, st, per_layer_cache("cuda", torch.float32))


if __name__ == "__main__":
    unittest.main()


@unittest.skipIf(torch is None, NO_TORCH)
class LlamaLoopSmokeTest(unittest.TestCase):
    """The model-loop example end to end with tiny shapes on the CPU (the
    real run, on CUDA, is the lead's device command)."""

    def test_cpu_flow(self):
        import contextlib
        import importlib.util
        import io
        import json
        import os

        path = os.path.join(os.path.dirname(__file__), "..", "examples", "llama_loop.py")
        spec = importlib.util.spec_from_file_location("llama_loop", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out = tempfile.mktemp(suffix=".json")
        self.addCleanup(lambda: os.path.exists(out) and os.remove(out))
        with contextlib.redirect_stdout(io.StringIO()):
            rc = mod.main(["--device", "cpu", "--path", "cpu", "--layers", "2", "--hidden", "128", "--heads", "4",
                           "--kv-heads", "2", "--head-dim", "32", "--intermediate", "256", "--vocab", "500",
                           "--prefix-tokens", "128", "--suffix-tokens", "8", "--reps", "2", "--warmup", "1",
                           "--distinct-layers", "1", "--json", out])
        with open(out) as f:
            rep = json.load(f)
        self.assertEqual(rc, 0, rep)
        self.assertTrue(rep["kv_bit_exact_vs_saved"])
        self.assertEqual(rep["kv_bit_exact_vs_saved_per_rep"], [True, True])
        self.assertTrue(rep["logits_equal_vs_recompute"])
        self.assertEqual(rep["loaded_blocks"], 8)
        # Two timed repetitions and one warm-up, each on its own prefix, all saved whole.
        self.assertEqual(len(rep["tutti_ttft_ms"]), 2)
        self.assertEqual(len(rep["recompute_ttft_ms"]), 2)
        self.assertEqual(len(rep["warmup_runs"]), 1)
        self.assertEqual(rep["stats"]["saves"]["saved_blocks"], 3 * 8)
        self.assertEqual(rep["stats"]["loads"]["restored_blocks"], 3 * 8)
        self.assertEqual(len(rep["tutti_per_layer"]["stream_wait_ms"]), 2)
        self.assertEqual(rep["model"]["distinct_layers"], 1)
        # The pool files were opened O_DIRECT by the library.
        self.assertTrue(rep["pool_files"])
        for p, v in rep["pool_files"].items():
            self.assertTrue(v["o_direct_fds"] and all(v["o_direct_fds"]), (p, v))
