"""tutti.save_queue without a store: a request's chunk saves are handed over
in order, each once the part before it is committed; retried while not
committed, given up after a bounded number of hand-overs; flushed when the
request's pages go away (bounded wait), dropped when they went already;
every loss counted."""

import unittest
from types import SimpleNamespace as NS

from tutti.save_queue import SaveQueue


def spec(rid, n, start=0):
    return NS(req_id=rid, chain=list(range(100, 100 + n)), block_ids=list(range(n)), start=start)


class Store:
    """lookup(chain): the committed leading blocks, set by the test."""

    def __init__(self):
        self.committed = 0

    def lookup(self, chain):
        return min(self.committed, len(chain))


class SaveQueueTest(unittest.TestCase):
    def setUp(self):
        self.st, self.now = Store(), [0.0]
        self.q = SaveQueue(self.st.lookup, retry_ms=100, max_attempts=3, flush_wait_ms=50,
                           clock=lambda: self.now[0], sleep=self.sleep)

    def sleep(self, s):
        self.now[0] += s

    def test_chunks_in_order(self):
        q = self.q
        q.add(spec("r", 2))
        self.assertEqual([len(s.chain) for s in q.ready()], [2])  # nothing before it: at once
        q.add(spec("r", 4, start=2))
        self.assertEqual(q.ready(), [])  # the first chunk is not committed yet
        self.st.committed = 2
        self.assertEqual([len(s.chain) for s in q.ready()], [4])
        self.st.committed = 4
        self.assertEqual(q.ready(), [])
        self.assertFalse(q.pending("r"))  # committed whole: done
        self.assertEqual(q.take_counters(), {})

    def test_retried_then_given_up(self):
        q = self.q
        q.add(spec("r", 3))
        q.ready()
        self.st.committed = 1  # the store skipped part of it (full, say)
        self.assertEqual(q.ready(), [])  # not before the retry interval
        for _ in range(2):
            self.now[0] += 0.1
            self.assertEqual(len(q.ready()), 1)  # handed over again: the store writes from its committed prefix
        self.now[0] += 0.1
        self.assertEqual(q.ready(), [])
        self.assertFalse(q.pending("r"))
        self.assertEqual(q.take_counters(), {"save_gave_up_blocks": 2})

    def test_flush_and_drop(self):
        q = self.q
        q.add(spec("a", 2))
        q.add(spec("b", 2))
        q.ready()
        q.add(spec("a", 5, start=2))
        q.add(spec("b", 5, start=2))
        self.st.committed = 2
        self.assertEqual([len(s.chain) for s in q.flush(["a"])], [5])  # the part before committed: handed at once
        self.st.committed = 0  # never committed: handed over anyway once the wait is over, counted
        self.assertEqual([len(s.chain) for s in q.flush(["b"])], [5])
        q.add(spec("c", 3))
        q.drop(["c"])
        self.assertEqual(len(q), 0)
        self.assertEqual(q.take_counters(), {"save_flushed": 2, "save_flush_timeouts": 1, "save_dropped_blocks": 3})

    def test_without_keep_each_save_goes_in_its_step(self):
        """An engine that does not end requests explicitly: nothing waits or is
        retried (its pages may be reused right after the step)."""
        q = SaveQueue(self.st.lookup, keep=False)
        q.add(spec("r", 2))
        self.assertEqual(len(q.ready()), 1)
        q.add(spec("r", 4, start=2))
        self.assertEqual(len(q.ready()), 1)  # handed over although the first is not committed
        self.assertEqual((len(q), q.ready()), (0, []))


if __name__ == "__main__":
    unittest.main()
