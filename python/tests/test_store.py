"""The CPU path through the C ABI: register, save, lookup, load, bit-exact
round trips, and every argument error the store must refuse."""

import ctypes
import os
import shutil
import tempfile
import unittest

import tutti
from tutti import _lib

from helpers import HostBuffer, NUM_PAGES, SMALL, SMALL_IO, StoreFixture, small_geometry


def chain_of(seed, n):
    return tutti.chain_from_tokens([(seed * 1000003 + i) & 0xFFFFFFFF for i in range(n * SMALL.block_tokens)],
                                   SMALL.block_tokens)


class RoundTripTest(unittest.TestCase):
    def round_trip(self, layout, geometry=SMALL):
        fx = StoreFixture(geometry=geometry, layout=layout)
        self.addCleanup(fx.close)
        st = fx.store
        st.register_kv(fx.regions())
        for i, b in enumerate(fx.bufs):
            b.fill_random(1000 + i)
        g = geometry
        blocks = 5
        chain = tutti.chain_from_tokens(list(range(blocks * g.block_tokens)), g.block_tokens)
        src = [p for p in range(3, 3 + blocks * g.chunk_pages)]
        dst = [p for p in range(40, 40 + blocks * g.chunk_pages)]
        self.assertEqual(st.lookup(chain), 0)
        with st.save(chain, src) as sv:
            sv.wait_gathered()
        st.wait_saves()
        self.assertEqual(st.lookup(chain), blocks)
        self.assertEqual(st.lookup(chain[:2]), 2)
        self.assertEqual(st.lookup(chain + [12345]), blocks)
        # Scramble the destination pages, then restore into them.
        want = {(l, pl, i): fx.page_bytes(l, pl, s) for l in range(g.layers) for pl in range(g.planes)
                for i, s in enumerate(src)}
        for b in fx.bufs:
            for p in dst:
                for l in range(g.layers):
                    for pl in range(g.planes):
                        off = g.page_offset(layout, fx.num_pages, l, pl, p)
                        if layout == "per_layer" and b is not fx.bufs[l]:
                            continue
                        b.view()[off:off + g.page_bytes_per_plane] = b"\xAA" * g.page_bytes_per_plane
        with st.load(chain, dst) as ld:
            for l in range(g.layers):
                ld.wait_layer(l)
            self.assertEqual(ld.wait(), blocks)
            self.assertIsNone(ld.failure())
        for (l, pl, i), w in want.items():
            got = fx.page_bytes(l, pl, dst[i])
            self.assertEqual(got, w, f"layer {l} plane {pl} block {i}: restored bytes differ")
        s = st.stats()
        self.assertGreaterEqual(s.loads.restored_blocks, blocks)
        self.assertGreaterEqual(s.saves.saved_blocks, blocks)
        return fx

    def test_per_layer(self):
        self.round_trip("per_layer")

    def test_cross_layer(self):
        self.round_trip("cross_layer")

    def test_chunked_mla(self):
        self.round_trip("per_layer", small_geometry(planes=1, kv_heads=1, head_dim=96, dtype="bf16", chunk_pages=4))

    def test_partial_hit(self):
        fx = StoreFixture()
        self.addCleanup(fx.close)
        fx.store.register_kv(fx.regions())
        chain = chain_of(7, 4)
        with fx.store.save(chain[:2], [0, 1]) as sv:
            sv.wait_gathered()
        fx.store.wait_saves()
        self.assertEqual(fx.store.lookup(chain), 2)
        with fx.store.load(chain, [10, 11, 12, 13]) as ld:
            self.assertEqual(ld.wait(), 2)

    def test_save_twice_and_extend(self):
        fx = StoreFixture()
        self.addCleanup(fx.close)
        st = fx.store
        st.register_kv(fx.regions())
        chain = chain_of(11, 4)
        with st.save(chain[:2], [0, 1]) as sv:
            sv.wait_gathered()
        st.wait_saves()
        with st.save(chain[:2], [0, 1]) as sv:  # already stored: skipped, still gathered/released
            sv.wait_gathered()
        with st.save(chain, [0, 1, 2, 3]) as sv:  # extends the stored prefix
            sv.wait_gathered()
        st.wait_saves()
        self.assertEqual(st.lookup(chain), 4)
        s = st.stats()
        self.assertEqual(s.saves.calls, 3)
        self.assertGreaterEqual(s.saves.skipped_blocks.cached, 2)

    def test_save_beyond_capacity_is_partial(self):
        # A save the store cannot hold is stored in part and counted, not an error.
        fx = StoreFixture(capacity_bytes=1 << 20)
        self.addCleanup(fx.close)
        st = fx.store
        st.register_kv(fx.regions())
        chain = chain_of(21, 40)
        with st.save(chain, list(range(40))) as sv:
            sv.wait_gathered()
        st.wait_saves()
        s = st.stats()
        self.assertLess(st.lookup(chain), 40)
        self.assertEqual(s.saves.saved_blocks + sum(vars(s.saves.skipped_blocks).values()), 40)
        self.assertEqual(st.lookup(chain), s.saves.saved_blocks)

    def test_corruption_is_a_miss_with_a_reason(self):
        # Flip a byte of a stored page in the pool file: the load restores
        # nothing of that run, says why, and the data path stays usable.
        fx = StoreFixture()
        self.addCleanup(fx.close)
        st = fx.store
        st.register_kv(fx.regions())
        for i, b in enumerate(fx.bufs):
            b.fill_random(4242 + i)
        chain = chain_of(31, 3)
        with st.save(chain, [0, 1, 2]) as sv:
            sv.wait_gathered()
        st.wait_saves()
        needle = fx.page_bytes(1, 0, 1)  # layer 1, K, block 1
        hit = None
        for root, _, files in os.walk(fx.dir):
            for name in files:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    data = f.read()
                at = data.find(needle)
                if at >= 0:
                    hit = (path, at)
        self.assertIsNotNone(hit, "saved page bytes not found in any store file")
        with open(hit[0], "r+b") as f:
            f.seek(hit[1] + 100)
            byte = f.read(1)
            f.seek(hit[1] + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        with st.load(chain, [10, 11, 12]) as ld:
            self.assertEqual(ld.plan(), (3, 3))
            n = ld.wait()  # block 1 is bad: at most block 0 arrives (per-chunk checksums)
            failure = ld.failure()
        self.assertLess(n, 2)
        for b in range(n):
            self.assertEqual(fx.page_bytes(1, 0, 10 + b), fx.page_bytes(1, 0, b))
        self.assertIsInstance(failure, tutti.Corrupt)
        self.assertIn("CRC", str(failure))
        s = st.stats()
        self.assertGreaterEqual(s.loads.miss_blocks.crc, 3 - n)
        self.assertEqual(s.loads.corrupt_dropped_runs, 1)

    def test_reopen_recovers(self):
        d = tempfile.mkdtemp(prefix="tutti-pytest-")
        self.addCleanup(shutil.rmtree, d, True)
        chain = chain_of(3, 3)
        buf = HostBuffer(SMALL.tensor_bytes("per_layer", NUM_PAGES))
        self.addCleanup(buf.close)
        with tutti.Store([d], 64 << 20, SMALL, NUM_PAGES, io=SMALL_IO) as st:
            st.register_kv([(buf.addr, buf.nbytes)] * SMALL.layers)
            st.save(chain, [1, 2, 3]).release()
            st.wait_saves()
        with tutti.Store([d], 64 << 20, SMALL, NUM_PAGES, io=SMALL_IO) as st:
            self.assertEqual(st.lookup(chain), 3)
            self.assertEqual(st.recovery(), {"indexed_runs": 1, "indexed_blocks": 3, "dropped_runs": 0})


class ArgumentErrorTest(unittest.TestCase):
    def setUp(self):
        self.fx = StoreFixture()
        self.addCleanup(self.fx.close)
        self.st = self.fx.store
        self.lib = _lib.lib()

    def test_load_before_register(self):
        with self.assertRaises(tutti.NotRegistered):
            self.st.load(chain_of(1, 1), [0])
        with self.assertRaises(tutti.NotRegistered):
            self.st.save(chain_of(1, 1), [0])

    def test_register_twice(self):
        self.st.register_kv(self.fx.regions())
        with self.assertRaises(tutti.InvalidArgument) as cm:
            self.st.register_kv(self.fx.regions())
        self.assertIn("already registered", str(cm.exception))

    def test_register_wrong_count(self):
        with self.assertRaises(tutti.GeometryMismatch) as cm:
            self.st.register_kv(self.fx.regions()[:3])
        self.assertIn("num_regions = 3, want 4", str(cm.exception))

    def test_register_wrong_length(self):
        r = self.fx.regions()
        r[2] = (r[2][0], r[2][1] - 2)
        with self.assertRaises(tutti.GeometryMismatch) as cm:
            self.st.register_kv(r)
        self.assertIn("regions[2].len_bytes", str(cm.exception))

    def test_register_misaligned_and_null(self):
        r = self.fx.regions()
        r[1] = (r[1][0] + 2, r[1][1])
        with self.assertRaises(tutti.InvalidArgument) as cm:
            self.st.register_kv(r)
        self.assertIn("regions[1].addr", str(cm.exception))
        self.assertIn("aligned", str(cm.exception))
        r = self.fx.regions()
        r[0] = (0, r[0][1])
        with self.assertRaises(tutti.InvalidArgument) as cm:
            self.st.register_kv(r)
        self.assertIn("NULL", str(cm.exception))

    def test_register_overflow(self):
        r = self.fx.regions()
        r[0] = ((1 << 64) - 4096, r[0][1])
        with self.assertRaises(tutti.InvalidArgument) as cm:
            self.st.register_kv(r)
        self.assertIn("overflow", str(cm.exception))

    def test_register_device_memory_on_cpu_path(self):
        with self.assertRaises(tutti.InvalidArgument) as cm:
            self.st.register_kv(self.fx.regions(), memory="cuda")
        self.assertIn("CPU path", str(cm.exception))

    def test_register_null_regions(self):
        rc = self.lib.tutti_register_kv(self.st.handle, _lib.MEMORY_HOST, None, 4)
        self.assertEqual(rc, tutti.InvalidArgument.code)
        rc = self.lib.tutti_register_kv(self.st.handle, 77, None, 4)
        self.assertEqual(rc, tutti.InvalidArgument.code)

    def test_pages_out_of_range(self):
        self.st.register_kv(self.fx.regions())
        for bad in (NUM_PAGES, -1, 1 << 30):
            with self.assertRaises(tutti.OutOfRange) as cm:
                self.st.load(chain_of(1, 2), [0, bad])
            self.assertIn("pages[1]", str(cm.exception))
            with self.assertRaises(tutti.OutOfRange):
                self.st.save(chain_of(1, 2), [bad, 0])

    def test_pages_count_mismatch(self):
        self.st.register_kv(self.fx.regions())
        with self.assertRaises(tutti.GeometryMismatch):
            self.st.load(chain_of(1, 2), [0, 1, 2])
        with self.assertRaises(tutti.GeometryMismatch):
            self.st.save(chain_of(1, 2), [0])

    def test_save_after_an_event(self):
        """after_event is the GPU path's: refused on the CPU path, by the
        library, after the binding refused what is no event."""
        self.st.register_kv(self.fx.regions())

        class Recorded:
            cuda_event = 0x7F00

        with self.assertRaises(tutti.NotSupported) as cm:
            self.st.save(chain_of(1, 2), [0, 1], after_event=Recorded())
        self.assertIn("tutti_save_after", str(cm.exception))
        for bad in (0, True, "ev", object(), -5):
            with self.assertRaises(ValueError, msg=repr(bad)) as cm:
                self.st.save(chain_of(1, 2), [0, 1], after_event=bad)
            self.assertIn("after_event", str(cm.exception))
        self.assertEqual(self.st.lookup(chain_of(1, 2)), 0)

    def test_duplicate_load_pages(self):
        self.st.register_kv(self.fx.regions())
        with self.assertRaises(tutti.InvalidArgument) as cm:
            self.st.load(chain_of(1, 2), [5, 5])
        self.assertIn("distinct", str(cm.exception))

    def test_null_and_empty_arrays(self):
        self.st.register_kv(self.fx.regions())
        h, out = ctypes.c_uint64(), ctypes.c_uint32()
        pages = (ctypes.c_int32 * 1)(0)
        chain = (ctypes.c_uint64 * 1)(1)
        self.assertEqual(self.lib.tutti_load(self.st.handle, None, 1, pages, 1, ctypes.byref(h)), tutti.InvalidArgument.code)
        self.assertEqual(self.lib.tutti_load(self.st.handle, chain, 1, None, 1, ctypes.byref(h)), tutti.InvalidArgument.code)
        self.assertEqual(self.lib.tutti_load(self.st.handle, chain, 0, pages, 0, ctypes.byref(h)), tutti.InvalidArgument.code)
        self.assertEqual(self.lib.tutti_load(self.st.handle, chain, 1, pages, 1, None), tutti.InvalidArgument.code)
        self.assertEqual(self.lib.tutti_save(self.st.handle, chain, 1, pages, 1, None), tutti.InvalidArgument.code)
        self.assertEqual(self.lib.tutti_lookup(self.st.handle, chain, 1, None), tutti.InvalidArgument.code)
        self.assertEqual(self.lib.tutti_lookup(self.st.handle, None, 1, ctypes.byref(out)), tutti.InvalidArgument.code)
        self.assertEqual(self.lib.tutti_lookup(self.st.handle, chain, 1 << 30, ctypes.byref(out)), tutti.InvalidArgument.code)
        self.assertEqual(self.lib.tutti_get_stats(self.st.handle, None), tutti.InvalidArgument.code)

    def test_wait_layer_out_of_range(self):
        self.st.register_kv(self.fx.regions())
        with self.st.load(chain_of(9, 1), [0]) as ld:
            with self.assertRaises(tutti.OutOfRange):
                ld.wait_layer(SMALL.layers)
            with self.assertRaises(tutti.OutOfRange):
                ld.wait_layer(-1)
            self.assertEqual(ld.wait(), 0)

    def test_stream_wait_on_cpu_path(self):
        self.st.register_kv(self.fx.regions())
        with self.st.load(chain_of(9, 1), [0]) as ld:
            with self.assertRaises(tutti.NotSupported):
                ld.stream_wait_layer(0, 0)
            with self.assertRaises(tutti.OutOfRange):
                ld.stream_wait_layer(99, 0)

    def test_handle_kinds_do_not_mix(self):
        self.st.register_kv(self.fx.regions())
        ld = self.st.load(chain_of(9, 1), [0])
        self.assertEqual(self.lib.tutti_close(ld.handle), tutti.BadHandle.code)
        self.assertEqual(self.lib.tutti_save_release(ld.handle), tutti.BadHandle.code)
        self.assertEqual(self.lib.tutti_load_release(self.st.handle), tutti.BadHandle.code)
        ld.release()
        self.assertEqual(self.lib.tutti_load_wait(ld.handle or 1 << 57, None), tutti.BadHandle.code)

    def test_released_handle(self):
        self.st.register_kv(self.fx.regions())
        ld = self.st.load(chain_of(9, 1), [0])
        h = ld.handle
        ld.release()
        self.assertEqual(self.lib.tutti_load_wait_layer(h, 0), tutti.BadHandle.code)
        self.assertEqual(self.lib.tutti_load_release(h), tutti.BadHandle.code)

    def test_closed_store(self):
        self.st.register_kv(self.fx.regions())
        ld = self.st.load(chain_of(9, 1), [0])
        sv = self.st.save(chain_of(9, 1), [0])
        h = self.st.handle
        self.st.close()
        self.assertTrue(self.st.closed)
        self.st.close()  # idempotent in Python
        self.assertEqual(self.lib.tutti_close(h), tutti.BadHandle.code)
        out = ctypes.c_uint32()
        chain = (ctypes.c_uint64 * 1)(1)
        self.assertEqual(self.lib.tutti_lookup(h, chain, 1, ctypes.byref(out)), tutti.BadHandle.code)
        # Loads and saves of a closed store are gone with it.
        with self.assertRaises(tutti.BadHandle):
            ld.wait_layer(0)
        with self.assertRaises(tutti.BadHandle):
            sv.wait_gathered()
        with self.assertRaises(tutti.BadHandle):
            ld.release()

    def test_second_open_is_locked(self):
        with self.assertRaises(tutti.Locked) as cm:
            tutti.Store([self.fx.dir], 64 << 20, SMALL, NUM_PAGES)
        self.assertIn(self.fx.dir, str(cm.exception))


class ConfigErrorTest(unittest.TestCase):
    def open(self, **kw):
        d = tempfile.mkdtemp(prefix="tutti-pytest-")
        self.addCleanup(shutil.rmtree, d, True)
        args = dict(dirs=[d], capacity_bytes=64 << 20, geometry=SMALL, num_pages=NUM_PAGES)
        args.update(kw)
        return tutti.Store(**args)

    def test_bad_geometry(self):
        with self.assertRaises(tutti.GeometryMismatch) as cm:
            self.open(geometry=small_geometry(planes=3))
        self.assertIn("Planes", str(cm.exception))
        with self.assertRaises(tutti.GeometryMismatch):
            self.open(geometry=small_geometry(layers=0))

    def test_bad_fields(self):
        for kw, frag in ((dict(num_pages=0), "num_pages"), (dict(capacity_bytes=0), "CapacityBytes"),
                         (dict(io=tutti.IOOptions(queue_depth=-1)), "QueueDepth"), (dict(dirs=[]), "num_dirs"),
                         (dict(sched=tutti.SchedOptions(save_budget_bytes=-1)), "SaveBudgetBytes"),
                         (dict(io=tutti.IOOptions(save_writes_per_device=-1)), "SaveWritesPerDevice"),
                         (dict(io=tutti.IOOptions(save_writes_per_device=257)), "SaveWritesPerDevice")):
            with self.assertRaises(tutti.InvalidArgument, msg=str(kw)) as cm:
                self.open(**kw)
            self.assertIn(frag, str(cm.exception))

    def test_bad_enums(self):
        lib = _lib.lib()
        d = tempfile.mkdtemp(prefix="tutti-pytest-")
        self.addCleanup(shutil.rmtree, d, True)
        arr = (ctypes.c_char_p * 1)(d.encode())
        base = dict(struct_size=ctypes.sizeof(_lib.tutti_config), abi_major=1,
                    dirs=ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)), num_dirs=1, path=1,
                    capacity_bytes=64 << 20, layers=2, kv_heads=1, head_dim=64, dtype=2, planes=2,
                    page_tokens=16, chunk_pages=1, layout=1, num_pages=8)
        for field, val, frag in (("path", 9, "path"), ("dtype", 0, "dtype"), ("dtype", 9, "dtype"),
                                 ("layout", 0, "layout"), ("tp_rank", 1, "tp_rank = 1"), ("tp_size", 65, "tp_size = 65"),
                                 ("gpu_flags", 2, "gpu_flags = 0x2"),
                                 ("gpu_flags", 1 | 1 << 31, "known: TUTTI_GPU_READS_FROM_DEVICES = 1")):
            cfg = _lib.tutti_config(**dict(base, **{field: val}))
            h = ctypes.c_uint64()
            self.assertEqual(lib.tutti_open(ctypes.byref(cfg), ctypes.byref(h)), tutti.InvalidArgument.code, field)
            self.assertIn(frag, tutti.last_error())

    def test_abi_1_0_config(self):
        """A 1.0 caller's tutti_config (208 bytes) opens: the 1.1 fields past
        its struct_size read as 0, whatever lies in memory there."""
        lib = _lib.lib()
        d = tempfile.mkdtemp(prefix="tutti-pytest-")
        self.addCleanup(shutil.rmtree, d, True)
        arr = (ctypes.c_char_p * 1)(d.encode())
        cfg = _lib.tutti_config(struct_size=208, abi_major=1,
                                dirs=ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)), num_dirs=1, path=1,
                                capacity_bytes=64 << 20, layers=2, kv_heads=1, head_dim=64, dtype=2, planes=2,
                                page_tokens=16, chunk_pages=1, layout=1, num_pages=8,
                                gpu_max_io_bytes=4097, gpu_flags=7)
        h = ctypes.c_uint64()
        self.assertEqual(lib.tutti_open(ctypes.byref(cfg), ctypes.byref(h)), 0, tutti.last_error())
        self.assertEqual(lib.tutti_close(h.value), 0, tutti.last_error())

    def test_gpu_reads(self):
        for gpu, frag in ((tutti.GPUOptions(max_io_bytes=4097), "GPU.MaxIOBytes"),
                          (tutti.GPUOptions(io_window=5000), "GPU.IOWindow"), (tutti.GPUOptions(lookahead=17), "GPU.Lookahead")):
            with self.assertRaises(tutti.InvalidArgument) as cm:
                self.open(gpu=gpu)
            self.assertIn(frag, str(cm.exception))
        self.open(gpu=tutti.GPUOptions(io_window=384, max_io_bytes=4 << 20, lookahead=4)).close()

    def test_gpu_reads_sized_to_devices(self):
        """Sized to the devices by default, a set value winning (what could
        not be read: runtime's TestDeviceSizedGPUReads)."""
        with self.open() as st:
            self.assertRegex(st.gpu_reads(), r"^window \d+ reads, largest read \d+ KiB, lookahead \d+ layers")
        with self.open(gpu=tutti.GPUOptions(lookahead=3)) as st:
            text = st.gpu_reads()
            self.assertRegex(text, r"^window \d+ reads, largest read \d+ KiB, lookahead 3 layers \(1 directories\)")

    def test_flat_keywords_deprecated(self):
        """The flat keywords of earlier releases still set their field and
        warn with the grouped spelling; gpu_reads_from_devices changes
        nothing; a flat keyword next to its group, or an unknown one, fails."""
        with self.assertWarns(DeprecationWarning) as cm:
            st = self.open(gpu_lookahead=3, staging_bytes=4 << 20, staging_slot_bytes=1 << 20)
        with st:
            self.assertIn("lookahead 3 layers", st.gpu_reads())
        self.assertIn("gpu=GPUOptions(lookahead=...)", str(cm.warning))
        with self.assertRaises(tutti.InvalidArgument) as cm:
            with self.assertWarns(DeprecationWarning):
                self.open(queue_depth=-1)
        self.assertIn("QueueDepth", str(cm.exception))
        with self.assertWarnsRegex(DeprecationWarning, "changes nothing"):
            with self.open() as a:
                want = a.gpu_reads()
            with self.open(gpu_reads_from_devices=True) as b:
                self.assertEqual(b.gpu_reads(), want)
        with self.assertRaisesRegex(TypeError, r"io=IOOptions\(max_loads=...\)"):
            self.open(io=SMALL_IO, max_loads=4)
        with self.assertRaisesRegex(TypeError, "gpu_windw"):
            self.open(gpu_windw=4)

    def test_flat_table_covers_groups(self):
        """Every field of every group has exactly one flat keyword."""
        from dataclasses import fields
        from tutti import options
        for group, cls in options.GROUPS.items():
            want = sorted((group, f.name) for f in fields(cls))
            self.assertEqual(sorted(v for v in options.FLAT.values() if v[0] == group), want, group)

    def test_gpu_path_without_gpu(self):
        try:
            st = self.open(path="gpu")
        except (tutti.NoGPU, tutti.NotSupported) as e:
            self.assertIn("tutti_open", str(e))
        else:
            st.close()  # a GPU machine: the path opened

    def test_bad_device_profile(self):
        with self.assertRaises(tutti.InvalidArgument) as cm:
            self.open(sched=tutti.SchedOptions(device=dict(read_bytes_per_sec=-1)))
        self.assertIn("device", str(cm.exception))
        with self.assertRaises(ValueError):
            self.open(sched=tutti.SchedOptions(compute=dict(per_flop_ns=1)))

    def test_compute_model_plans_recompute(self):
        # Recomputation nearly free, a slow device: the scheduler loads less
        # than is stored, and the load says so up front.
        st = self.open(sched=tutti.SchedOptions(
            compute=dict(per_token_ns=1e-3),
            device=dict(read_bytes_per_sec=1e6, write_bytes_per_sec=1e6, read_iops=100, write_iops=100,
                        read_latency_ns=1e7, read_share_under_writes=1, write_share_under_reads=1)), io=SMALL_IO)
        self.addCleanup(st.close)
        buf = HostBuffer(SMALL.tensor_bytes("per_layer", NUM_PAGES))
        self.addCleanup(buf.close)
        st.register_kv([(buf.addr, buf.nbytes)] * SMALL.layers)
        chain = chain_of(5, 8)
        st.save(chain, list(range(8))).release()
        st.wait_saves()
        self.assertEqual(st.lookup(chain), 8)
        with st.load(chain, list(range(20, 28))) as ld:
            cached, planned = ld.plan()
            self.assertEqual(cached, 8)
            self.assertLess(planned, cached)
            self.assertEqual(ld.wait(), planned)

    def test_larger_struct_from_newer_caller(self):
        # A caller compiled against a later 1.x passes a bigger struct; the
        # library reads only what it knows (the tail must be zero-compatible).
        lib = _lib.lib()
        d = tempfile.mkdtemp(prefix="tutti-pytest-")
        self.addCleanup(shutil.rmtree, d, True)

        class Bigger(ctypes.Structure):
            _fields_ = _lib.tutti_config._fields_ + [("future", ctypes.c_uint64 * 4)]

        arr = (ctypes.c_char_p * 1)(d.encode())
        cfg = Bigger(struct_size=ctypes.sizeof(Bigger), abi_major=1,
                     dirs=ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)), num_dirs=1, path=1,
                     capacity_bytes=64 << 20, layers=2, kv_heads=1, head_dim=64, dtype=2, planes=2,
                     page_tokens=16, chunk_pages=1, layout=1, num_pages=8)
        h = ctypes.c_uint64()
        rc = lib.tutti_open(ctypes.cast(ctypes.byref(cfg), ctypes.POINTER(_lib.tutti_config)), ctypes.byref(h))
        self.assertEqual(rc, 0, tutti.last_error())
        self.assertEqual(lib.tutti_close(h.value), 0, tutti.last_error())


if __name__ == "__main__":
    unittest.main()
