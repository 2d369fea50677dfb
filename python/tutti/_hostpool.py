"""The pieces under tutti.hoststage: the pool's default size, the pinned
host page pool, the streams its copies run on (torch imported on first use)
and the thread that hands its saves to the store."""

from __future__ import annotations

import logging
import mmap
import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import List, Optional, Tuple

log = logging.getLogger("tutti.hoststage")

Extents = List[Tuple[int, int]]  # (first pool page, pages)

HOST_STAGING_BYTES_DEFAULT = 1 << 30  # the least a pool sized by default_bytes is
HOST_STAGING_BYTES_AUTO_MAX = 16 << 30  # the most a pool sized by default_bytes is
STAGING_REQUESTS = 2  # a pool sized by default_bytes holds this many of the engine's longest requests


@dataclass(frozen=True)
class SizedFor:
    """A ``host_staging_bytes`` of :func:`default_bytes` for requests of at
    most ``tokens`` tokens (an engine's longest, e.g. vLLM's max_model_len);
    ``parts``: the pool is one of that many (a hybrid model's groups), its
    floor and cap divided among them."""

    tokens: int
    parts: int = 1

    def __post_init__(self):
        for k in ("tokens", "parts"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SizedFor.{k} = {v!r}: want an integer >= 1")


def default_bytes(geometry, sized: SizedFor) -> int:
    """The pool when none is given: room for STAGING_REQUESTS requests of
    ``sized.tokens`` tokens of this KV (every layer, whole chain blocks: a
    save needs all its new blocks' pages free at once, else it is skipped;
    a load larger than its share goes in rounds), at least
    HOST_STAGING_BYTES_DEFAULT and at most HOST_STAGING_BYTES_AUTO_MAX (each
    divided by ``sized.parts``). HostStaging then cuts it to the engine's
    cache."""
    block_tokens = geometry.page_tokens * geometry.chunk_pages
    block_bytes = geometry.layers * geometry.page_bytes_per_layer * geometry.chunk_pages
    want = STAGING_REQUESTS * -(-sized.tokens // block_tokens) * block_bytes
    return min(max(want, HOST_STAGING_BYTES_DEFAULT // sized.parts), HOST_STAGING_BYTES_AUTO_MAX // sized.parts)


_torch = None


def torch_module():
    global _torch
    if _torch is None:
        import torch
        _torch = torch
    return _torch


def int_dtype(nbytes: int):
    """Copies move bits: the integer type of the element's size (also for
    dtypes some copy kernels lack, such as fp8)."""
    t = torch_module()
    return {1: t.uint8, 2: t.int16, 4: t.int32}[nbytes]


class Pool:
    """Host pages in tutti's per_layer layout: region l is (planes, pages,
    page elements), all layers in one anonymous mapping (page-aligned, off
    the Python heap), pinned with cudaHostRegister when the engine is on
    CUDA. Freed by :meth:`close`."""

    def __init__(self, geometry, pages: int, pin: bool):
        torch = torch_module()
        g = geometry
        self.pages = pages
        self.layer_bytes = g.planes * pages * g.page_bytes_per_plane
        self.nbytes = g.layers * self.layer_bytes
        self._mm = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        flat = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.addr = flat.data_ptr()
        self._pinned = False
        if pin:
            rc = torch.cuda.cudart().cudaHostRegister(self.addr, self.nbytes, 0)
            if int(rc) != 0:
                del flat
                self._mm.close()
                raise RuntimeError(f"host staging: cudaHostRegister of {self.nbytes} bytes failed (cudaError {int(rc)}); "
                                   "lower host_staging_bytes or raise the memlock limit")
            self._pinned = True
        unit = g.page_bytes_per_plane // g.dtype_bytes
        it = int_dtype(g.dtype_bytes)
        self.layers = [flat[i * self.layer_bytes:(i + 1) * self.layer_bytes].view(it).view(g.planes, pages, unit)
                       for i in range(g.layers)]
        self._free: Extents = [(0, pages)]

    @property
    def free_pages(self) -> int:
        return sum(n for _, n in self._free)

    def regions(self):
        return tuple((self.addr + i * self.layer_bytes, self.layer_bytes) for i in range(len(self.layers)))

    def take(self, n: int) -> Optional[Extents]:
        """Exactly ``n`` pages (one extent where one is long enough), or None."""
        if n <= 0 or self.free_pages < n:
            return None
        for i, (a, m) in enumerate(self._free):
            if m >= n:
                self._free[i:i + 1] = [(a + n, m - n)] if m > n else []
                return [(a, n)]
        out, left = [], n
        while left:
            a, m = self._free[0]
            k = min(m, left)
            out.append((a, k))
            self._free[0:1] = [(a + k, m - k)] if m > k else []
            left -= k
        return out

    def give(self, extents: Extents):
        merged: Extents = []
        for a, n in sorted(self._free + [e for e in extents if e[1]]):
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((a, n))
        self._free = merged

    def close(self):
        """Unpins and unmaps; every copy into or out of the pool must be
        complete (the caller's events) and no transfer may use it."""
        if self._mm is None:
            return
        self.layers = []
        if self._pinned:
            torch_module().cuda.cudart().cudaHostUnregister(self.addr)
            self._pinned = False
        try:
            self._mm.close()
        except BufferError:  # a view of the pool outlived close: the mapping goes with it
            log.warning("host staging: a view of the pool is still referenced; its %d bytes are freed with it", self.nbytes)
        self._mm = None


def expand(extents: Extents) -> List[int]:
    return [p for a, n in extents for p in range(a, a + n)]


class Streams:
    """Where the copies run: a side stream on CUDA (the engine's stream waits
    on events, no host round trip); plain synchronous copies elsewhere."""

    def __init__(self, device):
        torch = torch_module()
        self.device = device
        self.cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device=device) if self.cuda else None

    def engine(self):
        return torch_module().cuda.current_stream(self.device) if self.cuda else None

    @contextmanager
    def on_side(self, after_engine: bool = False):
        """Copies issued inside run on the side stream; ``after_engine``: they
        also wait for the engine's work so far (pages it still reads or has
        just written)."""
        if not self.cuda:
            yield
            return
        torch = torch_module()
        if after_engine:
            self.side.wait_stream(self.engine())
        with torch.cuda.device(self.device), torch.cuda.stream(self.side):
            yield

    def mark(self, blocking: bool = False):
        """An event after every copy issued so far (None: they are done);
        ``blocking``: a host thread waiting for it sleeps instead of spinning."""
        if not self.cuda:
            return None
        ev = torch_module().cuda.Event(blocking=blocking)
        ev.record(self.side)
        return ev

    def engine_waits(self, ev):
        if ev is not None:
            self.engine().wait_event(ev)

    @staticmethod
    def done(ev) -> bool:
        return ev is None or ev.query()

    @staticmethod
    def sync(ev):
        if ev is not None:
            ev.synchronize()


class Issuer:
    """A thread that runs each put item's ``issue()`` (which never raises), in
    order: host staging's, handing saves to the store once their copies
    completed, so that neither the engine's step nor its host waits for the
    copies. Its queue is bounded by the pool: every save in it holds pool
    pages. Started by the first put, ended by close."""

    def __init__(self, name: str):
        self._name = name
        self._q: deque = deque()
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def put(self, sv):
        with self._cv:
            if self._closed:
                raise RuntimeError("host staging closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._q.append(sv)
            self._cv.notify()

    def _run(self):
        while True:
            with self._cv:
                while not self._q and not self._closed:
                    self._cv.wait()
                if not self._q:
                    return
                sv = self._q.popleft()
            sv.issue()

    def close(self):
        """Ends the thread once every save put was handed over."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
