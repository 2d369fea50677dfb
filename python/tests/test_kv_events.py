"""KV events through the C ABI and Python (docs/routers.md): a store opened
with kv_events publishes its saved blocks with the token ids given to save,
in vLLM 0.26's maps by default (0.11's arrays on request). The wire checks
need pyzmq and msgpack, which Debian's /usr/bin/python3 has (python3-zmq,
python3-msgpack); elsewhere they skip."""

import socket
import unittest

import tutti

from helpers import SMALL, StoreFixture


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


if __name__ == "__main__":
    unittest.main()
