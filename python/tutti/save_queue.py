"""Saves of a request's prompt chunk by chunk, each once the chunk before it
is committed (worker side, one per store).

Why: a store reserves a save's blocks only under a committed parent; a save
whose leading blocks are still being written (this request's previous chunk,
or another request's save of the same prefix) is skipped whole. So each
request keeps one *want* here: its newest :class:`~tutti.worker_side.SaveSpec`
(the chain up to its last computed full block, a prefix of every later one)
and how far it was handed to the store. At each step's save point
:meth:`SaveQueue.ready` gives the wants to hand (again) to the store: one
never handed over, one whose handed part is committed and that has blocks
beyond it, or one whose handed part is still not committed ``retry_ms`` after
(the store writes from its committed prefix on: what an earlier save skipped,
or what another request's save left out). A want is done once its whole
chain is committed, or given up after ``max_attempts`` hand-overs (its
uncommitted blocks counted in ``counters["save_gave_up_blocks"]``).

All this reads a request's pages after the step that handed its save over:
only for an engine that says when a request's pages may be reused
(``keep=True``). Otherwise (``keep=False``) every save is handed over in the
step that asked for it and forgotten (the store skips what it cannot take).

A request's pages may be reused once it finishes or is preempted: the engine
says so before anything can overwrite them, and :meth:`flush` waits (at most
``flush_wait_ms``) for each such want's handed part to commit and returns it
to hand over one last time; the want is gone after. Counters (all since the
last :meth:`take_counters`): ``save_flushed``, ``save_flush_timeouts``,
``save_dropped_blocks`` (wants of requests whose pages were already stale),
``save_gave_up_blocks``, ``save_queue_full`` (wants dropped for the limit).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, List

RETRY_MS = 200  # a handed-over part still uncommitted this long is handed over again
MAX_ATTEMPTS = 50  # hand-overs of one want's blocks before it is given up
FLUSH_WAIT_MS = 2000  # what a finishing request's last chunk may wait for the one before it
MAX_WANTS = 65536  # requests with a save in the queue (beyond: the oldest is dropped, counted)
POLL_S = 0.001


@dataclass
class _Want:
    spec: object  # SaveSpec: req_id, chain, block_ids, ...
    handed: int = 0  # chain blocks handed to the store so far
    handed_at: float = 0.0
    attempts: int = 0


class SaveQueue:
    def __init__(self, lookup: Callable[[List[int]], int], retry_ms: int = RETRY_MS, max_attempts: int = MAX_ATTEMPTS,
                 flush_wait_ms: int = FLUSH_WAIT_MS, max_wants: int = MAX_WANTS, clock=time.monotonic,
                 sleep=time.sleep, keep: bool = True):
        """``lookup(chain)``: the committed leading blocks of chain
        (Store.lookup); ``keep``: the engine ends requests explicitly (see the
        module doc)."""
        for k, v in (("retry_ms", retry_ms), ("max_attempts", max_attempts), ("flush_wait_ms", flush_wait_ms),
                     ("max_wants", max_wants)):
            if not isinstance(v, int) or v < (0 if k == "flush_wait_ms" else 1):
                raise ValueError(f"SaveQueue {k} = {v!r}: want an int >= {0 if k == 'flush_wait_ms' else 1}")
        self._lookup, self._clock, self._sleep, self.keep = lookup, clock, sleep, keep
        self.retry_s, self.max_attempts = retry_ms / 1000, max_attempts
        self.flush_wait_s, self.max_wants = flush_wait_ms / 1000, max_wants
        self._wants: "OrderedDict[str, _Want]" = OrderedDict()
        self.counters = Counter()

    def __len__(self):
        return len(self._wants)

    def pending(self, req_id: str) -> bool:
        return req_id in self._wants

    def unhanded(self, req_id: str) -> int:
        """Blocks of the request's want never handed to the store yet."""
        w = self._wants.get(req_id)
        return len(w.spec.chain) - w.handed if w is not None else 0

    def pages(self, req_id: str) -> List[int]:
        """The page ids the request's want saves from (empty if none)."""
        w = self._wants.get(req_id)
        return list(w.spec.block_ids) if w is not None else []

    def add(self, spec):
        """The request's newest save (its chain extends the one queued)."""
        w = self._wants.get(spec.req_id)
        if w is None:
            while len(self._wants) >= self.max_wants:
                _, old = self._wants.popitem(last=False)
                self.counters["save_queue_full"] += 1
                self.counters["save_dropped_blocks"] += len(old.spec.chain) - old.handed
            self._wants[spec.req_id] = _Want(spec)
        else:
            w.spec = spec
            w.attempts = 0  # new blocks: a fresh budget of hand-overs

    def _state(self, w: _Want, now: float):
        """("done" | "hand" | "wait" | "give_up", committed blocks)."""
        n = len(w.spec.chain)
        committed = self._lookup(w.spec.chain) if w.handed else 0
        if committed >= n:
            return "done", committed
        if w.handed == 0 or (committed >= w.handed and n > w.handed):
            return "hand", committed
        if now - w.handed_at >= self.retry_s:
            return ("give_up" if w.attempts >= self.max_attempts else "hand"), committed
        return "wait", committed

    def ready(self) -> List[object]:
        """The specs to hand to the store now (each marked handed)."""
        if not self.keep:
            out = [w.spec for w in self._wants.values()]
            self._wants.clear()
            return out
        now, out = self._clock(), []
        for rid, w in list(self._wants.items()):
            state, committed = self._state(w, now)
            if state == "done":
                del self._wants[rid]
            elif state == "give_up":
                self.counters["save_gave_up_blocks"] += len(w.spec.chain) - committed
                del self._wants[rid]
            elif state == "hand":
                self._hand(w, now)
                out.append(w.spec)
        return out

    def _hand(self, w: _Want, now: float):
        w.handed, w.handed_at = len(w.spec.chain), now
        w.attempts += 1

    def flush(self, req_ids: Iterable[str]) -> List[object]:
        """The last hand-over of each given request's want, once the part
        handed before is committed (waiting at most flush_wait_ms over all of
        them; past it the want is handed over anyway, counted); the wants are
        removed."""
        wants = [self._wants.pop(rid) for rid in req_ids if rid in self._wants]
        deadline, out = self._clock() + self.flush_wait_s, []
        for w in wants:
            n = len(w.spec.chain)
            while True:
                committed = self._lookup(w.spec.chain) if w.handed else 0
                if committed >= n:
                    break
                if w.handed == 0 or committed >= w.handed:
                    out.append(w.spec)
                    break
                if self._clock() >= deadline:
                    self.counters["save_flush_timeouts"] += 1
                    out.append(w.spec)
                    break
                self._sleep(POLL_S)
            self.counters["save_flushed"] += 1
        return out

    def drop(self, req_ids: Iterable[str]):
        """Forget the wants of requests whose pages may already hold other KV."""
        for rid in req_ids:
            w = self._wants.pop(rid, None)
            if w is not None:
                self.counters["save_dropped_blocks"] += len(w.spec.chain) - w.handed

    def take_counters(self) -> Counter:
        c, self.counters = self.counters, Counter()
        return c
