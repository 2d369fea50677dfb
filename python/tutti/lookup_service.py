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

Protocol (one request per line, JSON, at most ``MAX_LINE_BYTES``):
``{"op": "match", "req": id, "chain": [...], "skip": k}`` → ``{"blocks": n}``;
``{"op": "release", "req": id}`` → ``{}``; errors → ``{"error": text}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from typing import List, Optional, Sequence

MAX_LINE_BYTES = 16 << 20
MAX_CONNECTIONS = 16


def socket_path(sock_dir: str, key: str, rank: int) -> str:
    """Where rank ``rank`` of the deployment ``key`` (engine id and store
    directories) listens; short enough for sun_path."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return os.path.join(sock_dir, f"tutti-{digest}-r{rank}.sock")


class LookupServer:
    """Serves ``matcher`` (a LocalMatcher over this worker's store) on a Unix
    socket, one thread per connection (at most MAX_CONNECTIONS)."""

    def __init__(self, path: str, matcher):
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
            f.close()
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


class RemoteMatcher:
    """The scheduler's matcher over N ranks' lookup servers: the hit is the
    minimum over ranks. Raises :class:`LookupUnavailable` when a rank does
    not answer (the caller counts it and treats the request as a miss)."""

    def __init__(self, paths: Sequence[str], timeout_s: float = 2.0):
        self._clients = [_Client(p, timeout_s) for p in paths]
        self._lock = threading.Lock()

    def match(self, req_id: str, chain: Sequence[int], skip: int) -> int:
        msg = {"op": "match", "req": req_id, "chain": [int(x) for x in chain], "skip": skip}
        with self._lock:
            try:
                got = [c.call(msg)["blocks"] for c in self._clients]
            except LookupUnavailable:
                self._release_locked(req_id)
                raise
            if min(got) == 0 and max(got) > 0:
                self._release_locked(req_id)  # no hit: nothing to hold on the ranks that had one
            return min(got)

    def release(self, req_id: str):
        with self._lock:
            self._release_locked(req_id)

    def _release_locked(self, req_id: str):
        for c in self._clients:
            try:
                c.call({"op": "release", "req": req_id})
            except LookupUnavailable:
                pass  # that rank's hold ends by its lease

    def close(self):
        for c in self._clients:
            c.close()


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
