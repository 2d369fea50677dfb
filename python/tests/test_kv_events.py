"""KV events through the C ABI and Python (docs/routers.md): a store opened
with kv_events publishes its saved blocks with the token ids given to save,
in vLLM 0.26's maps by default (0.11's arrays on request); a store opened
with kv_events="engine" hands them to its engine; tutti.kv_events keeps, over
tensor-parallel ranks, the blocks every rank holds. The wire checks need
pyzmq and msgpack, which Debian's /usr/bin/python3 has (python3-zmq,
python3-msgpack); elsewhere they skip."""

import ctypes
import socket
import unittest

import tutti
from tutti.kv_events import CommonBlocks, split_stored

from helpers import SMALL, StoreFixture


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


if __name__ == "__main__":
    unittest.main()
