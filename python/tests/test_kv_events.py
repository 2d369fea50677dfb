"""KV events through the C ABI: a store opened with kv_events publishes its
saved blocks with the token ids given to save (docs/routers.md). The wire
check needs pyzmq and msgpack, which only Debian's /usr/bin/python3 has
(python3-zmq, python3-msgpack); elsewhere that part is skipped."""

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


class KVEventsTest(unittest.TestCase):
    def test_bad_spec_is_an_argument_error(self):
        with self.assertRaises(tutti.TuttiError) as cm:
            StoreFixture(kv_events="udp://127.0.0.1:1")
        self.assertIn("kv_events", str(cm.exception))

    def test_save_with_tokens_is_published(self):
        pub, rep = free_port(), free_port()
        fx = StoreFixture(kv_events=f"tcp://127.0.0.1:{pub}?replay=tcp://127.0.0.1:{rep}&topic=kv@py@small")
        self.addCleanup(fx.close)
        st = fx.store
        st.register_kv(fx.regions())
        bt = SMALL.block_tokens
        tokens = list(range(3 * bt))
        chain = tutti.chain_from_tokens(tokens, bt)
        with self.assertRaises(tutti.TuttiError):
            st.save(chain, [1, 2, 3], tokens=tokens[:-1])
        with st.save(chain, [1, 2, 3], tokens=tokens) as sv:
            sv.wait_gathered()
        st.wait_saves()
        self.assertEqual(st.lookup(chain), 3)
        events = replayed_events(self, rep)
        self.assertEqual(events[0], ["AllBlocksCleared"])
        self.assertEqual(events[1], ["BlockStored", chain, None, tokens, bt, None, "DISK"])

    def test_engine_hashes_are_published(self):
        """The engine's own hash bytes (vLLM's block hashes) replace the chain
        ids on the wire, the parent's too; the worker side passes them."""
        pub, rep = free_port(), free_port()
        fx = StoreFixture(kv_events=f"tcp://127.0.0.1:{pub}?replay=tcp://127.0.0.1:{rep}&topic=kv@py@small")
        self.addCleanup(fx.close)
        st = fx.store
        st.register_kv(fx.regions())
        bt = SMALL.block_tokens
        tokens = list(range(100, 100 + 2 * bt))
        chain = tutti.chain_from_tokens(tokens, bt)
        hashes = [bytes([i]) * 32 for i in (7, 9)]
        with self.assertRaisesRegex(ValueError, "one length"):
            st.save(chain, [4, 5], hashes=[hashes[0], b"x"])
        with self.assertRaisesRegex(ValueError, "2 chain blocks"):
            st.save(chain, [4, 5], hashes=hashes[:1])
        with st.save(chain[:1], [4], tokens=tokens[:bt], hashes=hashes[:1]) as sv:  # the parent first
            sv.wait_gathered()
        st.wait_saves()
        with st.save(chain, [4, 5], tokens=tokens, hashes=hashes) as sv:
            sv.wait_gathered()
        st.wait_saves()
        stored = [e for e in replayed_events(self, rep) if e[0] == "BlockStored"]
        got = [h for e in stored for h in e[1]]
        self.assertEqual(got, hashes)
        self.assertEqual([e[2] for e in stored], [None, hashes[0]])  # the child's parent is the engine's hash too


if __name__ == "__main__":
    unittest.main()
