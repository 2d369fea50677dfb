"""tutti.hfcache: transformers' (batch, kv_heads, tokens, head_dim) caches
mapped to and from tutti's page pool, and the block table. Needs torch (CPU
tensors are enough); skips with a message where it is missing."""

import unittest

try:
    import torch
except ImportError:
    torch = None

from tutti import hfcache


class BlockTableTest(unittest.TestCase):
    def test_allocate_free(self):
        t = hfcache.BlockTable(8, 16)
        a = t.allocate(33)  # 3 pages, the last partly used
        self.assertEqual(a, [0, 1, 2])
        b = t.allocate(16 * 5)
        self.assertEqual(b, [3, 4, 5, 6, 7])
        with self.assertRaisesRegex(MemoryError, "1 tokens need 1 pages, 0 of 8 are free"):
            t.allocate(1)
        t.free(a)
        self.assertEqual(t.free_pages, 3)
        with self.assertRaisesRegex(ValueError, "page 0 is not allocated"):
            t.free([0])
        self.assertEqual(sorted(t.allocate(48)), [0, 1, 2])

    def test_bad_sizes(self):
        with self.assertRaises(ValueError):
            hfcache.BlockTable(0, 16)
        with self.assertRaises(ValueError):
            hfcache.BlockTable(4, 16).allocate(-1)


@unittest.skipIf(torch is None, "torch is not installed (Debian: python3-torch, seen by /usr/bin/python3)")
class MappingTest(unittest.TestCase):
    H, D, T, PT, N = 4, 8, 40, 16, 6

    def cache(self, seed):
        g = torch.Generator().manual_seed(seed)
        k = torch.randn(1, self.H, self.T, self.D, generator=g).to(torch.bfloat16)
        v = torch.randn(1, self.H, self.T, self.D, generator=g).to(torch.bfloat16)
        return k, v

    def pool(self):
        return torch.full((2, self.N, self.PT, self.H, self.D), 9.0, dtype=torch.bfloat16)

    def test_round_trip_scattered_pages(self):
        for pages in ([0, 1, 2], [5, 1, 3]):  # a run and scattered pages
            with self.subTest(pages=pages):
                k, v = self.cache(1)
                pool = self.pool()
                n = 37  # a partial last page
                hfcache.cache_to_pages(k, v, pool, pages, n)
                # page i, token j, head h == cache[0, h, i*16+j]
                for i, p in enumerate(pages):
                    for j in range(self.PT):
                        t = i * self.PT + j
                        want_k = k[0, :, t, :] if t < n else torch.zeros(self.H, self.D, dtype=torch.bfloat16)
                        self.assertTrue(torch.equal(pool[0, p, j], want_k), (p, j))
                untouched = [p for p in range(self.N) if p not in pages]
                self.assertTrue(torch.all(pool[:, untouched] == 9.0))
                k2, v2 = torch.zeros_like(k), torch.zeros_like(v)
                hfcache.pages_to_cache(pool, pages, k2, v2, n)
                self.assertTrue(torch.equal(k2[:, :, :n], k[:, :, :n]))
                self.assertTrue(torch.equal(v2[:, :, :n], v[:, :, :n]))
                self.assertTrue(torch.all(k2[:, :, n:] == 0))

    def test_mismatches_name_the_problem(self):
        k, v = self.cache(2)
        pool = self.pool()
        cases = [
            ((k, v[..., :4], pool, [0, 1, 2], 40), "differ"),
            ((k, v, pool[:, :, :, :2], [0, 1, 2], 40), "4 heads of 8, the pool 2 of 8"),
            ((k, v, pool, [0, 1], 40), "40 tokens need 3 pages of 16, got 2"),
            ((k, v, pool, [0, 1, 6], 40), r"page ids \[6\] outside the pool's 6 pages"),
            ((k, v, pool, [0, 1, 2], 41), "41 tokens, the cache holds 40"),
            ((k, v, pool.float(), [0, 1, 2], 40), "dtype"),
            ((k.repeat(2, 1, 1, 1), v.repeat(2, 1, 1, 1), pool, [0, 1, 2], 40), "batch 2"),
        ]
        for a, msg in cases:
            with self.subTest(msg=msg):
                with self.assertRaisesRegex(hfcache.LayoutError, msg):
                    hfcache.cache_to_pages(*a, name="layer 3")


if __name__ == "__main__":
    unittest.main()


@unittest.skipIf(torch is None, "torch is not installed (Debian: python3-torch, seen by /usr/bin/python3)")
class FilledTokensTest(unittest.TestCase):
    """set_filled_tokens: the counters transformers' cache layers append at."""

    def test_tensor_counter_in_place(self):
        class Layer:  # transformers 5's StaticLayer: a tensor counter, static address
            cumulative_length = torch.tensor(0)

        layer = Layer()
        counter = layer.cumulative_length
        hfcache.set_filled_tokens(layer, 1024)
        self.assertIs(layer.cumulative_length, counter)
        self.assertEqual(int(counter), 1024)

    def test_sliding_window_int_counter(self):
        class Layer:
            def __init__(self):
                self.cumulative_length = torch.tensor(3)
                self.cumulative_length_int = 3

        layer = Layer()
        hfcache.set_filled_tokens(layer, 48)
        self.assertEqual((int(layer.cumulative_length), layer.cumulative_length_int), (48, 48))

    def test_no_counter_and_bad_count(self):
        class Old:  # writes at cache_position: nothing to set
            pass

        layer = Old()
        hfcache.set_filled_tokens(layer, 16)
        self.assertFalse(hasattr(layer, "cumulative_length"))
        with self.assertRaisesRegex(ValueError, "n_tokens = -1"):
            hfcache.set_filled_tokens(layer, -1)
