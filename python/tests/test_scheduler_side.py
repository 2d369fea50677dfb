"""tutti.scheduler_side and tutti.lookup_service without vLLM or torch: the
lookup after local hits and its full-hit rule, allocation after local hits,
the save rule from scheduler-output-shaped objects (chunk by chunk), holds
across a socket with the minimum over two ranks' stores, lookups that never
wait on a slow rank, and the server's parser against garbage (seeded)."""

import os
import random
import shutil
import socket
import tempfile
import threading
import time
import unittest
from types import SimpleNamespace as NS

import tutti
from tutti import lookup_service as ls
from tutti.scheduler_side import LocalMatcher, SchedulerSide

from helpers import SMALL, StoreFixture

BT = SMALL.block_tokens


def chain_of(seed, n):
    return tutti.chain_from_tokens([(seed * 1000003 + i) & 0xFFFFFFFF for i in range(n * BT)], BT)


class FakeMatcher:
    """Answers a fixed number of blocks after skip; records holds."""

    def __init__(self, stored):
        self.stored, self.held, self.released = stored, {}, []

    def match(self, req_id, chain, skip):
        n = max(0, min(self.stored, len(chain)) - skip)
        self.held[req_id] = n
        return n

    def release(self, req_id):
        self.held.pop(req_id, None)
        self.released.append(req_id)


class SchedulerSideTest(unittest.TestCase):
    def test_lookup_alloc_and_full_hit(self):
        m = FakeMatcher(stored=4)
        s = SchedulerSide(m, BT)
        chain = chain_of(1, 5)
        self.assertEqual(s.get_num_new_matched_tokens("r", chain, 5 * BT + 3, 2 * BT), 2 * BT)  # after 2 local blocks
        s.update_state_after_alloc("r", list(range(100, 106)), 2 * BT)
        meta = s.build_meta(NS(num_scheduled_tokens={}))
        self.assertEqual([(x.skip, x.block_ids, len(x.chain)) for x in meta.loads], [(2, [102, 103], 4)])
        m.stored = 5  # every block of a 5-block prompt: the last token is computed
        self.assertEqual(s.get_num_new_matched_tokens("f", chain, 5 * BT, 0), 5 * BT - 1)
        self.assertEqual(s.get_num_new_matched_tokens("p", chain, 5 * BT, 5), 0)  # a partial local block: no hit
        self.assertNotIn("p", m.held)
        s.update_state_after_alloc("f", list(range(5)), 0)  # allocated without the external tokens: released
        self.assertNotIn("f", m.held)
        m.stored = 4
        self.assertEqual(s.get_num_new_matched_tokens("short", chain, 5 * BT + 3, 0), 4 * BT)
        with self.assertRaises(ValueError):  # fewer blocks than the load needs: refused, named
            s.update_state_after_alloc("short", [1, 2], 4 * BT)

    def test_background_loads(self):
        """async_loads: which hits load in the background (True: every one;
        "auto": only beside another live request; False: none), the flag on
        the load, and the bound on background loads not yet reported ended."""
        import tutti.scheduler_side as ss
        chain = chain_of(3, 4)
        for mode, alone, beside in ((False, False, False), (True, True, True), ("auto", False, True)):
            with self.subTest(async_loads=mode):
                s = SchedulerSide(FakeMatcher(stored=4), BT, async_loads=mode)
                s.track("a", chain)
                self.assertEqual(s.get_num_new_matched_tokens("a", chain, 4 * BT + 1, 0), 4 * BT)
                self.assertEqual(s.background("a"), alone)
                s.track("b", chain)
                s.get_num_new_matched_tokens("b", chain, 4 * BT + 1, 0)
                self.assertEqual(s.background("b"), beside)
                s.update_state_after_alloc("b", list(range(5)), 4 * BT)
                self.assertEqual([ld.background for ld in s.build_meta(NS(num_scheduled_tokens={})).loads], [beside])
        s = SchedulerSide(FakeMatcher(stored=4), BT, async_loads=True)
        old, ss.MAX_ASYNC_LOADS = ss.MAX_ASYNC_LOADS, 2
        try:
            for r in ("x", "y", "z"):
                s.get_num_new_matched_tokens(r, chain, 4 * BT + 1, 0)
                s.update_state_after_alloc(r, list(range(5)), 4 * BT)
            self.assertEqual([ld.background for ld in s.build_meta(NS(num_scheduled_tokens={})).loads], [True, True, False])
            self.assertEqual(s.counters["loads_async_cap"], 1)
            s.recv_ended(["x"])  # one reported ended: room for the next
            s.get_num_new_matched_tokens("w", chain, 4 * BT + 1, 0)
            self.assertTrue(s.background("w"))
        finally:
            ss.MAX_ASYNC_LOADS = old
        for bad in ("yes", 1, None):
            with self.assertRaises(ValueError):
                SchedulerSide(FakeMatcher(stored=4), BT, async_loads=bad)

    def test_hit_tokens_count_what_vllm_allocated(self):
        """vLLM asks a waiting request's lookup again every step until it is
        allocated: hit_tokens counts the tokens allocated for, once."""
        s = SchedulerSide(FakeMatcher(stored=4), BT)
        chain = chain_of(2, 5)
        for _ in range(3):  # no room this step, nor the next
            self.assertEqual(s.get_num_new_matched_tokens("w", chain, 5 * BT + 3, 0), 4 * BT)
        self.assertEqual(s.counters["hit_tokens"], 0)
        s.update_state_after_alloc("w", list(range(6)), 4 * BT)
        self.assertEqual((s.counters["hit_tokens"], s.counters["lookups"]), (4 * BT, 3))
        self.assertEqual(s.get_num_new_matched_tokens("n", chain, 5 * BT + 3, 0), 4 * BT)
        s.update_state_after_alloc("n", list(range(6)), 0)  # allocated without them: no hit
        self.assertEqual(s.counters["hit_tokens"], 4 * BT)

    def test_unreachable_matcher_is_a_counted_miss(self):
        class Down:
            def match(self, *a):
                raise ls.LookupUnavailable("down")

            def release(self, req_id):
                pass
        s = SchedulerSide(Down(), BT)
        self.assertEqual(s.get_num_new_matched_tokens("r", chain_of(1, 3), 3 * BT, 0), 0)
        self.assertEqual(s.counters["fallback:LookupUnavailable"], 1)

    def test_saves_chunk_by_chunk(self):
        """Each step that completes full prompt blocks saves the chain up to the
        last of them (blocks allocated step by step, as vLLM allocates them)."""
        s = SchedulerSide(FakeMatcher(0), BT)
        chain = chain_of(2, 3)
        s.track("r", chain)
        new = NS(req_id="r", block_ids=([7, 8],), num_computed_tokens=0)
        m1 = s.build_meta(NS(scheduled_new_reqs=[new], scheduled_cached_reqs=None, num_scheduled_tokens={"r": 2 * BT}))
        self.assertEqual([(x.chain, x.block_ids, x.start) for x in m1.saves], [(chain[:2], [7, 8], 0)])
        self.assertEqual(m1.reused, [7, 8])  # not looked up: every block of it is written afresh
        cached = NS(req_ids=["r"], new_block_ids=[([9, 10],)], num_computed_tokens=[2 * BT], resumed_req_ids=set())
        m2 = s.build_meta(NS(scheduled_new_reqs=[], scheduled_cached_reqs=cached, num_scheduled_tokens={"r": BT + 5}))
        self.assertEqual([(x.chain, x.block_ids, x.start) for x in m2.saves], [(chain, [7, 8, 9], 2)])
        self.assertEqual(m2.reused, [9, 10])
        cached = NS(req_ids=["r"], new_block_ids=[None], num_computed_tokens=[3 * BT + 5], resumed_req_ids=set())
        m3 = s.build_meta(NS(scheduled_new_reqs=[], scheduled_cached_reqs=cached, num_scheduled_tokens={"r": 1}))
        self.assertEqual(m3.saves, [])  # decode: not saved
        m4 = s.build_meta(NS(scheduled_new_reqs=[], scheduled_cached_reqs=None, num_scheduled_tokens={},
                             preempted_req_ids={"r"}))
        self.assertEqual((m4.ended, m4.finished), (["r"], []))  # its queued saves go before its blocks are reused
        # Resumed with new blocks: saved again from them; anything queued from the old ones is dropped.
        cached = NS(req_ids=["r"], new_block_ids=[([1, 2, 3, 4],)], num_computed_tokens=[0], resumed_req_ids={"r"})
        m5 = s.build_meta(NS(scheduled_new_reqs=[], scheduled_cached_reqs=cached, num_scheduled_tokens={"r": 3 * BT + 6}))
        self.assertEqual([(x.block_ids, x.start) for x in m5.saves], [([1, 2, 3], 0)])
        self.assertEqual(m5.dropped, ["r"])
        self.assertEqual(s.request_finished("r"), False)
        m6 = s.build_meta(NS(num_scheduled_tokens={"r": 1}, finished_req_ids={"r"}))
        # finished: its blocks keep its KV until allocated again (reused names them then)
        self.assertEqual((m6.saves, m6.ended, m6.finished, m6.reused), ([], [], ["r"], []))

    def test_kv_roles(self):
        """vLLM's kv_role: a producer's lookups miss (the store is not
        asked, nothing held) and its steps save; a consumer loads and saves
        nothing; kv_both does both. An unknown role is refused, named."""
        from tutti.vllm_settings import kv_role_parts
        chain = chain_of(5, 3)
        for role, hit, saved in (("kv_both", 2 * BT, 1), ("kv_producer", 0, 1), ("kv_consumer", 2 * BT, 0)):
            with self.subTest(role=role):
                loads, saves = kv_role_parts(role)
                m = FakeMatcher(stored=2)
                s = SchedulerSide(m, BT, loads=loads, saves=saves)
                s.track("r", chain)
                self.assertEqual(s.get_num_new_matched_tokens("r", chain, 3 * BT + 1, 0), hit)
                self.assertEqual("r" in m.held, bool(hit))
                s.update_state_after_alloc("r", [4, 5, 6, 7], hit)
                new = NS(req_id="r", block_ids=([4, 5, 6, 7],), num_computed_tokens=hit)
                meta = s.build_meta(NS(scheduled_new_reqs=[new], scheduled_cached_reqs=None,
                                       num_scheduled_tokens={"r": 3 * BT + 1 - hit}))
                self.assertEqual(len(meta.loads), int(bool(hit)))
                self.assertEqual(len(meta.saves), saved)
        with self.assertRaisesRegex(ValueError, "kv_role = 'kv_bogus'"):
            kv_role_parts("kv_bogus")
        with self.assertRaisesRegex(ValueError, "kv_role = None"):
            kv_role_parts(None)

    def test_reused_blocks(self):
        """The blocks a step writes afresh: a new request's beyond the
        engine's own hit (tutti's load into them included), a running one's
        new blocks, all of one never looked up; none for a hybrid model (its
        finished requests end in the step)."""
        s = SchedulerSide(FakeMatcher(3), BT)
        chain = chain_of(3, 5)
        s.track("r", chain)
        self.assertEqual(s.get_num_new_matched_tokens("r", chain, 5 * BT, BT), 2 * BT)  # 1 local block, 2 of tutti's
        s.update_state_after_alloc("r", [5, 6, 7, 8, 9], 2 * BT)
        new = [NS(req_id="r", block_ids=([5, 6, 7, 8, 9],), num_computed_tokens=3 * BT),
               NS(req_id="u", block_ids=([1, 2],), num_computed_tokens=BT)]
        cached = NS(req_ids=["q"], new_block_ids=[([11],)], num_computed_tokens=[4 * BT], resumed_req_ids=set())
        m = s.build_meta(NS(scheduled_new_reqs=new, scheduled_cached_reqs=cached, finished_req_ids={"f"},
                            num_scheduled_tokens={"r": 2 * BT, "u": BT, "q": 1}))
        self.assertEqual([x.block_ids for x in m.loads], [[6, 7]])
        self.assertEqual(sorted(set(m.reused)), [1, 2, 6, 7, 8, 9, 11])  # 5: the engine's own hit, only read
        self.assertEqual((m.ended, m.finished), ([], ["f"]))
        from tutti.groups import GroupRule
        h = SchedulerSide(FakeMatcher(0), BT, rules=[GroupRule("full", BT), GroupRule("sliding", BT, window_tokens=2 * BT)])
        m = h.build_meta(NS(scheduled_new_reqs=[NS(req_id="u", block_ids=([1], [2]), num_computed_tokens=0)],
                            scheduled_cached_reqs=None, finished_req_ids={"f"}, num_scheduled_tokens={"u": BT}))
        self.assertEqual((m.ended, m.finished, m.reused), (["f"], [], []))

    def test_save_carries_tokens_and_engine_hashes(self):
        """For KV events: the save of a tracked request carries its prompt's
        tokens of the saved blocks and the engine's hash bytes per block."""
        s = SchedulerSide(FakeMatcher(0), BT)
        chain = chain_of(3, 2)
        req = NS(tokens=list(range(2 * BT + 3)), hashes=[b"a" * 32, b"b" * 32])
        s.track("r", chain, req, tokens_of=lambda r: r.tokens, hashes_of=lambda r: r.hashes)
        new = NS(req_id="r", block_ids=([4, 5, 6],), num_computed_tokens=0)
        m = s.build_meta(NS(scheduled_new_reqs=[new], scheduled_cached_reqs=None, num_scheduled_tokens={"r": 2 * BT + 3}))
        self.assertEqual([(x.chain, x.tokens, x.hashes) for x in m.saves], [(chain, list(range(2 * BT)), req.hashes)])
        s2 = SchedulerSide(FakeMatcher(0), BT)  # without them: neither is sent
        s2.track("r", chain)
        m = s2.build_meta(NS(scheduled_new_reqs=[new], scheduled_cached_reqs=None, num_scheduled_tokens={"r": 2 * BT + 3}))
        self.assertEqual([(x.tokens, x.hashes) for x in m.saves], [(None, None)])

    def test_never_more_than_the_prompt(self):
        """The chain keys the prompt's blocks: a request whose tokens go past
        its prompt (outputs, after a preemption) is never promised more."""
        s = SchedulerSide(FakeMatcher(stored=10), BT)
        chain = chain_of(4, 4)  # a 64-token prompt
        self.assertEqual(s.get_num_new_matched_tokens("r", chain, 4 * BT + 5, 0), 4 * BT)
        self.assertEqual(s.get_num_new_matched_tokens("r", chain, 4 * BT, 0), 4 * BT - 1)


class SlowMatcher:
    """A rank's matcher that answers after ``delay_s`` (forever: never)."""

    def __init__(self, inner, delay_s):
        self.inner, self.delay_s = inner, delay_s
        self.gate = threading.Event()

    def match(self, req_id, chain, skip):
        self.gate.wait(self.delay_s)
        return self.inner.match(req_id, chain, skip)

    def release(self, req_id):
        self.inner.release(req_id)


class LookupServiceTest(unittest.TestCase):
    def setUp(self):
        self.sock_dir = tempfile.mkdtemp(prefix="tutti-sock-")
        self.addCleanup(shutil.rmtree, self.sock_dir, True)

    def rank(self, r, blocks):
        fx = StoreFixture()
        self.addCleanup(fx.close)
        fx.store.register_kv(fx.regions())
        chain = chain_of(5, 6)
        with fx.store.save(chain[:blocks], list(range(blocks))) as sv:
            sv.wait_gathered()
        fx.store.wait_saves()
        m = LocalMatcher(fx.store, ttl_ms=60000)
        srv = ls.LookupServer(ls.socket_path(self.sock_dir, "k", r), m)
        self.addCleanup(srv.close)
        return fx, m, chain

    def test_minimum_over_ranks_and_holds(self):
        fx0, m0, chain = self.rank(0, 5)
        fx1, m1, _ = self.rank(1, 3)
        paths = [ls.socket_path(self.sock_dir, "k", r) for r in range(2)]
        self.assertIsNone(ls.wait_for(paths, 5))
        rm = ls.RemoteMatcher(paths, timeout_s=5)
        self.addCleanup(rm.close)
        self.assertEqual(rm.match("a", chain, 1), 2)  # rank 1 has 3 blocks: 2 after the local one
        self.assertEqual(set(m0._holds), {"a"})
        self.assertEqual(set(m1._holds), {"a"})
        rm.release("a")  # queued to each rank's connection: done once a later call is answered
        self.assertEqual(rm.match("b", chain, 3), 0)  # rank 1 has nothing after 3: no hold anywhere
        self.assertEqual(rm.match("c", chain, 5), 0)  # nothing past the chain
        self.assertEqual((m0._holds, m1._holds), ({}, {}))

    def test_a_slow_rank_never_stalls_the_scheduler(self):
        """The first lookup sends the query and answers None (ask again);
        later ones give the answer once every rank gave it; a rank that does
        not answer within the timeout makes it a miss, counted."""
        fx0, m0, chain = self.rank(0, 5)
        fx1 = StoreFixture()
        self.addCleanup(fx1.close)
        fx1.store.register_kv(fx1.regions())
        with fx1.store.save(chain[:3], [0, 1, 2]) as sv:
            sv.wait_gathered()
        fx1.store.wait_saves()
        slow = SlowMatcher(LocalMatcher(fx1.store, ttl_ms=60000), delay_s=3600)
        srv = ls.LookupServer(ls.socket_path(self.sock_dir, "k", 1), slow)
        self.addCleanup(srv.close)
        self.addCleanup(slow.gate.set)
        paths = [ls.socket_path(self.sock_dir, "k", r) for r in range(2)]
        rm = ls.RemoteMatcher(paths, timeout_s=10)
        self.addCleanup(rm.close)
        s = SchedulerSide(rm, BT)
        self.assertIsNone(s.get_num_new_matched_tokens("a", chain, 5 * BT + 1, BT))  # rank 1 holds it back
        self.assertIsNone(s.get_num_new_matched_tokens("a", chain, 5 * BT + 1, BT))
        slow.gate.set()  # rank 1 answers now
        got = None
        for _ in range(5000):
            got = s.get_num_new_matched_tokens("a", chain, 5 * BT + 1, BT)
            if got is not None:
                break
            time.sleep(0.002)
        self.assertEqual(got, 2 * BT)  # the minimum: rank 1 has 3 blocks, 2 after the local one
        self.assertGreaterEqual(s.counters["lookups_deferred"], 2)
        # A rank that never answers: None until the timeout, then a miss.
        slow.gate.clear()
        clock = [0.0]
        rm2 = ls.RemoteMatcher(paths, timeout_s=0.5, clock=lambda: clock[0])
        self.addCleanup(rm2.close)
        s2 = SchedulerSide(rm2, BT)
        self.assertIsNone(s2.get_num_new_matched_tokens("b", chain, 5 * BT + 1, 0))
        clock[0] = 1.0  # past the timeout
        self.assertEqual(s2.get_num_new_matched_tokens("b", chain, 5 * BT + 1, 0), 0)
        self.assertEqual(s2.counters["fallback:LookupTimeout"], 1)

    def test_a_rank_down_is_unavailable(self):
        self.rank(0, 2)
        rm = ls.RemoteMatcher([ls.socket_path(self.sock_dir, "k", 0), os.path.join(self.sock_dir, "nobody.sock")], timeout_s=1)
        self.addCleanup(rm.close)
        with self.assertRaises(ls.LookupUnavailable):
            rm.match("a", chain_of(5, 2), 0)

    def test_garbage_is_answered(self):
        _, m, chain = self.rank(0, 2)
        rng = random.Random(int(os.environ.get("TUTTI_FUZZ_SEED", "7")))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(s.close)
        s.settimeout(5)
        s.connect(ls.socket_path(self.sock_dir, "k", 0))
        f = s.makefile("rwb")
        self.addCleanup(f.close)
        samples = [b"{}", b"[1,2]", b'{"op":"match"}', b'{"op":"match","req":"x","chain":["a"],"skip":0}',
                   b'{"op":"match","req":"x","chain":[1],"skip":-1}', b'{"op":"zap"}', b"\xff\xfe"]
        samples += [bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 64))).replace(b"\n", b" ") for _ in range(200)]
        for line in samples:
            f.write(line + b"\n")
            f.flush()
            ans = f.readline()
            self.assertTrue(ans.startswith(b'{"error"') or ans.startswith(b'{"blocks"') or ans == b"{}\n", (line, ans))
        f.write(b'{"op":"match","req":"ok","chain":%s,"skip":0}\n' % str(chain).encode())
        f.flush()
        self.assertEqual(f.readline(), b'{"blocks": 2}\n')  # the server still serves


if __name__ == "__main__":
    unittest.main()
