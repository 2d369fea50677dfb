"""ABI 1.2 through Python: a load after the engine's local hits
(Store.load_with), the scheduler's lookup that holds what it promised
(Store.match), and the tensor-parallel rank of a store (tp_rank/tp_size)."""

import shutil
import tempfile
import unittest

import tutti

from helpers import SMALL, StoreFixture


def chain_of(seed, n):
    return tutti.chain_from_tokens([(seed * 1000003 + i) & 0xFFFFFFFF for i in range(n * SMALL.block_tokens)],
                                   SMALL.block_tokens)


class LoadWithTest(unittest.TestCase):
    def setUp(self):
        self.fx = StoreFixture()
        self.addCleanup(self.fx.close)
        self.st = self.fx.store
        self.st.register_kv(self.fx.regions())
        for i, b in enumerate(self.fx.bufs):
            b.fill_random(77 + i)

    def saved(self, chain, pages):
        with self.st.save(chain, pages) as sv:
            sv.wait_gathered()
            self.assertTrue(sv.gathered())  # polled, never blocking: once waited for, it says so
        self.st.wait_saves()
        g = SMALL
        return {(l, pl, i): self.fx.page_bytes(l, pl, p) for l in range(g.layers) for pl in range(g.planes)
                for i, p in enumerate(pages)}

    def test_skip_leaves_local_pages_alone(self):
        chain = chain_of(1, 6)
        want = self.saved(chain, list(range(0, 6)))
        local = [20, 21]  # the engine's own copies of blocks 0 and 1
        before = {(l, pl, i): self.fx.page_bytes(l, pl, p) for l in range(SMALL.layers)
                  for pl in range(SMALL.planes) for i, p in enumerate(local)}
        dst = [30, 31, 32, 33]
        with self.st.load_with(chain, dst, skip=2, promised=True) as ld:
            self.assertEqual(ld.plan(), (4, 4))
            self.assertEqual(ld.wait(), 4)
        for (l, pl, i), w in want.items():
            if i >= 2:
                self.assertEqual(self.fx.page_bytes(l, pl, dst[i - 2]), w, f"layer {l} plane {pl} block {i}")
        for (l, pl, i), w in before.items():
            self.assertEqual(self.fx.page_bytes(l, pl, local[i]), w, "a skipped block's page was written")
        with self.assertRaises(tutti.InvalidArgument):
            self.st.load_with(chain, [], skip=6)
        with self.assertRaises(tutti.GeometryMismatch):
            self.st.load_with(chain, dst, skip=1)  # 5 blocks after skip need 5 pages

    def test_match_counts_after_skip_and_holds(self):
        chain = chain_of(2, 4)
        self.saved(chain, [0, 1, 2, 3])
        longer = chain + chain_of(3, 2)[1:]
        with self.st.match(longer, skip=1, ttl_ms=60000) as h:
            self.assertEqual(h.blocks, 3)
        with self.st.match(longer, skip=4) as h:
            self.assertEqual(h.blocks, 0)
        with self.st.match(chain_of(9, 3)) as h:
            self.assertEqual(h.blocks, 0)
        for bad in (dict(skip=6), dict(ttl_ms=0)):
            with self.assertRaises(tutti.InvalidArgument):
                self.st.match(longer, **bad)
        h = self.st.match(chain)
        raw = h.handle
        h.release()
        with self.assertRaises(tutti.BadHandle):  # released once only
            tutti._lib.check(self.st._lib.tutti_hold_release(raw), "tutti_hold_release")


class TPRankTest(unittest.TestCase):
    def test_rank_marker_refuses_another_rank(self):
        d = tempfile.mkdtemp(prefix="tutti-pytest-")
        self.addCleanup(shutil.rmtree, d, True)
        g = SMALL  # 2 KV heads: one per rank at tp_size 2
        tutti.Store([d], 64 << 20, g, 8, tp_rank=1, tp_size=2).close()
        tutti.Store([d], 64 << 20, g, 8, tp_rank=1, tp_size=2).close()  # the same rank reopens
        with self.assertRaises(tutti.GeometryMismatch) as cm:
            tutti.Store([d], 64 << 20, g, 8, tp_rank=0, tp_size=2)
        self.assertIn("rank 1 of 2", str(cm.exception))
        with self.assertRaises(tutti.GeometryMismatch):  # 2 heads do not split over 4 ranks
            tutti.Store([d], 64 << 20, g, 8, tp_rank=0, tp_size=4)


if __name__ == "__main__":
    unittest.main()
