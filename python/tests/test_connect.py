"""Store(connect=...): two engines of a node share one store served by
`tutti serve` (TUTTI_BIN, built by `make python-test`); a prefix one saved is
a hit for the other, restored bit for bit into its own memory."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import tutti

from helpers import HostBuffer

# eval/model's "tiny" profile, what `tutti serve --model tiny` stores.
TINY = tutti.Geometry(layers=2, kv_heads=2, head_dim=64, dtype="bf16", planes=2, page_tokens=16, chunk_pages=32)
PAGES = 4 * TINY.chunk_pages
IO = tutti.IOOptions(staging_bytes=4 << 20, staging_slot_bytes=1 << 20)
DOUBLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_double")


@unittest.skipUnless(os.environ.get("TUTTI_BIN"), "TUTTI_BIN (the tutti command) not set: make python-test sets it")
class ConnectTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tutti-pyserve-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.socket = os.path.join(self.dir, "s.sock")
        self.start()
        self.addCleanup(self.stop)

    def start(self):
        self.proc = subprocess.Popen([os.environ["TUTTI_BIN"], "serve", "--dir", os.path.join(self.dir, "d"),
                                      "--socket", self.socket, "--model", "tiny", "--capacity-blocks", "64"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready = json.loads(self.proc.stdout.readline())
        self.assertEqual(ready["op"], "ready")

    def stop(self):
        self.proc.terminate()
        self.proc.communicate(timeout=30)

    def engine(self):
        st = tutti.Store(connect=self.socket, geometry=TINY, num_pages=PAGES, io=IO)
        bufs = [HostBuffer(TINY.tensor_bytes("per_layer", PAGES)) for _ in range(TINY.layers)]
        self.addCleanup(lambda: [b.close() for b in bufs])
        self.addCleanup(st.close)
        st.register_kv([(b.addr, b.nbytes) for b in bufs])
        return st, bufs

    def page(self, bufs, layer, plane, page):
        off = TINY.page_offset("per_layer", PAGES, layer, plane, page)
        return bytes(bufs[layer].view()[off: off + TINY.page_bytes_per_plane])

    def test_prefix_saved_by_one_engine_loads_in_another(self):
        a, abufs = self.engine()
        b, bbufs = self.engine()
        for i, buf in enumerate(abufs):
            buf.fill_random(7 + i)
        blocks = 3
        chain = tutti.chain_from_tokens(list(range(blocks * TINY.block_tokens)), TINY.block_tokens)
        pages = list(range(blocks * TINY.chunk_pages))
        with a.save(chain, pages) as sv:
            sv.wait_gathered()
        a.wait_saves()
        self.assertEqual(b.lookup(chain), blocks)
        with b.load(chain, pages) as ld:
            self.assertEqual(ld.wait(), blocks)
        for layer in range(TINY.layers):
            for plane in range(TINY.planes):
                for p in pages:
                    self.assertEqual(self.page(bbufs, layer, plane, p), self.page(abufs, layer, plane, p))

    def test_engine_connects_again_after_the_service_was_killed(self):
        """kill -9 of `tutti serve`: the engine fails closed (misses), then,
        once a service is back on the same store, connects again by itself
        and restores what it saved before, bit for bit."""
        a, bufs = self.engine()
        for i, buf in enumerate(bufs):
            buf.fill_random(11 + i)
        blocks = 2
        chain = tutti.chain_from_tokens(list(range(5, 5 + blocks * TINY.block_tokens)), TINY.block_tokens)
        pages = list(range(blocks * TINY.chunk_pages))
        want = [self.page(bufs, l, pl, p) for l in range(TINY.layers) for pl in range(TINY.planes) for p in pages]
        with a.save(chain, pages) as sv:
            sv.wait_gathered()
        a.wait_saves()
        self.proc.kill()
        self.proc.communicate(timeout=30)
        self.assertEqual(a.lookup(chain), 0)
        self.assertFalse(a.stats().service.connected)
        self.start()
        deadline = time.monotonic() + 20
        while a.stats().service.reconnects < 1:
            self.assertLess(time.monotonic(), deadline, a.stats().service)
            time.sleep(0.02)
        self.assertEqual(a.lookup(chain), blocks)
        for buf in bufs:
            buf.fill_random(99)
        with a.load(chain, pages) as ld:
            self.assertEqual(ld.wait(), blocks)
        got = [self.page(bufs, l, pl, p) for l in range(TINY.layers) for pl in range(TINY.planes) for p in pages]
        self.assertEqual(got, want)

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            tutti.Store(["/x"], connect=self.socket, geometry=TINY, num_pages=PAGES)
        with self.assertRaises(tutti.TuttiError):
            tutti.Store(connect=os.path.join(self.dir, "nobody.sock"), geometry=TINY, num_pages=PAGES, io=IO)



class ConnectSettingsTest(unittest.TestCase):
    """kv_connector_extra_config.connect, parsed against vLLM's double
    (tests/vllm_double), whose modules leave with the test."""

    def setUp(self):
        sys.path.insert(0, DOUBLE)
        mods = set(sys.modules)

        def restore():
            sys.path.remove(DOUBLE)
            for m in set(sys.modules) - mods:
                if m == "vllm" or m.startswith("vllm.") or m == "tutti.vllm" or m.startswith("tutti.vllm_"):
                    del sys.modules[m]
        self.addCleanup(restore)
        from tutti.vllm import Settings
        self.parse = Settings.parse

    def test_connect_replaces_dirs_and_capacity(self):
        s = self.parse({"connect": "/run/tutti.sock", "path": "cpu"})
        self.assertEqual((s.connect, s.dirs, s.capacity_bytes), ("/run/tutti.sock", None, None))
        for bad in ({"connect": ""}, {"connect": 1}, {"connect": "/s", "dirs": ["/x"]},
                    {"connect": "/s", "capacity_bytes": 1}, {"connect": "/s", "kv_events": "vllm"},
                    {"connect": "/s", "path": "disk"}):
            with self.assertRaises(ValueError, msg=bad):
                self.parse(bad)
        with self.assertRaisesRegex(ValueError, "unless 'connect'"):
            self.parse({"dirs": ["/x"]})


if __name__ == "__main__":
    unittest.main()
