"""The scheduler's lookup across processes.

A store's directories are locked by the one process that opened it (the
worker of a rank), so the scheduler process (vLLM's EngineCore) never opens
them. Instead each worker serves its store's :meth:`Store.match` on a Unix
socket (:class:`LookupServer`), and the scheduler asks every rank
(:class:`RemoteMatcher`): a prefix is a hit only as far as every rank holds
it (the minimum), and each rank holds what it answered (pinned against
eviction and discards) until its worker started the load, the scheduler
released it, or its lease ran out. So the answer stays true under
concurrent saves and evictions: nothing is read from a stale copy of an
index, and a dead worker's pins die with its process.

The scheduler never waits on a rank: :meth:`RemoteMatcher.query` sends a
lookup to every rank (one thread and one connection per rank, requests in
order) and answers ``None`` until every rank answered; a rank that fails, or
has not answered within the timeout, makes the lookup a miss.

Protocol (one request per line, JSON, at most ``MAX_LINE_BYTES``):
``{"op": "match", "req": id, "chain": [...], "skip": k}`` → ``{"blocks": n}``;
``{"op": "release", "req": id}`` → ``{}``; errors → ``{"error": text}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from . import _args

MAX_LINE_BYTES = 16 << 20
MAX_CONNECTIONS = 16
MAX_QUEUED_CALLS = 4096  # per rank: calls waiting for the rank's connection (beyond: the call fails)


def socket_path(sock_dir: str, key: str, rank: int) -> str:
    """Where rank ``rank`` of the deployment ``key`` (engine id and store
    directories) listens; short enough for sun_path."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return os.path.join(sock_dir, f"tutti-{digest}-r{rank}.sock")


class LookupServer:
    """Serves ``matcher`` (a LocalMatcher over this worker's store) on a Unix
    socket, one thread per connection (at most MAX_CONNECTIONS)."""

    def __init__(self, path: str, matcher):
        _args.string("path", path)
        if not callable(getattr(matcher, "match", None)):
            raise TypeError(f"matcher = {matcher!r}: want an object with match(req_id, chain, skip)")
        self.path, self.matcher = path, matcher
        try:
            os.unlink(path)  # a previous run's socket; the store lock already proved we own these dirs
        except FileNotFoundError:
            pass
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        os.chmod(path, 0o600)
        self._sock.listen(MAX_CONNECTIONS)
        self._closed = False
        self._conns: List[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="tutti-lookup", daemon=True)
        self._thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed or len(self._conns) >= MAX_CONNECTIONS:
                    conn.close()
                    continue
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), name="tutti-lookup-conn", daemon=True).start()

    def _serve(self, conn):
        f = conn.makefile("rwb")
        try:
            while True:
                line = f.readline(MAX_LINE_BYTES + 1)
                if not line:
                    return
                if len(line) > MAX_LINE_BYTES:  # the rest of it would read as requests: end the connection
                    f.write((json.dumps({"error": f"request longer than {MAX_LINE_BYTES} bytes"}) + "\n").encode())
                    f.flush()
                    return
                f.write((json.dumps(self._answer(line)) + "\n").encode())
                f.flush()
        except OSError:
            return
        finally:
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
            try:
                f.close()  # flushes: the peer may be gone
            except OSError:
                pass
            conn.close()

    def _answer(self, line: bytes) -> dict:
        try:
            req = json.loads(line)
            if req.get("op") == "match":
                return {"blocks": self.matcher.match(str(req["req"]), [int(x) for x in req["chain"]], int(req["skip"]))}
            if req.get("op") == "release":
                self.matcher.release(str(req["req"]))
                return {}
            return {"error": f"unknown op {req.get('op')!r}"}
        except Exception as e:  # a bad request is answered, never fatal to the worker
            return {"error": f"{type(e).__name__}: {e}"}

    def close(self):
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), []
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the server thread
        except OSError:
            pass
        self._sock.close()
        self._thread.join(5)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class LookupUnavailable(ConnectionError):
    """A rank's lookup server did not answer (the request is a miss)."""


class _Client:
    def __init__(self, path: str, timeout_s: float):
        self.path, self.timeout_s = path, timeout_s
        self._s = self._f = None

    def call(self, msg: dict) -> dict:
        for attempt in range(2):  # one reconnect: the worker may have restarted its server
            try:
                if self._f is None:
                    self._s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    self._s.settimeout(self.timeout_s)
                    self._s.connect(self.path)
                    self._f = self._s.makefile("rwb")
                self._f.write((json.dumps(msg) + "\n").encode())
                self._f.flush()
                line = self._f.readline(MAX_LINE_BYTES + 1)
                if not line:
                    raise OSError("connection closed")
                out = json.loads(line)
                if "error" in out:
                    raise LookupUnavailable(f"{self.path}: {out['error']}")
                return out
            except (OSError, ValueError) as e:
                self.close()
                if attempt == 1:
                    raise LookupUnavailable(f"lookup server {self.path}: {e}") from e
        raise AssertionError("unreachable")

    def close(self):
        for x in (self._f, self._s):
            if x is not None:
                try:
                    x.close()
                except OSError:
                    pass
        self._s = self._f = None


class LookupTimeout(LookupUnavailable):
    """A rank did not answer a lookup within the timeout (the request is a miss)."""


class _Rank:
    """One rank's connection, driven by its own thread: calls run in the
    order they were queued, callbacks get (answer, error)."""

    def __init__(self, path: str, timeout_s: float):
        self.client = _Client(path, timeout_s)
        self.calls: "queue.Queue" = queue.Queue(MAX_QUEUED_CALLS)
        self.thread = threading.Thread(target=self._run, name="tutti-lookup-client", daemon=True)
        self.thread.start()

    def submit(self, msg: dict, done=None) -> bool:
        try:
            self.calls.put_nowait((msg, done))
            return True
        except queue.Full:
            return False

    def _run(self):
        while True:
            item = self.calls.get()
            if item is None:
                self.client.close()
                return
            msg, done = item
            try:
                out, err = self.client.call(msg), None
            except LookupUnavailable as e:
                out, err = None, e
            if done is not None:
                done(out, err)

    def stop(self):
        try:
            self.calls.put_nowait(None)
        except queue.Full:
            pass  # a daemon thread: it ends with the process


@dataclass
class _Query:
    chain: List[int]
    skip: int
    deadline: float
    answers: Dict[int, int] = field(default_factory=dict)
    error: Optional[Exception] = None


class RemoteMatcher:
    """The scheduler's matcher over N ranks' lookup servers: the hit is the
    minimum over ranks. :meth:`query` never blocks; :meth:`match` waits for
    its answer. A rank that fails or does not answer within ``timeout_s``
    raises :class:`LookupUnavailable` (:class:`LookupTimeout`) for that
    lookup: the caller counts it and treats the request as a miss."""

    def __init__(self, paths: Sequence[str], timeout_s: float = 2.0, clock=time.monotonic):
        if isinstance(paths, (str, bytes)) or not hasattr(paths, "__iter__"):
            raise TypeError(f"paths = {paths!r}: want a list of socket paths")
        paths = [_args.string(f"paths[{i}]", p) for i, p in enumerate(paths)]
        if not paths:
            raise ValueError("paths = []: want at least one rank's socket")
        if _args.real("timeout_s", timeout_s) <= 0:
            raise ValueError(f"timeout_s = {timeout_s!r}: want > 0")
        self.timeout_s, self._clock = timeout_s, clock
        self._ranks = [_Rank(p, timeout_s) for p in paths]
        self._lock = threading.Lock()
        self._queries: Dict[str, _Query] = {}
        self.counters = Counter()

    def query(self, req_id: str, chain: Sequence[int], skip: int) -> Optional[int]:
        """The blocks every rank holds after ``skip`` (each rank holding its
        answer for the request), or None while answers are missing; the
        first call for a (request, chain, skip) sends the lookup. An answer
        is given once: a later call asks again."""
        chain = [int(x) for x in chain]
        with self._lock:
            q = self._queries.get(req_id)
            if q is not None and (q.skip != skip or q.chain != chain):
                del self._queries[req_id]  # asked again with other local hits: the old answer is moot
                q = None
            if q is None:
                q = self._queries[req_id] = self._send(req_id, chain, skip)
            if q.error is None and len(q.answers) < len(self._ranks) and self._clock() < q.deadline:
                return None
            del self._queries[req_id]
        if q.error is None and len(q.answers) < len(self._ranks):
            q.error = LookupTimeout(f"{len(self._ranks) - len(q.answers)} of {len(self._ranks)} ranks did not answer "
                                    f"within {self.timeout_s:g} s")
        if q.error is not None:
            self._release_all(req_id)
            raise q.error
        got = min(q.answers.values())
        if got == 0 and max(q.answers.values()) > 0:
            self._release_all(req_id)  # no hit: nothing to hold on the ranks that had one
        return got

    def _send(self, req_id: str, chain: List[int], skip: int) -> _Query:
        q = _Query(chain, skip, self._clock() + self.timeout_s)
        msg = {"op": "match", "req": req_id, "chain": chain, "skip": skip}
        for r, rank in enumerate(self._ranks):
            def done(out, err, r=r):
                with self._lock:
                    if err is not None:
                        q.error = q.error or err
                    else:
                        try:
                            q.answers[r] = int(out["blocks"])
                        except (KeyError, TypeError, ValueError) as e:
                            q.error = q.error or LookupUnavailable(f"rank {r}: bad answer {out!r}: {e}")
            if not rank.submit(msg, done):
                q.error = LookupUnavailable(f"rank {r}: {MAX_QUEUED_CALLS} lookups already queued")
                self.counters["queue_full"] += 1
                break
        return q

    def match(self, req_id: str, chain: Sequence[int], skip: int) -> int:
        """:meth:`query`, waited for."""
        while True:
            got = self.query(req_id, chain, skip)
            if got is not None:
                return got
            time.sleep(0.001)

    def release(self, req_id: str):
        with self._lock:
            self._queries.pop(req_id, None)
        self._release_all(req_id)

    def _release_all(self, req_id: str):
        for rank in self._ranks:
            if not rank.submit({"op": "release", "req": req_id}):
                self.counters["release_dropped"] += 1  # that rank's hold ends by its lease

    def close(self):
        for rank in self._ranks:
            rank.stop()


def wait_for(paths: Sequence[str], timeout_s: float) -> Optional[str]:
    """Returns None once every path is a socket, else the first missing one
    after timeout_s."""
    import time
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [p for p in paths if not os.path.exists(p)]
        if not missing:
            return None
        if time.monotonic() > deadline:
            return missing[0]
        time.sleep(0.02)
