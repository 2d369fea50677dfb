"""Every public entry point refuses a bad argument with TypeError (the wrong
kind) or ValueError (out of range) naming it, before ctypes can truncate,
cut or reinterpret it; a reopen with other settings names what differs."""

import os
import shutil
import tempfile
import unittest

import tutti
from tutti import _lib, hfcache, lookup_service, worker_side
from tutti.scheduler_side import LocalMatcher, SchedulerSide

from helpers import NUM_PAGES, SMALL, SMALL_IO, StoreFixture, small_geometry

BIG = 1 << 64


class Bad:
    """Stands for a non-integral, non-path object."""


class ArgsTest(unittest.TestCase):
    def setUp(self):
        self.fx = StoreFixture()
        self.addCleanup(self.fx.close)
        self.st = self.fx.store
        self.st.register_kv(self.fx.regions())
        self.chain = tutti.chain_from_tokens(list(range(2 * SMALL.block_tokens)), SMALL.block_tokens)
        self.tmp = tempfile.mkdtemp(prefix="tutti-pytest-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        # A relative path a bad argument might create lands here.
        self.cwd = tempfile.mkdtemp(dir=self.tmp)
        self.addCleanup(os.chdir, os.getcwd())
        os.chdir(self.cwd)

    def open(self, **kw):
        """A store in a directory of its own, closed at the end."""
        args = dict(dirs=[tempfile.mkdtemp(dir=self.tmp)], capacity_bytes=64 << 20, geometry=SMALL,
                    num_pages=NUM_PAGES, io=SMALL_IO)
        args.update(kw)
        st = tutti.Store(**args)
        self.addCleanup(st.close)
        return st

    def worker_save(self, **spec):
        """One step of a worker over a store of its own that saves ``spec``."""
        fx = StoreFixture()
        self.addCleanup(fx.close)
        w = worker_side.WorkerSide(lambda lay: fx.store)
        self.addCleanup(w.close, False)
        w.register(fx.tensors(), SMALL.page_tokens)
        w.bind(saves=[worker_side.SaveSpec("r", **spec)])
        w.wait_for_save()

    def cases(self):
        st, chain, pages = self.st, self.chain, [0, 1]
        bt = SMALL.block_tokens
        return [
            # (what, call, exception, substring of its message)
            ("dirs as one string", lambda: self.open(dirs="kvstore"), TypeError, "dirs"),
            ("dirs as one path", lambda: self.open(dirs=os.path.join(self.tmp, "s")), TypeError, "dirs"),
            ("dirs not iterable", lambda: self.open(dirs=5), TypeError, "dirs"),
            ("a dir of the wrong kind", lambda: self.open(dirs=[5]), TypeError, "dirs[0]"),
            ("a NUL in a dir", lambda: self.open(dirs=[os.path.join(self.tmp, "a\0b")]), ValueError, "dirs[0]"),
            ("a NUL in a bytes dir", lambda: self.open(dirs=[b"/tmp/a\0b"]), ValueError, "dirs[0]"),
            ("capacity past int64", lambda: self.open(capacity_bytes=1 << 63), ValueError, "capacity_bytes"),
            ("capacity a bool", lambda: self.open(capacity_bytes=True), TypeError, "capacity_bytes"),
            ("capacity a float", lambda: self.open(capacity_bytes=64e6), TypeError, "capacity_bytes"),
            ("num_pages a str", lambda: self.open(num_pages="64"), TypeError, "num_pages"),
            ("num_pages past int64", lambda: self.open(num_pages=BIG), ValueError, "num_pages"),
            ("geometry not a Geometry", lambda: self.open(geometry=(4, 2, 64)), TypeError, "geometry"),
            ("layers past int32", lambda: small_geometry(layers=(1 << 32) + 4), ValueError, "layers"),
            ("kv_heads a bool", lambda: small_geometry(kv_heads=True), TypeError, "kv_heads"),
            ("head_dim a float", lambda: small_geometry(head_dim=64.0), TypeError, "head_dim"),
            ("chunk_pages past int32", lambda: small_geometry(chunk_pages=1 << 31), ValueError, "chunk_pages"),
            ("an unknown dtype", lambda: small_geometry(dtype="int64"), ValueError, "dtype"),
            ("layout not a str", lambda: self.open(layout=["per_layer"]), TypeError, "layout"),
            ("an unknown path", lambda: self.open(path="disk"), ValueError, "path"),
            ("tp_rank negative", lambda: self.open(tp_rank=-1), ValueError, "tp_rank"),
            ("tp_size past uint32", lambda: self.open(tp_size=1 << 32), ValueError, "tp_size"),
            ("kv_events with a NUL", lambda: self.open(kv_events="tcp://127.0.0.1:1\0"), ValueError, "kv_events"),
            ("kv_events not a str", lambda: self.open(kv_events=5557), TypeError, "kv_events"),
            ("io not IOOptions", lambda: self.open(io={"queue_depth": 4}), TypeError, "io"),
            ("sched not SchedOptions", lambda: self.open(io=None, sched=SMALL_IO), TypeError, "sched"),
            ("a flat keyword past int32", lambda: self.open(io=None, queue_depth=1 << 40), ValueError, "queue_depth"),
            # options
            ("queue_depth past int32", lambda: tutti.IOOptions(queue_depth=1 << 31), ValueError, "queue_depth"),
            ("staging_bytes a bool", lambda: tutti.IOOptions(staging_bytes=True), TypeError, "staging_bytes"),
            ("save_budget_bytes past int64", lambda: tutti.SchedOptions(save_budget_bytes=1 << 63), ValueError,
             "save_budget_bytes"),
            ("save_bound_ms a float", lambda: tutti.SchedOptions(save_bound_ms=1.5), TypeError, "save_bound_ms"),
            ("compute not a dict", lambda: tutti.SchedOptions(compute=[1.0]), TypeError, "compute"),
            ("compute an unknown key", lambda: tutti.SchedOptions(compute={"per_flop_ns": 1}), ValueError, "per_flop_ns"),
            ("compute a str value", lambda: tutti.SchedOptions(compute={"per_token_ns": "1"}), TypeError, "per_token_ns"),
            ("device a NaN", lambda: tutti.SchedOptions(device={"read_iops": float("nan")}), ValueError, "read_iops"),
            ("device a bool", lambda: tutti.SchedOptions(device={"read_iops": True}), TypeError, "read_iops"),
            ("lookahead a float", lambda: tutti.GPUOptions(lookahead=1.5), TypeError, "lookahead"),
            ("max_io_bytes past int32", lambda: tutti.GPUOptions(max_io_bytes=1 << 32), ValueError, "max_io_bytes"),
            # Store's methods
            ("chain a str", lambda: st.lookup("abc"), TypeError, "chain"),
            ("chain past uint64", lambda: st.lookup([BIG]), ValueError, "chain"),
            ("chain of floats", lambda: st.lookup([1.0]), TypeError, "chain"),
            ("pages past int32", lambda: st.load(chain, [0, 1 << 31]), ValueError, "pages"),
            ("skip negative", lambda: st.load_with(chain, pages, skip=-1), ValueError, "skip"),
            ("skip a bool", lambda: st.load_with(chain, pages, skip=True), TypeError, "skip"),
            ("promised an int", lambda: st.load_with(chain, pages, promised=1), TypeError, "promised"),
            ("match skip past uint32", lambda: st.match(chain, skip=1 << 32), ValueError, "skip"),
            ("ttl_ms past uint32", lambda: st.match(chain, ttl_ms=1 << 32), ValueError, "ttl_ms"),
            ("ttl_ms a float", lambda: st.match(chain, ttl_ms=1.5), TypeError, "ttl_ms"),
            ("hashes of ints", lambda: st.save(chain, pages, hashes=[1, 2]), TypeError, "hashes[0]"),
            ("hashes one bytes", lambda: st.save(chain, pages, hashes=b"ab"), TypeError, "hashes"),
            ("tokens past uint32", lambda: st.save(chain, pages, tokens=[1 << 32]), ValueError, "tokens"),
            ("regions a str", lambda: self.open().register_kv("ab"), TypeError, "regions"),
            ("a region not a pair", lambda: self.open().register_kv([5]), TypeError, "regions[0]"),
            ("a negative address", lambda: self.open().register_kv([(-1, 10)]), ValueError, "regions[0] address"),
            ("a length past uint64", lambda: self.open().register_kv([(4096, BIG)]), ValueError, "regions[0] length"),
            ("an unknown memory", lambda: self.open().register_kv([(4096, 10)], memory="gpu"), ValueError, "memory"),
            ("a layer past int32", lambda: st.load(chain, pages).wait_layer(1 << 31), ValueError, "layer"),
            ("a negative stream", lambda: st.load(chain, pages).stream_wait_layer(0, -1), ValueError, "stream"),
            ("block_tokens past uint32", lambda: tutti.chain_from_tokens([1], 1 << 32), ValueError, "block_tokens"),
            ("block_tokens a bool", lambda: tutti.chain_from_tokens([1], True), TypeError, "block_tokens"),
            ("block_tokens 0", lambda: tutti.chain_from_tokens([1], 0), ValueError, "block_tokens"),
            ("seed negative", lambda: tutti.chain_from_tokens([1], 16, seed=-1), ValueError, "seed"),
            ("tokens not a sequence", lambda: tutti.chain_from_tokens(5, 16), TypeError, "tokens"),
            # Geometry's helpers
            ("tensor_bytes an unknown layout", lambda: SMALL.tensor_bytes("flat", 4), ValueError, "layout"),
            ("tensor_shape num_pages a float", lambda: SMALL.tensor_shape("per_layer", 4.0), TypeError, "num_pages"),
            ("page_offset a layer out of range", lambda: SMALL.page_offset("per_layer", 4, SMALL.layers, 0, 0),
             ValueError, "layer"),
            # tensor helpers
            ("data_ptr negative", lambda: tutti.RawTensor(-1, (1,), (1,), "fp16"), ValueError, "data_ptr"),
            ("data_ptr past uint64", lambda: tutti.RawTensor(BIG, (1,), (1,), "fp16"), ValueError, "data_ptr"),
            ("a negative dimension", lambda: tutti.RawTensor(4096, (2, -1), (1, 1), "fp16"), ValueError, "shape[1]"),
            ("shape a str", lambda: tutti.RawTensor(4096, "ab", (1,), "fp16"), TypeError, "shape"),
            ("strides of floats", lambda: tutti.RawTensor(4096, (2,), (1.0,), "fp16"), TypeError, "strides[0]"),
            ("dtype not a str", lambda: tutti.RawTensor(4096, (2,), (1,), 5), TypeError, "dtype"),
            ("device not a str", lambda: tutti.RawTensor(4096, (2,), (1,), "fp16", 0), TypeError, "device"),
            ("contiguous_strides of a bool", lambda: tutti.contiguous_strides([True]), TypeError, "shape[0]"),
            ("describe a name not a str", lambda: tutti.describe(Bad(), name=5), TypeError, "name"),
            # hfcache
            ("BlockTable num_pages a float", lambda: hfcache.BlockTable(2.5, 16), TypeError, "num_pages"),
            ("BlockTable page_tokens 0", lambda: hfcache.BlockTable(4, 0), ValueError, "page_tokens"),
            ("allocate a bool", lambda: hfcache.BlockTable(4, 16).allocate(True), TypeError, "n_tokens"),
            ("free a str page", lambda: hfcache.BlockTable(4, 16).free(["1"]), TypeError, "pages[0]"),
            ("set_filled_tokens a float", lambda: hfcache.set_filled_tokens(Bad(), 1.5), TypeError, "n_tokens"),
            ("cache_to_pages negative tokens", lambda: hfcache.cache_to_pages(Bad(), Bad(), Bad(), [0], -1),
             ValueError, "n_tokens"),
            ("pages_to_cache pages a str", lambda: hfcache.pages_to_cache(Bad(), "01", Bad(), Bad(), 1),
             TypeError, "pages"),
            # the connector's halves (a spec's ids are checked where they reach the store) and the lookup service
            ("worker store_opener not callable", lambda: worker_side.WorkerSide("kvstore"), TypeError, "store_opener"),
            ("worker device_sync not callable", lambda: worker_side.WorkerSide(lambda lay: st, device_sync=1), TypeError,
             "device_sync"),
            ("worker stream_wait an int", lambda: worker_side.WorkerSide(lambda lay: st, stream_wait=1), TypeError,
             "stream_wait"),
            ("register layer_names a str", lambda: worker_side.WorkerSide(lambda lay: st).register(
                self.fx.tensors(), SMALL.page_tokens, layer_names="abcd"), TypeError, "layer_names"),
            ("a layer name not a str", lambda: worker_side.describe_kv_caches(
                self.fx.tensors(), SMALL.page_tokens, layer_names=[0, 1, 2, 3]), TypeError, "layer_names[0]"),
            ("scheduler matcher without release", lambda: SchedulerSide(object(), bt), TypeError, "matcher"),
            ("scheduler block_tokens 0", lambda: SchedulerSide(LocalMatcher(st), 0), ValueError, "block_tokens"),
            ("scheduler chunk_pages a float", lambda: SchedulerSide(LocalMatcher(st), bt, 1.0), TypeError, "chunk_pages"),
            ("a saved block id past int32", lambda: self.worker_save(chain=chain[:1], block_ids=[BIG]), ValueError, "pages"),
            ("a saved token id negative", lambda: self.worker_save(chain=chain[:1], block_ids=[0], tokens=[-1] * bt),
             ValueError, "tokens"),
            ("RemoteMatcher paths one str", lambda: lookup_service.RemoteMatcher("/tmp/s.sock"), TypeError, "paths"),
            ("RemoteMatcher timeout 0", lambda: lookup_service.RemoteMatcher(["/tmp/s.sock"], 0), ValueError,
             "timeout_s"),
            ("LookupServer matcher without match", lambda: lookup_service.LookupServer(os.path.join(self.tmp, "l.sock"),
                                                                                        object()), TypeError, "matcher"),
            # the loader
            ("a library path with a NUL", lambda: tutti.load_library("lib\0tutti.so"), ValueError, "path"),
            ("a version a bool", lambda: _lib.check_version(True), TypeError, "packed"),
        ]

    def test_bad_arguments(self):
        for what, call, exc, frag in self.cases():
            with self.subTest(what):
                with self.assertRaises(exc) as cm:
                    call()
                self.assertIn(frag, str(cm.exception))

    def test_dirs_string_creates_nothing(self):
        """A string where the list of directories belongs creates no
        one-letter directories."""
        with self.assertRaises(TypeError):
            tutti.Store("kvstore", 64 << 20, SMALL, NUM_PAGES)
        self.assertEqual(os.listdir(self.cwd), [])

    def test_good_values_pass(self):
        """Ints of numpy-like kinds and paths of every kind still open."""
        g = tutti.Geometry(4, 2, 64, "fp16")
        with self.open(dirs=(p for p in [os.fsencode(os.path.join(self.tmp, "g"))]), geometry=g) as st:
            self.assertEqual(st.lookup(self.chain), 0)
        self.assertEqual(tutti.IOOptions(queue_depth=-1).queue_depth, -1)  # the library's to refuse


class SettingsMismatchTest(unittest.TestCase):
    """A reopen with other settings names what differs (SettingsMismatch,
    a ValueError), the store untouched."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tutti-pytest-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.dirs = [os.path.join(self.tmp, "a"), os.path.join(self.tmp, "b")]
        tutti.Store(self.dirs, 64 << 20, SMALL, NUM_PAGES, io=SMALL_IO).close()

    def test_reopen(self):
        for what, kw, frag in (
                ("another capacity", dict(capacity_bytes=32 << 20), "CapacityBytes"),
                ("a directory left out", dict(dirs=self.dirs[:1]), "missing from the list"),
                ("a directory that is not there", dict(dirs=[self.dirs[0], os.path.join(self.tmp, "c")]),
                 "does not exist")):
            with self.subTest(what):
                args = dict(dirs=self.dirs, capacity_bytes=64 << 20, geometry=SMALL, num_pages=NUM_PAGES, io=SMALL_IO)
                args.update(kw)
                with self.assertRaises(tutti.SettingsMismatch) as cm:
                    tutti.Store(**args)
                self.assertIsInstance(cm.exception, ValueError)
                self.assertIn(frag, str(cm.exception))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "c")))
        tutti.Store(self.dirs, 64 << 20, SMALL, NUM_PAGES, io=SMALL_IO).close()


if __name__ == "__main__":
    unittest.main()
