"""Several Python threads on one store (ctypes drops the GIL, so the calls
really run concurrently in the library), and a close racing with users."""

import ctypes
import dataclasses
import threading
import unittest

import tutti

from helpers import SMALL_IO, StoreFixture, SMALL


class ConcurrencyTest(unittest.TestCase):
    def test_threads_round_trip(self):
        fx = StoreFixture(num_pages=128, io=dataclasses.replace(SMALL_IO, max_loads=8))
        self.addCleanup(fx.close)
        st = fx.store
        st.register_kv(fx.regions())
        for i, b in enumerate(fx.bufs):
            b.fill_random(500 + i)
        g = SMALL
        errors = []

        def worker(w):
            try:
                chain = tutti.chain_from_tokens([w * 100000 + i for i in range(4 * g.block_tokens)], g.block_tokens)
                src = [w * 16 + i for i in range(4)]
                dst = [w * 16 + 8 + i for i in range(4)]
                with st.save(chain, src) as sv:
                    sv.wait_gathered()
                st.wait_saves()
                if st.lookup(chain) != 4:
                    errors.append(f"worker {w}: lookup {st.lookup(chain)}")
                for _ in range(3):
                    with st.load(chain, dst) as ld:
                        n = ld.wait()
                    if n != 4:
                        errors.append(f"worker {w}: restored {n} blocks")
                    for l in range(g.layers):
                        for pl in range(g.planes):
                            for s, d in zip(src, dst):
                                if fx.page_bytes(l, pl, s) != fx.page_bytes(l, pl, d):
                                    errors.append(f"worker {w}: layer {l} plane {pl} page {d} differs")
            except Exception as e:  # reported below with the worker's id
                errors.append(f"worker {w}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])

    def test_close_races_with_calls(self):
        fx = StoreFixture()
        self.addCleanup(fx.close)
        st = fx.store
        st.register_kv(fx.regions())
        chain = tutti.chain_from_tokens(list(range(2 * SMALL.block_tokens)), SMALL.block_tokens)
        h = st.handle
        lib = st._lib
        arr = (ctypes.c_uint64 * 2)(*chain)
        seen = set()
        start = threading.Barrier(3)

        def user():
            start.wait()
            for _ in range(300):
                out = ctypes.c_uint32()
                seen.add(lib.tutti_lookup(h, arr, 2, ctypes.byref(out)))

        users = [threading.Thread(target=user) for _ in range(2)]
        for t in users:
            t.start()
        start.wait()
        st.close()
        for t in users:
            t.join()
        # Each call either ran (OK) or found the handle gone; nothing else.
        self.assertTrue(seen <= {0, tutti.BadHandle.code, tutti.Closed.code}, seen)


if __name__ == "__main__":
    unittest.main()
