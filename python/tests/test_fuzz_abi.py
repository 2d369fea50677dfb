"""Seeded random calls into the C ABI with arguments that are wrong in every
way the library can detect (handles, counts, enums, page ids, layers), on a
live store: every call returns a known status, never crashes, and the store
still round-trips afterwards. TUTTI_FUZZ_SEED=N reruns one seed."""

import ctypes
import os
import random
import sys
import time
import unittest

import tutti
from tutti import _lib

from helpers import NUM_PAGES, SMALL, StoreFixture

BUF = 64  # elements in every array handed to the library


class FuzzABITest(unittest.TestCase):
    def test_random_calls(self):
        seed = int(os.environ.get("TUTTI_FUZZ_SEED", time.time_ns() % 1000003))
        sys.stderr.write(f"[fuzz seed={seed}] ")  # shown even if the process dies
        sys.stderr.flush()
        rnd = random.Random(seed)
        fx = StoreFixture()
        self.addCleanup(fx.close)
        st, lib = fx.store, _lib.lib()
        st.register_kv(fx.regions())
        known = set(_lib._STATUS_NAMES)
        chain = (ctypes.c_uint64 * BUF)()
        pages = (ctypes.c_int32 * BUF)()
        toks = (ctypes.c_uint32 * BUF)()
        out64, out32a, out32b = ctypes.c_uint64(), ctypes.c_uint32(), ctypes.c_uint32()
        st32 = ctypes.c_int32()
        stats = _lib.tutti_stats()
        recov = _lib.tutti_recovery()
        regions = (_lib.tutti_kv_region * BUF)()
        live = []  # (kind, handle) issued during the run

        def count(limit=None):
            # A count describes the array passed with it: the library can only
            # refuse one above its limit (or inconsistent with another count),
            # so a wrong count stays within the buffer or exceeds the limit.
            if limit is None or rnd.random() < 0.8:
                return rnd.randrange(BUF + 1)
            return rnd.choice((limit + 1, 0xFFFFFFFF))

        def handle():
            r = rnd.random()
            if r < 0.5:
                return st.handle
            if r < 0.7 and live:
                return rnd.choice(live)[1]
            return rnd.choice((0, 1, rnd.getrandbits(64), (rnd.randrange(1, 4) << 56) | rnd.getrandbits(20)))

        def fill():
            for i in range(BUF):
                chain[i] = rnd.getrandbits(64) if rnd.random() < 0.5 else rnd.randrange(1, 8)
                pages[i] = rnd.randrange(-3, NUM_PAGES + 3)
                toks[i] = rnd.getrandbits(32)
                regions[i].addr = rnd.choice((0, fx.bufs[0].addr, fx.bufs[0].addr + 8, rnd.getrandbits(64) & ~15))
                regions[i].len_bytes = rnd.choice((0, fx.bufs[0].nbytes, rnd.getrandbits(64)))

        calls = [
            lambda: lib.tutti_lookup(handle(), chain, count(1 << 20), ctypes.byref(out32a)),
            lambda: lib.tutti_load(handle(), chain, count(1 << 20), pages, count(1 << 24), ctypes.byref(out64)),
            lambda: lib.tutti_save(handle(), chain, count(1 << 20), pages, count(1 << 24), ctypes.byref(out64)),
            lambda: lib.tutti_load_wait_layer(handle(), rnd.randrange(-2, SMALL.layers + 2)),
            lambda: lib.tutti_load_stream_wait_layer(handle(), rnd.randrange(-2, SMALL.layers + 2), 0),
            lambda: lib.tutti_load_wait(handle(), ctypes.byref(out32a)),
            lambda: lib.tutti_load_plan(handle(), ctypes.byref(out32a), ctypes.byref(out32b)),
            lambda: lib.tutti_load_release(handle()),
            lambda: lib.tutti_load_failure(handle(), ctypes.byref(st32)),
            lambda: lib.tutti_load_done(handle(), ctypes.byref(st32)),
            lambda: lib.tutti_load_done(handle(), None),
            lambda: lib.tutti_save_gathered(handle(), ctypes.byref(st32)),
            lambda: lib.tutti_save_gathered(handle(), None),
            lambda: lib.tutti_save_wait_gathered(handle()),
            lambda: lib.tutti_save_release(handle()),
            lambda: lib.tutti_register_kv(handle(), rnd.randrange(4), regions, count(1 << 16)),
            lambda: lib.tutti_get_stats(handle(), ctypes.byref(stats)),
            lambda: lib.tutti_get_recovery(handle(), ctypes.byref(recov)),
            lambda: lib.tutti_chain_from_tokens(toks, count(), rnd.choice((0, 1, 7, 16, 1 << 21)), rnd.getrandbits(64),
                                                chain, count(), ctypes.byref(out32a)),
            lambda: lib.tutti_take_kv_events(handle(), ctypes.cast(toks, ctypes.POINTER(ctypes.c_uint8)),
                                             rnd.choice((0, 8, 4 * BUF)), ctypes.byref(out64), ctypes.byref(out32a),
                                             ctypes.byref(out32b)),
            lambda: lib.tutti_get_stats_json(handle(), rnd.choice((None, ctypes.cast(toks, ctypes.c_char_p))),
                                             rnd.choice((0, 8, 4 * BUF)), ctypes.byref(out64)),
        ]
        for i in range(3000):
            fill()
            stats.struct_size = rnd.choice((0, 8, ctypes.sizeof(stats)))
            recov.struct_size = rnd.choice((0, 8, ctypes.sizeof(recov)))
            k = rnd.randrange(len(calls))
            out64.value = 0
            rc = calls[k]()
            self.assertIn(rc, known, f"seed={seed} call {i}: function #{k} returned unknown status {rc}")
            self.assertNotEqual(rc, tutti.Internal.code, f"seed={seed} call {i}: #{k}: {tutti.last_error()}")
            if rc == 0 and k in (1, 2) and out64.value:
                live.append(("load" if k == 1 else "save", out64.value))
        for kind, h in live:  # whatever is still live is released cleanly
            fn = lib.tutti_load_release if kind == "load" else lib.tutti_save_release
            self.assertIn(fn(h), (0, tutti.BadHandle.code), f"seed={seed}")
        # The store still works.
        c = tutti.chain_from_tokens(list(range(2 * SMALL.block_tokens)), SMALL.block_tokens, seed=seed)
        with st.save(c, [1, 2]) as sv:
            sv.wait_gathered()
        st.wait_saves()
        with st.load(c, [30, 31]) as ld:
            self.assertEqual(ld.wait(), 2, f"seed={seed}")
        for l in range(SMALL.layers):
            self.assertEqual(fx.page_bytes(l, 0, 30), fx.page_bytes(l, 0, 1), f"seed={seed}")


if __name__ == "__main__":
    unittest.main()
