"""KV events through the C ABI and Python (docs/routers.md): a store opened
with kv_events publishes its saved blocks with the token ids given to save,
in vLLM 0.26's maps by default (0.11's arrays on request); a store opened
with kv_events="engine" hands them to its engine; tutti.kv_events keeps, over
tensor-parallel ranks, the blocks every rank holds; and the vLLM connector's
kv_events "vllm" goes through vLLM's own path (workers' events, vLLM's
aggregator, the scheduler's take_events), driven here through the contract
double of vLLM. The wire checks need pyzmq and msgpack, which Debian's
/usr/bin/python3 has (python3-zmq, python3-msgpack); elsewhere they skip."""

import ctypes
import os
import socket
import shutil
import sys
import tempfile
import unittest

import tutti
from tutti.kv_events import CommonBlocks, split_stored

from helpers import SMALL, StoreFixture

DOUBLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_double")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need_msgpack(test):
    try:
        import msgpack  # noqa: F401
    except ImportError:
        try:
            import msgspec  # noqa: F401
        except ImportError:
            test.skipTest("neither msgpack nor msgspec: the events cannot be decoded here (CI: python3-msgpack)")


def replayed_events(test, rep):
    """Every event of the store's current contents, asked from its replay
    endpoint from sequence 0 (vLLM's replay protocol); skips the test where
    pyzmq or msgpack is missing."""
    try:
        import msgpack
        import zmq
    except ImportError:
        test.skipTest("pyzmq or msgpack missing: the wire check runs under /usr/bin/python3 (CI)")
    d = zmq.Context.instance().socket(zmq.DEALER)
    test.addCleanup(d.close, 0)
    d.setsockopt(zmq.RCVTIMEO, 10000)
    d.connect(f"tcp://127.0.0.1:{rep}")
    d.send_multipart([b"", (0).to_bytes(8, "big")])
    events = []
    while True:
        _, seq, payload = d.recv_multipart()
        if int.from_bytes(seq, "big", signed=True) == -1:
            return events
        events += msgpack.unpackb(payload)[1]


def stored(chain, tokens, bt, parent=None, **kw):
    """A BlockStored as vLLM 0.26 encodes it, as tutti's stores publish it."""
    return dict({"type": "BlockStored", "block_hashes": chain, "parent_block_hash": parent, "token_ids": tokens,
                 "block_size": bt, "lora_id": None, "medium": "FS", "lora_name": None, "group_idx": 0,
                 "locality": "LOCAL"}, **kw)


def save(st, chain, pages, **kw):
    with st.save(chain, pages, **kw) as sv:
        sv.wait_gathered()
    st.wait_saves()


class KVEventsTest(unittest.TestCase):
    def open(self, spec):
        fx = StoreFixture(kv_events=spec)
        self.addCleanup(fx.close)
        fx.store.register_kv(fx.regions())
        return fx.store

    def test_bad_spec_is_an_argument_error(self):
        for spec in ("udp://127.0.0.1:1", "tcp://127.0.0.1:1?format=vllm-0.20", "engine?topic=t"):
            with self.assertRaises(tutti.TuttiError) as cm:
                StoreFixture(kv_events=spec)
            self.assertIn("kv_events", str(cm.exception))

    def test_save_with_tokens_is_published(self):
        """vLLM 0.26's format by default; 0.11's arrays with format=vllm-0.11."""
        bt = SMALL.block_tokens
        tokens = list(range(3 * bt))
        chain = tutti.chain_from_tokens(tokens, bt)
        for fmt, cleared, want in (
                ("", {"type": "AllBlocksCleared"}, stored(chain, tokens, bt)),
                ("&format=vllm-0.11", ["AllBlocksCleared"], ["BlockStored", chain, None, tokens, bt, None, "DISK"])):
            with self.subTest(fmt or "default"):
                pub, rep = free_port(), free_port()
                st = self.open(f"tcp://127.0.0.1:{pub}?replay=tcp://127.0.0.1:{rep}&topic=kv@py@small{fmt}")
                with self.assertRaises(tutti.TuttiError):
                    st.save(chain, [1, 2, 3], tokens=tokens[:-1])
                save(st, chain, [1, 2, 3], tokens=tokens)
                self.assertEqual(st.lookup(chain), 3)
                self.assertEqual(replayed_events(self, rep), [cleared, want])

    def test_engine_hashes_are_published(self):
        """The engine's own hash bytes (vLLM's block hashes) replace the chain
        ids on the wire, the parent's too; the worker side passes them."""
        pub, rep = free_port(), free_port()
        st = self.open(f"tcp://127.0.0.1:{pub}?replay=tcp://127.0.0.1:{rep}&topic=kv@py@small")
        bt = SMALL.block_tokens
        tokens = list(range(100, 100 + 2 * bt))
        chain = tutti.chain_from_tokens(tokens, bt)
        hashes = [bytes([i]) * 32 for i in (7, 9)]
        with self.assertRaisesRegex(ValueError, "one length"):
            st.save(chain, [4, 5], hashes=[hashes[0], b"x"])
        with self.assertRaisesRegex(ValueError, "2 chain blocks"):
            st.save(chain, [4, 5], hashes=hashes[:1])
        save(st, chain[:1], [4], tokens=tokens[:bt], hashes=hashes[:1])  # the parent first
        save(st, chain, [4, 5], tokens=tokens, hashes=hashes)
        events = [e for e in replayed_events(self, rep) if e["type"] == "BlockStored"]
        self.assertEqual([h for e in events for h in e["block_hashes"]], hashes)
        self.assertEqual([e["parent_block_hash"] for e in events], [None, hashes[0]])  # the child's parent too

    def test_engine_takes_its_events(self):
        """kv_events="engine": no sockets; the first take lists what the
        store holds after AllBlocksCleared, later takes what changed."""
        need_msgpack(self)
        from tutti.kv_events import decode
        st = self.open("engine")
        bt = SMALL.block_tokens
        tokens = list(range(7, 7 + 2 * bt))
        chain = tutti.chain_from_tokens(tokens, bt)
        save(st, chain[:1], [1], tokens=tokens[:bt])
        take = lambda: [e for p in st.take_kv_events() for e in decode(p)]  # noqa: E731
        self.assertEqual(take(), [{"type": "AllBlocksCleared"}, stored(chain[:1], tokens[:bt], bt)])
        self.assertEqual(take(), [])
        save(st, chain, [1, 2], tokens=tokens)
        st._take_buf = (ctypes.c_uint8 * 8)()  # smaller than the event: the binding grows it
        self.assertEqual(take(), [stored(chain[1:], tokens[bt:], bt, parent=chain[0])])
        plain = StoreFixture()
        self.addCleanup(plain.close)
        with self.assertRaises(tutti.InvalidArgument):
            plain.store.take_kv_events()


def S(*hs, parent=None, toks=True):
    """A BlockStored of blocks hs (block size 1: each block's token is its hash)."""
    return {"type": "BlockStored", "block_hashes": list(hs), "parent_block_hash": parent,
            "token_ids": list(hs) if toks else [], "block_size": 1, "lora_id": None, "medium": "FS",
            "lora_name": None, "group_idx": 0, "locality": "LOCAL"}


def R(*hs):
    return {"type": "BlockRemoved", "block_hashes": list(hs), "medium": "FS", "group_idx": 0, "locality": "LOCAL"}


C = {"type": "AllBlocksCleared"}


class CommonBlocksTest(unittest.TestCase):
    """Two ranks' stores: a block is published once both hold it."""

    def test_steps(self):
        cases = [
            ("only the blocks both hold, as one run",
             [(0, [C, S(1, 2, 3)]), (1, [C, S(1, 2), S(9, parent=2)])], [S(1, 2)]),
            ("a rank that commits a step later",
             [(0, [C, S(1, 2)]), (1, [C]), (1, [S(1, 2)])], [S(1, 2)]),
            ("runs of different lengths per rank",
             [(0, [C, S(1), S(2, 3, parent=1)]), (1, [C, S(1, 2, 3)])], [S(1, 2, 3)]),
            ("removed when one rank drops it, leaf first",
             [(0, [C, S(1, 2, 3)]), (1, [C, S(1, 2, 3)]), (0, [R(3, 2)])], [S(1, 2, 3), R(3, 2)]),
            ("a block only one rank held is never removed",
             [(0, [C, S(1, 2)]), (1, [C, S(1)]), (0, [R(2)])], [S(1)]),
            ("stored again after a removal",
             [(0, [C, S(1)]), (1, [C, S(1)]), (1, [R(1)]), (1, [S(1)])], [S(1), R(1), S(1)]),
            ("a listing keeps what it shows, removes what it does not",
             [(0, [C, S(1, 2, 3)]), (1, [C, S(1, 2, 3)]), (1, [C, S(1, 2)])], [S(1, 2, 3), R(3)]),
            ("a rank's token ids win over hashes only",
             [(0, [C, S(4, toks=False)]), (1, [C, S(4)])], [S(4)]),
            ("removes of unknown blocks are counted, not published",
             [(0, [C, R(5)]), (1, [C])], []),
        ]
        for name, adds, want in cases:
            with self.subTest(name):
                cb = CommonBlocks(2)
                got = []
                for rank, events in adds:
                    cb.add(rank, [dict(e) for e in events])
                    got += cb.take()
                self.assertEqual(got, want)

    def test_counters_and_bounds(self):
        cb = CommonBlocks(2, max_blocks=2)
        cb.add(0, [C, S(1, 2, 3), R(7)])
        cb.add(1, [C, S(1, 2, 3)])
        self.assertEqual(cb.take(), [S(1, 2)])
        self.assertEqual((cb.counters["untracked_blocks"], cb.counters["unknown_removes"], cb.blocks()), (2, 1, 2))
        with self.assertRaises(ValueError):
            cb.add(2, [])
        with self.assertRaises(ValueError):
            CommonBlocks(0)

    def test_split_keeps_each_blocks_parent_tokens_and_extra_keys(self):
        ev = dict(S(1, 2, parent=0), extra_keys=[("a",), None])
        self.assertEqual(split_stored(ev), [dict(S(1, parent=0), extra_keys=[("a",)]),
                                            dict(S(2, parent=1), extra_keys=[None])])


class VLLMPathTest(unittest.TestCase):
    """kv_events "vllm" at TP = 2, vLLM's path with real stores: each rank's
    worker connector reports its store's events, vLLM's KVOutputAggregator
    merges them, the scheduler connector takes what both ranks hold."""

    def setUp(self):
        need_msgpack(self)
        sys.path.insert(0, DOUBLE)
        env, mods = os.environ.get("PYTHONHASHSEED"), set(sys.modules)
        os.environ["PYTHONHASHSEED"] = "0"

        def restore():
            # The double hashes from PYTHONHASHSEED at import: later tests
            # import it afresh under their own.
            sys.path.remove(DOUBLE)
            for m in set(sys.modules) - mods:
                if m == "vllm" or m.startswith("vllm.") or m == "tutti.vllm" or m.startswith("tutti.vllm_"):
                    del sys.modules[m]
            if env is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = env
        self.addCleanup(restore)

    def config(self, events_on=True):
        from vllm.config import CacheConfig, KVEventsConfig, KVTransferConfig, ParallelConfig, VllmConfig
        root = tempfile.mkdtemp(prefix="tutti-kvev-")
        self.addCleanup(shutil.rmtree, root, True)
        ex = {"dirs": [root], "capacity_bytes": 1 << 20, "kv_events": "vllm", "lookup_socket_dir": root}
        return VllmConfig(kv_transfer_config=KVTransferConfig("TuttiConnector", "tutti.vllm", "kv_both", ex, "ev"),
                          cache_config=CacheConfig(SMALL.page_tokens), parallel_config=ParallelConfig(2),
                          kv_events_config=KVEventsConfig(enable_kv_cache_events=events_on))

    def test_refused_settings(self):
        from tutti.vllm import Settings, TuttiConnector
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        with self.assertRaisesRegex(ValueError, "kv-events-config"):  # vLLM would drop the events
            TuttiConnector(self.config(events_on=False), KVConnectorRole.SCHEDULER)
        for bad in ("engine", "VLLM", 1):
            with self.assertRaisesRegex(ValueError, "kv_events"):
                Settings.parse({"dirs": ["/x"], "capacity_bytes": 1, "kv_events": bad})

    def test_only_blocks_every_rank_holds_are_published(self):
        from tutti.vllm import TuttiConnector
        from vllm.distributed.kv_events import BlockRemoved, BlockStored
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.parallel_state import set_rank_for_test
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        cfg = self.config()
        sched = TuttiConnector(cfg, KVConnectorRole.SCHEDULER)
        workers = []
        for rank in range(2):
            set_rank_for_test(rank)
            w = TuttiConnector(cfg, KVConnectorRole.WORKER)
            # The store register_kv_caches opens for this rank; rank 0's
            # holds 4 blocks, so a fifth evicts.
            fx = StoreFixture(kv_events="engine", capacity_bytes=(4 if rank == 0 else 64) * 32768)
            self.addCleanup(fx.close)
            fx.store.register_kv(fx.regions())
            w._worker.store = fx.store
            workers.append(w)
        agg = KVOutputAggregator()

        def step():
            outs = [ModelRunnerOutput(KVConnectorOutput(kv_cache_events=w.get_kv_connector_kv_cache_events()))
                    for w in workers]
            sched.update_connector_output(agg.aggregate(outs).kv_connector_output)
            return list(sched.take_events())

        bt = SMALL.block_tokens
        tokens = list(range(50, 50 + 4 * bt))
        chain = tutti.chain_from_tokens(tokens, bt)
        vh = [bytes(24) + bytes([0, 0, 0, 0, 0, 0, 1, i]) for i in range(4)]  # vLLM's hash bytes; published as ints
        ints = [256 + i for i in range(4)]

        def rank_save(rank, n, pages):
            save(workers[rank]._worker.store, chain[:n], pages, tokens=tokens[:n * bt], hashes=vh[:n])

        self.assertEqual(step(), [])  # both stores empty: their listings publish nothing
        rank_save(0, 3, [1, 2, 3])  # rank 0 holds blocks 0-2, rank 1 blocks 0-1
        rank_save(1, 2, [4, 5])
        got = step()
        want = BlockStored(block_hashes=ints[:2], parent_block_hash=None, token_ids=tokens[:2 * bt], block_size=bt,
                           lora_id=None, medium="FS", lora_name=None, group_idx=0, locality="LOCAL")
        self.assertEqual(got, [want])
        rank_save(1, 4, [4, 5, 6, 7])  # rank 1 now holds 0-3: block 2 is whole, block 3 is rank 1's only
        got = step()
        self.assertEqual([(type(e), e.block_hashes, e.parent_block_hash) for e in got],
                         [(BlockStored, ints[2:3], ints[1])])
        r0 = workers[0]._worker.store
        save(r0, tutti.chain_from_tokens(list(range(9000, 9000 + bt)), bt), [9])  # rank 0 evicts, leaf first
        kept = r0.lookup(chain)
        self.assertLess(kept, 3)
        self.assertEqual(step(), [BlockRemoved(block_hashes=ints[kept:3][::-1], medium="FS", group_idx=0,
                                               locality="LOCAL")])  # the new block is rank 0's only


if __name__ == "__main__":
    unittest.main()
