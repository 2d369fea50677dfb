"""Store.stats(): runtime.Stats nested as Go nests it (tutti_get_stats_json),
and the flat tutti_stats of ABI 1.0 agreeing with it. That every Go field
reaches Python with its value is runtime/capi's TestStatsReachPython."""

import ctypes
import json
import unittest

import tutti
from tutti import _lib
from tutti.stats import StatsGroup, parse

from helpers import SMALL, StoreFixture

GROUPS = ["path", "lookups", "holds", "loads", "saves", "index", "map", "sched", "events", "gpu", "devices", "prewrite", "service"]

# Each field of the flat tutti_stats: its group and key in the nested stats
# (a cause count: the sum over its causes).
FLAT = {
    "lookups": ("lookups", "calls"), "lookup_blocks": ("lookups", "asked_blocks"), "hit_blocks": ("lookups", "hit_blocks"),
    "loads": ("loads", "calls"), "cached_blocks": ("loads", "cached_blocks"), "planned_blocks": ("loads", "planned_blocks"),
    "restored_blocks": ("loads", "restored_blocks"), "restored_bytes": ("loads", "restored_bytes"),
    "read_ios": ("loads", "read_ios"), "split_ios": ("loads", "split_ios"), "overread_bytes": ("loads", "overread_bytes"),
    "miss_blocks": ("loads", "miss_blocks"), "saves": ("saves", "calls"), "save_blocks": ("saves", "asked_blocks"),
    "saved_blocks": ("saves", "saved_blocks"), "saved_bytes": ("saves", "saved_bytes"), "write_ios": ("saves", "write_ios"),
    "committed_runs": ("saves", "committed_runs"), "corrupt_dropped": ("loads", "corrupt_dropped_runs"),
    "skipped_blocks": ("saves", "skipped_blocks"), "fallbacks": ("path", "fallbacks"),
}


def chain_of(seed, n):
    return tutti.chain_from_tokens([seed * 1000 + i for i in range(n * SMALL.block_tokens)], SMALL.block_tokens)


class StatsTest(unittest.TestCase):
    def setUp(self):
        self.fx = StoreFixture()
        self.addCleanup(self.fx.close)
        st = self.st = self.fx.store
        st.register_kv(self.fx.regions())
        chain = chain_of(5, 3)
        with st.save(chain, [0, 1, 2]) as sv:
            sv.wait_gathered()
        with st.save(chain[:1], [0]) as sv:  # stored: skipped as cached
            sv.wait_gathered()
        st.wait_saves()
        self.assertEqual(st.lookup(chain), 3)
        with st.load(chain, [10, 11, 12]) as ld:
            self.assertEqual(ld.wait(), 3)

    def test_nested(self):
        s = self.st.stats()
        self.assertIsInstance(s, StatsGroup)
        self.assertEqual(list(vars(s)), GROUPS)
        self.assertEqual(s.path.used, "cpu")
        self.assertEqual((s.lookups.calls, s.lookups.asked_blocks, s.lookups.hit_blocks), (1, 3, 3))
        self.assertEqual((s.saves.calls, s.saves.asked_blocks, s.saves.saved_blocks, s.saves.committed_runs), (2, 4, 3, 1))
        self.assertEqual(vars(s.saves.skipped_blocks),
                         dict(cached=1, no_space=0, budget=0, enospc=0, io_error=0, closed=0, bound=0))
        self.assertEqual((s.loads.calls, s.loads.restored_blocks, s.loads.miss_blocks.crc), (1, 3, 0))
        self.assertEqual(list(vars(s.loads.miss_blocks)), ["io_error", "short_read", "crc", "not_found", "closed", "gpu"])
        self.assertEqual((s.index.blocks, s.map.live_runs, s.holds.live), (3, 1, 0))
        # States are enum names, with their reasons beside them.
        self.assertIn(s.prewrite.state, ("off", "running", "done", "stopped"))
        self.assertIsInstance(s.prewrite.reason, str)
        self.assertEqual((s.gpu.read_mode, s.gpu.ring), ("unbound", "unbound"))
        causes = ("none",) if s.loads.staged_reads == 0 else ("no-iovecs", "unaligned", "iovec-cap")
        self.assertIn(s.loads.staged_cause, causes)
        self.assertEqual(len(s.devices.probes), 1)
        self.assertIn(s.devices.probes[0].state, ("configured", "measured", "seeded"))
        self.assertIsInstance(s.gpu.reads.unread, list)
        self.assertFalse(s.events.enabled)
        # Plain dicts for json.dumps, and back.
        self.assertEqual(parse(json.dumps(s.as_dict())), s)

    def test_flat_struct_agrees(self):
        self.assertEqual(set(FLAT), set(_lib.STATS_FIELDS))
        flat = _lib.tutti_stats(struct_size=ctypes.sizeof(_lib.tutti_stats))
        _lib.check(_lib.lib().tutti_get_stats(self.st.handle, ctypes.byref(flat)), "tutti_get_stats")
        s = self.st.stats()
        for name, (group, key) in FLAT.items():
            v = getattr(getattr(s, group), key)
            if isinstance(v, StatsGroup):
                v = sum(vars(v).values())
            self.assertEqual(getattr(flat, name), v, name)

    def test_parse(self):
        s = parse(b'{"a": {"b": [{"c": 1}], "d": "x"}}')
        self.assertEqual((s.a.b[0].c, s.a.d), (1, "x"))
        self.assertEqual(s.as_dict(), {"a": {"b": [{"c": 1}], "d": "x"}})
        with self.assertRaises(ValueError):
            parse("[1]")


if __name__ == "__main__":
    unittest.main()
