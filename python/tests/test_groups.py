"""tutti.groups (hybrid models: several KV cache groups per chain block): the
rules, table-driven; the versioned groups.json; and the scheduler side, the
group workers and the hybrid store driven by a double of vLLM's hybrid KV
cache manager (full attention, a sliding window whose blocks it frees as the
window passes, Mamba state in "align" mode), in-process on the CPU path, with
the dense tests' cases: a miss, a prompt saved chunk by chunk, a hit, a hit
cut where a group's part is missing, a local hit, a prompt of whole blocks,
metadata through pickle, both start_load orders, a new store process that
hits again. Every restored page is compared with what was computed."""

import json
import os
import pickle
import shutil
import tempfile
import time
import unittest
from types import SimpleNamespace

import tutti
from tutti import groups
from tutti.group_worker import GroupWorkers
from tutti.groups import GroupRule, HybridStore
from tutti.scheduler_side import LocalMatcher, SchedulerSide

try:
    import torch
except ImportError:
    torch = None

NO_TORCH = "torch is not installed for this interpreter (Debian's python3-torch serves /usr/bin/python3)"
B, NB, H, D, W = 16, 96, 2, 32, 48
PAGE = B * H * D * 2 * 2  # an attention page of fp16 K and V; the state's page is padded to it
KINDS = [("full", 0), ("sliding", W), ("state", 0)]


class RulesTest(unittest.TestCase):
    def test_window_blocks(self):
        for w, k in ((1, 1), (2, 1), (16, 1), (17, 1), (18, 2), (48, 3), (49, 3), (50, 4), (4096, 256)):
            self.assertEqual(GroupRule("sliding", 16, w).k, k, w)  # vLLM's cdiv(W - 1, B), at least 1

    def test_staging_tokens(self):
        """What host staging is sized by per group: a request's every block
        (full), two segments (sliding), one block (state)."""
        for kind, w, tokens, want in (("full", 0, 8704, 8704), ("sliding", 48, 8704, 96), ("sliding", 48, 40, 40),
                                      ("sliding", 4096, 8704, 8192), ("state", 0, 8704, 16)):
            self.assertEqual(GroupRule(kind, 16, w).staging_tokens(tokens), want, (kind, w, tokens))

    def test_hit_ranges(self):
        cases = [  # kind, window, n, skip -> (root, first, end) runs
            ("full", 0, 10, 0, [(0, 0, 10)]),
            ("full", 0, 10, 4, [(0, 4, 10)]),
            ("full", 0, 4, 4, []),
            ("state", 0, 10, 0, [(9, 9, 10)]),
            ("state", 0, 10, 9, [(9, 9, 10)]),
            ("sliding", 48, 10, 0, [(6, 7, 9), (9, 9, 10)]),  # k = 3: [7, 10) over segments 2 and 3
            ("sliding", 48, 9, 0, [(6, 6, 9)]),
            ("sliding", 48, 10, 8, [(6, 8, 9), (9, 9, 10)]),
            ("sliding", 48, 2, 0, [(0, 0, 2)]),
        ]
        for kind, w, n, skip, want in cases:
            self.assertEqual(GroupRule(kind, 16, w).hit_ranges(n, skip), want, (kind, n, skip))

    def test_save_ranges(self):
        cases = [  # kind, window, saved, full, prompt blocks, computed tokens -> (root, end)
            ("full", 0, 0, 4, 10, 64, [(0, 4)]),
            ("full", 0, 4, 4, 10, 70, []),
            ("state", 0, 0, 4, 10, 64, [(3, 4)]),
            ("state", 0, 0, 4, 10, 70, []),  # a step ending inside a block keeps no state at a block end
            ("sliding", 48, 0, 4, 10, 64, [(0, 3)]),  # segment [3, 6) not complete yet
            ("sliding", 48, 4, 8, 10, 128, [(3, 6)]),
            ("sliding", 48, 8, 10, 10, 160, [(6, 9), (9, 10)]),  # and the prompt's tail segment
            ("sliding", 48, 0, 10, 10, 160, [(0, 3), (3, 6), (6, 9), (9, 10)]),
        ]
        for kind, w, saved, full, pb, ct, want in cases:
            self.assertEqual(GroupRule(kind, 16, w).save_ranges(saved, full, pb, ct), want, (kind, saved, full))

    def test_capacity_shares(self):
        # One rank's capacity over the groups' stores, by their bytes of a block (Gemma 3: 6 sliding groups, 1 full).
        got = groups.capacity_shares(24 << 30, [4, 4, 4, 4, 3, 3, 4])
        self.assertLessEqual(sum(got), 24 << 30)
        self.assertGreater(sum(got), (24 << 30) - 7)
        self.assertEqual(got[0], got[6])
        self.assertEqual(got[4] * 4, got[0] * 3)
        self.assertEqual(groups.capacity_shares(10, [1]), [10])
        for cap, w in ((3, [1, 1, 1, 1]), (0, [1]), (10, []), (10, [1, 0])):
            with self.assertRaises(ValueError):
                groups.capacity_shares(cap, w)

    def test_bad_rules(self):
        for args in (("attention", 16), ("sliding", 16, 0), ("full", 16, 8), ("full", 0)):
            with self.assertRaises((ValueError, TypeError), msg=args):
                GroupRule(*args)
        with self.assertRaises(ValueError):
            HybridStore([GroupRule("full", 16), GroupRule("state", 32)])


def _spec(kind, **kw):
    return type(kind, (), {"block_size": 16, **kw})()


class VLLMGroupsTest(unittest.TestCase):
    """tutti.vllm.group_rules: vLLM's KV cache specs as tutti's rules (the
    double of vLLM stands in for it; specs are told apart by class name)."""

    def rules(self, *specs, block_size=16):
        import sys
        double = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_double")
        sys.path.insert(0, double)
        try:
            from tutti.vllm_groups import group_rules
            cfg = SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=s, layer_names=["x"]) for s in specs])
            return group_rules(cfg, block_size)
        finally:
            sys.path.remove(double)

    def test_kinds(self):
        self.assertIsNone(self.rules(_spec("FullAttentionSpec")))  # one group: a plain store
        got = self.rules(_spec("FullAttentionSpec"), _spec("SlidingWindowSpec", sliding_window=512),
                         _spec("MambaSpec", mamba_cache_mode="align"), _spec("MLAAttentionSpec"))
        self.assertEqual([(r.kind, r.window_tokens) for r in got], [("full", 0), ("sliding", 512), ("state", 0), ("full", 0)])

    def test_engine_hit_incomplete(self):
        from tutti.vllm_groups import engine_hit_incomplete

        class Pool:  # vLLM's BlockPool.get_cached_block: blocks of every group asked, or None
            hash_block_size = 16

            def __init__(self, cached):
                self.cached = cached  # {(hash, group)}

            def get_cached_block(self, h, gids):
                return [object() for _ in gids] if all((h, g) in self.cached for g in gids) else None

        req = SimpleNamespace(block_hashes=[b"h0", b"h1", b"h2"])
        kinds = ["full", "state"]
        every = {(h, g) for h in req.block_hashes for g in (0, 1)}
        self.assertFalse(engine_hit_incomplete(Pool(every), req, 32, 16, kinds))
        self.assertTrue(engine_hit_incomplete(Pool(every - {(b"h1", 1)}), req, 32, 16, kinds))  # no state at the end
        self.assertTrue(engine_hit_incomplete(Pool(every - {(b"h0", 0)}), req, 32, 16, kinds))  # a full block gone
        self.assertFalse(engine_hit_incomplete(Pool(every - {(b"h0", 1)}), req, 32, 16, kinds))  # an earlier state
        for pool, nc, k in ((Pool(set()), 32, ["full", "sliding"]), (None, 32, kinds), (Pool(set()), 0, kinds),
                            (Pool(set()), 24, kinds)):
            self.assertFalse(engine_hit_incomplete(pool, req, nc, 16, k))  # nothing to tell
        other = Pool(set())
        other.hash_block_size = 8
        self.assertFalse(engine_hit_incomplete(other, req, 32, 16, kinds))

    def test_refused(self):
        full = _spec("FullAttentionSpec")
        for bad, why in ((_spec("MambaSpec", mamba_cache_mode="all"), "align"),
                         (_spec("MambaSpec", mamba_cache_mode="none", block_size=8192), "enable-prefix-caching"),
                         (_spec("MambaSpec", mamba_cache_mode="align", num_speculative_blocks=1), "speculative"),
                         (_spec("ChunkedLocalAttentionSpec"), "not a kind"),
                         (_spec("RSWASpec"), "not a kind")):
            with self.assertRaisesRegex(ValueError, why):
                self.rules(full, bad)
        with self.assertRaisesRegex(ValueError, "tokens per block"):
            self.rules(full, _spec("SlidingWindowSpec", sliding_window=64), block_size=32)


class ManifestTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tutti-groups-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.rules = [GroupRule(k, B, w) for k, w in KINDS]
        self.want = groups.manifest(self.rules, ["a", "b", "c"])

    def test_written_then_checked(self):
        dirs = groups.ensure_manifest(self.dir, self.want)
        self.assertEqual(dirs, [os.path.join(self.dir, f"g{i}") for i in range(3)])
        with open(os.path.join(self.dir, groups.MANIFEST)) as f:
            self.assertEqual(json.load(f)["format"], groups.FORMAT)
        self.assertEqual(groups.ensure_manifest(self.dir, self.want), dirs)  # the same groups: accepted

    def test_refused(self):
        groups.ensure_manifest(self.dir, self.want)
        other = groups.manifest(self.rules[:2] + [GroupRule("sliding", B, 64)], ["a", "b", "c"])
        with self.assertRaisesRegex(ValueError, "holds groups"):
            groups.ensure_manifest(self.dir, other)
        with open(os.path.join(self.dir, groups.MANIFEST), "w") as f:
            json.dump({"format": "tutti-groups-v9", "groups": []}, f)
        with self.assertRaisesRegex(ValueError, "format"):
            groups.ensure_manifest(self.dir, self.want)
        with open(os.path.join(self.dir, groups.MANIFEST), "w") as f:
            f.write("{torn")
        with self.assertRaisesRegex(ValueError, "unreadable"):
            groups.ensure_manifest(self.dir, self.want)

    def test_fuzz_manifest(self):
        """Whatever groups.json holds, it is this format's exact groups or a
        ValueError naming it: never accepted, never rewritten."""
        import random
        seed = int(os.environ.get("TUTTI_FUZZ_SEED", "5"))
        rng = random.Random(seed)
        good = json.dumps(self.want).encode()
        p = os.path.join(self.dir, groups.MANIFEST)
        for i in range(300):
            b = bytearray(good)
            for _ in range(rng.randrange(1, 6)):
                op = rng.randrange(3)
                j = rng.randrange(len(b))
                if op == 0:
                    b[j] = rng.randrange(256)
                elif op == 1:
                    del b[j:j + rng.randrange(1, 8)]
                else:
                    b[j:j] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
            with open(p, "wb") as f:
                f.write(b)
            try:
                groups.ensure_manifest(self.dir, self.want)
            except ValueError:
                pass
            else:
                with open(p, "rb") as f:
                    self.assertEqual(json.loads(f.read()), self.want, f"seed {seed} case {i}")
            with open(p, "rb") as f:
                self.assertEqual(f.read(), bytes(b), f"seed {seed} case {i}: groups.json rewritten")

    def test_a_plain_store_is_not_taken_over(self):
        open(os.path.join(self.dir, "MANIFEST"), "w").close()  # a store of one group lives here
        with self.assertRaisesRegex(ValueError, "no groups.json"):
            groups.ensure_manifest(self.dir, self.want)


def _val(key, layer, salt):
    return (key * 2654435761 + layer * 97 + salt) % 2039


class HybridEngine:
    """tutti's connector halves over a double of vLLM's hybrid manager: block
    tables per group from one pool of NB pages; the sliding group's blocks
    before the window of the next token and the state group's blocks but the
    one holding the running state are vLLM's null block (0)."""

    def __init__(self, root, remote=False):
        self.rules = [GroupRule(k, B, w) for k, w in KINDS]
        self.hybrid = HybridStore(self.rules)
        self.root = root
        self.kv, self.raw = {}, {}
        names = []
        for g, (kind, _) in enumerate(KINDS):
            names.append([f"model.layers.{g * 2 + i}.{kind}" for i in range(2)])
            for n in names[-1]:
                raw = torch.zeros(NB * PAGE, dtype=torch.uint8)
                self.raw[n] = raw
                if kind == "state":  # vLLM's MambaSpec views of one page per block
                    conv = torch.as_strided(raw.view(torch.float16), (NB, 4, 64), (PAGE // 2, 64, 1), 0)
                    ssm = torch.as_strided(raw.view(torch.float32), (NB, 2, 16, 16), (PAGE // 4, 256, 16, 1), 128)
                    self.kv[n] = [conv, ssm]
                else:
                    self.kv[n] = raw.view(torch.float16).view(NB, 2, B, H, D)
        self.names = names
        self.workers = GroupWorkers(self._open, self.rules, self.hybrid)
        self.workers.register(self.kv, B, names)
        self.server = None
        if remote:  # the scheduler in another process than the worker (TP > 1): lookups over the socket
            from tutti.lookup_service import LookupServer, RemoteMatcher
            path = os.path.join(root, "lookup.sock")
            self.server = LookupServer(path, LocalMatcher(self.hybrid))
            self.sched = SchedulerSide(RemoteMatcher([path], 5.0), B, rules=self.rules)
        else:
            self.sched = SchedulerSide(LocalMatcher(self.hybrid), B, rules=self.rules)
        self.free = list(range(1, NB))

    def _open(self, i, lay):
        st = tutti.Store([os.path.join(self.root, f"g{i}")], 32 << 20, lay.geometry, lay.num_pages, layout=lay.layout,
                         path="cpu", io=tutti.IOOptions(staging_bytes=4 << 20, staging_slot_bytes=1 << 20),
                         sched=tutti.SchedOptions(compute={"fixed_ns": 1e7, "per_token_ns": 1e5, "per_pair_ns": 0}))
        self.hybrid.attach(i, st)
        return st

    def close(self):
        if self.server is not None:
            self.sched.matcher.close()
            self.server.close()
        self.workers.close(close_store=False)
        self.hybrid.close()

    # -- the model: a page's bytes are a function of the chain key (and layer)
    def write_block(self, g, layer, page, key):
        n = self.names[g][layer]
        if KINDS[g][0] == "state":
            conv, ssm = self.kv[n]
            conv[page].fill_(_val(key, layer, 1))
            ssm[page].fill_(_val(key, layer, 2))
        else:
            self.kv[n][page].fill_(_val(key, layer + 10 * g, 0))

    def holds(self, g, layer, page, key):
        n = self.names[g][layer]
        if KINDS[g][0] == "state":
            conv, ssm = self.kv[n]
            return bool((conv[page] == _val(key, layer, 1)).all() and (ssm[page] == _val(key, layer, 2)).all())
        return bool((self.kv[n][page] == _val(key, layer + 10 * g, 0)).all())

    # -- one request, prompt only, in chunks of ``chunk`` tokens
    def run(self, rid, tokens, chunk=64, local_blocks=0, order="before", expect_hit=None):
        from tutti.keys import chain_keys
        chain = chain_keys(tokens, B, 7)
        n_tok = len(tokens)
        nc = local_blocks * B
        got = None
        for _ in range(5000):  # a remote matcher answers "ask again" until the worker did
            got = self.sched.get_num_new_matched_tokens(rid, chain, n_tok, nc)
            if got is not None:
                break
            time.sleep(0.001)
        self.sched.track(rid, chain)
        if expect_hit is not None:
            assert got == expect_hit, (rid, got, expect_hit)
        total_blocks = -(-n_tok // B)
        tables = [[self.free.pop() for _ in range(total_blocks)] for _ in self.rules]
        for g in range(3):  # the engine's own blocks (a local hit) hold their KV already
            for j in range(local_blocks):
                for layer in range(2):
                    self.write_block(g, layer, tables[g][j], chain[j])
        computed = nc + got
        self._null(tables, computed)
        self.sched.update_state_after_alloc(rid, [list(t) for t in tables], got)
        restored_ok, first = True, True
        last_state = n_tok - n_tok % B  # vLLM's align mode stops a chunk there (its state is kept)
        while computed < n_tok:
            n = min(chunk, n_tok - computed)
            if computed < last_state < computed + n:
                n = last_state - computed
            if first:
                step_new = [SimpleNamespace(req_id=rid, block_ids=tuple(list(t) for t in tables),
                                            num_computed_tokens=computed)]
                cached = SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[], resumed_req_ids=set())
            else:
                step_new = []
                cached = SimpleNamespace(req_ids=[rid], new_block_ids=[None], num_computed_tokens=[computed],
                                         resumed_req_ids=set())
            step = SimpleNamespace(scheduled_new_reqs=step_new, scheduled_cached_reqs=cached,
                                   num_scheduled_tokens={rid: n}, finished_req_ids=set())
            meta = pickle.loads(pickle.dumps(self.sched.build_meta(step)))
            w = self.workers
            w.bind(meta.loads, meta.saves, ended=meta.ended, dropped=meta.dropped)
            if order == "before":
                w.start_load()
            for g in range(3):
                if KINDS[g][0] != "state":
                    for name in self.names[g]:
                        w.wait_for_layer(name)
            if first:  # what the hit promised is there: every group's part of it
                restored_ok = self.restored(chain, tables, computed)
            for j in range(computed // B, -(-(computed + n) // B)):  # the step computes these blocks
                for g in range(3):
                    if KINDS[g][0] != "state" and j < len(chain) and tables[g][j]:
                        for layer in range(2):
                            self.write_block(g, layer, tables[g][j], chain[j])
            end = computed + n
            if end % B == 0 and end // B <= len(chain):  # align mode: the state after the step
                for layer in range(2):
                    self.write_block(2, layer, tables[2][end // B - 1], chain[end // B - 1])
            for g in range(3):
                for name in self.names[g]:
                    w.save_layer(name)
            w.wait_for_save()
            if order == "after":
                w.start_load()
            res = w.finish_step(())
            assert not res.error_block_ids, res
            w.unbind()
            computed, first = end, False
            self._null(tables, computed)
        self.sched.request_finished(rid)
        # vLLM's next step names the finished request: its queued saves are handed over before its pages go.
        empty = SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[], resumed_req_ids=set())
        meta = self.sched.build_meta(SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=empty,
                                                     num_scheduled_tokens={}, finished_req_ids={rid}))
        assert meta.ended == [rid], meta
        self.workers.end_requests(meta.ended, meta.dropped)
        self.workers.bind(meta.loads, meta.saves)
        self.workers.finish_step([rid])
        self.workers.unbind()
        for t in tables:
            self.free.extend(b for b in t if b)
        self.hybrid.wait_saves()
        return got, chain, restored_ok

    def _null(self, tables, computed):
        """vLLM frees what the next token no longer reads."""
        skipped = max(0, computed - W + 1) // B
        for j in range(min(skipped, len(tables[1]))):
            if tables[1][j]:
                self.free.append(tables[1][j])
                tables[1][j] = 0
        last = -(-computed // B) - 1
        for j in range(len(tables[2])):
            if j != last and j < last and tables[2][j]:
                self.free.append(tables[2][j])
                tables[2][j] = 0

    def restored(self, chain, tables, computed):
        n = computed // B
        for j in range(n):
            for layer in range(2):
                if not self.holds(0, layer, tables[0][j], chain[j]):
                    return False
        for j in range(max(0, n - 3), n):
            for layer in range(2):
                if not self.holds(1, layer, tables[1][j], chain[j]):
                    return False
        # vLLM runs the state in the group's last block and copied it there before the load: tutti copies it again.
        return n == 0 or all(self.holds(2, layer, tables[2][j], chain[n - 1]) for layer in range(2) for j in (n - 1, -1))


class StateRunsInTest(unittest.TestCase):
    """A state group's load names the block vLLM runs the request's state in
    (align mode: the last one allocated), which vLLM filled before the load."""

    class Matcher:
        def match(self, req_id, chain, skip):
            return 3

        def release(self, req_id):
            pass

    def loads(self, state_ids):
        s = SchedulerSide(self.Matcher(), B, rules=[GroupRule("full", B), GroupRule("state", B)])
        self.assertEqual(s.get_num_new_matched_tokens("r", list(range(100, 106)), 6 * B + 5, 0), 3 * B)
        s.update_state_after_alloc("r", [list(range(1, len(state_ids) + 1)), state_ids], 3 * B)
        return {ld.group: ld for ld in s._loads}

    def test_copy_to(self):
        got = self.loads([0, 0, 7, 0, 9])  # restored into block 2 (7), run in block 4 (9)
        self.assertEqual((got[1].block_ids, got[1].copy_to), ([7], [9]))
        self.assertEqual(got[0].copy_to, [])
        got = self.loads([0, 0, 7])  # nothing after the restored block: no copy
        self.assertEqual((got[1].block_ids, got[1].copy_to), ([7], []))


@unittest.skipIf(torch is None, NO_TORCH)
class HybridStagingTest(unittest.TestCase):
    def test_each_group_sized_for_what_it_moves(self):
        """Host staging sized by default (hoststage.SizedFor): each group's
        pool for what its rule moves of the engine's longest request, the
        floor divided among the groups, cut to the engine's cache; a state
        group through host staging is refused, as with a size given."""
        from tutti import hoststage
        d = tempfile.mkdtemp(prefix="tutti-hybrid-")
        self.addCleanup(shutil.rmtree, d, True)
        nb = 200
        rules = [GroupRule("full", B), GroupRule("sliding", B, W)]
        kv = {f"l{g}": torch.zeros(nb, 2, B, H, D, dtype=torch.float16) for g in range(2)}

        def opener(i, lay, sub="a"):
            return tutti.Store([os.path.join(d, sub, f"g{i}")], 1 << 20, lay.geometry, lay.num_pages, layout=lay.layout,
                               path="cpu")
        w = GroupWorkers(opener, rules, HybridStore(rules))
        self.addCleanup(w.close)
        tokens = 1 << 22
        w.register(kv, B, [["l0"], ["l1"]], host_staging_bytes=hoststage.SizedFor(tokens))
        block = 2 * B * H * D * 2  # one layer's page: K and V in fp16
        # full: two requests' blocks (2 GiB, within its half of [1 GiB, 16 GiB]);
        # sliding: two segments of 3 blocks, below the floor's half.
        self.assertEqual([x.staging.host_staging_bytes for x in w.workers],
                         [2 * (tokens // B) * block, hoststage.HOST_STAGING_BYTES_DEFAULT // 2])
        self.assertEqual([x.staging.pages for x in w.workers], [nb, nb])  # cut to the engine's cache
        rules = [GroupRule("full", B), GroupRule("state", B)]
        w = GroupWorkers(lambda i, lay: opener(i, lay, "b"), rules, HybridStore(rules))
        self.addCleanup(w.close)
        with self.assertRaisesRegex(ValueError, "recurrent state through host staging"):
            w.register({"a": kv["l0"], "b": kv["l1"]}, B, [["a"], ["b"]], host_staging_bytes=hoststage.SizedFor(64))


@unittest.skipIf(torch is None, NO_TORCH)
class HybridEngineTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tutti-hybrid-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.e = HybridEngine(self.dir)
        self.addCleanup(lambda: self.e.close())

    def toks(self, n, seed):
        return [(seed * 7919 + i * 104729) % 30000 + 1000 for i in range(n)]

    def test_miss_then_chunks_then_hits(self):
        e, doc = self.e, self.toks(160, 1)
        got, chain, _ = e.run("a", doc + self.toks(8, 2), expect_hit=0)  # a miss; saved 64 tokens a step
        st = e.hybrid.stores
        self.assertEqual(st[0].lookup(chain), 10)
        self.assertEqual([st[2].lookup([chain[j]]) for j in range(10)], [0, 0, 0, 1, 0, 0, 0, 1, 0, 1])
        self.assertEqual([st[1].lookup(chain[s:s + 3]) for s in (0, 3, 6, 9)], [3, 3, 3, 1])
        # The same prompt: every block is a hit (the last token is computed).
        got, _, ok = e.run("b", doc + self.toks(8, 3), expect_hit=160)
        self.assertTrue(ok, "a restored block or state differs from what was computed")
        # Sharing 9 blocks: the state after 9 blocks was never kept, the hit ends at 8.
        got, _, ok = e.run("c", doc[:144] + self.toks(30, 4), order="after", expect_hit=128)
        self.assertTrue(ok)
        # A local hit of 4 blocks: tutti restores the rest, only the window and the state of the sliding and state groups.
        got, _, ok = e.run("d", doc + self.toks(8, 5), local_blocks=4, expect_hit=96)
        self.assertTrue(ok)
        # A prompt of whole blocks: the hit stops a whole block short of its end (no state mid-block).
        got, _, ok = e.run("e", doc, expect_hit=128)
        self.assertTrue(ok)

    def test_lookups_from_another_process(self):
        """The scheduler asks the worker's hybrid store over the lookup socket (TP > 1)."""
        self.e.close()
        e = self.e = HybridEngine(self.dir, remote=True)
        doc = self.toks(160, 1)
        e.run("a", doc + self.toks(8, 2), expect_hit=0)
        _, _, ok = e.run("b", doc + self.toks(8, 3), expect_hit=160)
        self.assertTrue(ok)
        _, _, ok = e.run("c", doc[:144] + self.toks(30, 4), expect_hit=128)
        self.assertTrue(ok)

    def test_restart_and_every_group_needed(self):
        e, doc = self.e, self.toks(160, 1)
        _, chain, _ = e.run("a", doc + self.toks(8, 2), expect_hit=0)
        self.assertEqual(e.hybrid.lookup(chain), 10)
        e.close()
        e = self.e = HybridEngine(self.dir)  # a new process's stores: the same directories
        _, _, ok = e.run("b", doc + self.toks(8, 3), expect_hit=160)
        self.assertTrue(ok)
        e.close()
        shutil.rmtree(os.path.join(self.dir, "g1"))  # the sliding window's part lost: no block is a hit
        e = self.e = HybridEngine(self.dir)
        self.assertEqual(e.hybrid.stores[0].lookup(chain), 10)
        self.assertEqual(e.hybrid.lookup(chain), 0)
        e.run("c", doc + self.toks(8, 4), expect_hit=0)

    def test_a_group_failing_its_step_end_leaves_the_others_ended(self):
        """One group's finish_step raising still ends every other group's
        step (their loads released, never waited on next step), then raises."""
        e, doc = self.e, self.toks(160, 1)
        e.run("a", doc + self.toks(8, 2), expect_hit=0)
        loads = []
        for i, w in enumerate(e.workers.workers):
            real = w.finish_step

            def finish(ids=(), i=i, w=w, real=real):
                loads.append((i, len(w._loads)))
                res = real(ids)
                if i == 0:
                    raise RuntimeError("group 0 broke")
                return res
            w.finish_step = finish
        with self.assertLogs("tutti.group_worker", "ERROR"), self.assertRaisesRegex(RuntimeError, "group 0 broke"):
            e.run("b", doc + self.toks(8, 3), expect_hit=160)  # its first step loads in every group
        self.assertEqual([i for i, _ in loads], list(range(len(KINDS))))
        self.assertTrue(all(n > 0 for _, n in loads), loads)
        self.assertEqual([w._loads for w in e.workers.workers], [{}] * len(KINDS))

if __name__ == "__main__":
    unittest.main()
