"""Host staging: tutti's CPU path for a KV cache that is not in host memory.

The CPU path's I/O (io_uring O_DIRECT reads and writes driven from Go) needs
host memory, while an engine's KV cache is on a GPU. A :class:`HostStaging`
puts a bounded pool of pinned host pages between the two: the store opens on
the CPU path over the pool (same per-page geometry and byte order as the
engine's pages, so a store written by either path is read by the other), and
every transfer is one extra copy through the pool:

* **load** of n blocks into engine pages g[0..n): n pool pages are taken,
  ``Store.load_with`` reads into them, and per layer, once that layer is in
  the pool (``Load.wait_layer``), its page planes are copied into the
  engine's pages with an asynchronous host-to-device copy on a side stream
  the engine's current stream is made to wait for (no host round trip). The
  pages go back to the pool once the copies are complete (a CUDA event).
* **save**: the blocks after the stored prefix are copied from the engine's
  pages (every layer) into pool pages with an asynchronous device-to-host
  copy on the side stream, after the engine's work so far (no host round
  trip: neither the engine's stream nor its host waits). A thread of the
  staging's own (``tutti-staged-saves``) waits for each save's copies,
  oldest first, and hands it to the store (``Store.save`` from the pool).
  The engine's pages are free once the copies completed (the save's
  ``gathered``; ``wait_gathered`` waits for them); the pool pages go back
  once the store gathered them, waited for only when the pool needs them.
  :meth:`HostStaging.drain` returns once every save so far was handed to
  the store (``Store.wait_saves`` then covers them). A save the store
  refuses then (closed, busy) is counted (``staging_failed_saves``) and
  logged, its pool pages given back.

Limits and partial results. The pool is ``host_staging_bytes`` (at most
:data:`HOST_STAGING_BYTES_MAX`; by default, :class:`SizedFor` the engine's
longest request: :func:`default_bytes`), never more pages than the engine's
cache: a staging area, not a mirror.
The loads of a step share the free pages; a load larger than its share runs
in rounds of that share (every round but the last is read and copied whole
at the step's first layer wait, so its layers are not pipelined with the
forward). A load that gets no page at all restores nothing: its blocks are
reported not restored, as a short load of the GPU path (the engine
recomputes them), with :class:`HostStagingExhausted` as its failure. A save
that finds too few free pages is skipped. Each is counted (:data:`COUNTERS`)
and logged; nothing here ever waits for pages except on copies already
issued or saves already gathering, which end on their own.

The copies go per layer over the block dimension of each layer's tensor seen
as (planes, pages, page elements) where ``Geometry.page_offset`` places them,
so they hold for every layout ``describe_kv_caches`` accepts. On CUDA they
are asynchronous on a side stream; on CPU tensors (a GPU cache's stand-in in
tests) plain synchronous copies, through the same code. Needs torch
(imported when a HostStaging is built).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from . import _lib
from ._hostpool import Extents, expand, int_dtype, Issuer, Pool, Streams, torch_module
from ._hostpool import HOST_STAGING_BYTES_AUTO_MAX, HOST_STAGING_BYTES_DEFAULT, STAGING_REQUESTS  # noqa: F401 (API)
from ._hostpool import SizedFor, default_bytes  # noqa: F401 (API)

log = logging.getLogger("tutti.hoststage")

HOST_STAGING_BYTES_MAX = 64 << 30

#: What a HostStaging counts (reported through ``WorkerSide.take_stats``).
COUNTERS = (
    "staging_loads",  # loads started through the pool
    "staging_load_rounds",  # rounds beyond a load's first (it was larger than its share of the pool)
    "staging_short_blocks",  # blocks of loads not restored: no pool page was free for them
    "staging_saves",  # saves started from the pool
    "staging_skipped_saves",  # saves skipped: too few free pool pages
    "staging_skipped_save_blocks",  # their blocks
    "staging_failed_saves",  # saves the store refused once their copies completed (closed, busy): pages given back
    "staging_h2d_bytes",  # bytes copied pool -> engine pages
    "staging_d2h_bytes",  # bytes copied engine pages -> pool
)


class HostStagingExhausted(RuntimeError):
    """A load's blocks not restored because no pool page was free for them
    (the failure a short load reports; the engine recomputes them)."""


def check_host_staging_bytes(value, what: str = "host_staging_bytes") -> int:
    """``value`` checked against the documented limit (``what`` names it in
    the error)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= HOST_STAGING_BYTES_MAX:
        raise ValueError(f"{what} = {value!r}: want bytes in 1..{HOST_STAGING_BYTES_MAX} (64 GiB)")
    return value


def _device_views(kv_caches, lay, names):
    """Each layer's tensor as (planes, pages, page elements) of an integer
    type, at the byte offsets Geometry.page_offset gives for the layout
    describe_kv_caches read (the one statement of where a page lies)."""
    torch = torch_module()
    g, nb = lay.geometry, lay.num_pages
    esize = g.dtype_bytes
    unit = g.page_bytes_per_plane // esize
    it = int_dtype(esize)
    out = []
    for i, name in enumerate(names):
        t = kv_caches[name]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kv_caches[{name!r}]: host staging copies with torch, got {type(t).__name__}")
        base = lay.regions[i][0] if lay.layout == "per_layer" else lay.regions[0][0]
        off0 = g.page_offset(lay.layout, nb, i, 0, 0)
        if base + off0 != t.data_ptr():
            raise ValueError(f"kv_caches[{name!r}]: starts at {t.data_ptr():#x}, its layout places it at {base + off0:#x}")
        block = (g.page_offset(lay.layout, nb, i, 0, 1) - off0) // esize
        plane = (g.page_offset(lay.layout, nb, i, 1, 0) - off0) // esize if g.planes == 2 else 0
        out.append(t.as_strided((g.planes, nb, unit), (plane, block, 1), t.storage_offset()).view(it))
    return out


def _shares(demands: Dict[str, int], free: int) -> Dict[str, int]:
    """``free`` units split over ``demands``: no one gets more than asked,
    the rest evenly (water-filling, smallest demands first)."""
    out, left = {}, free
    items = sorted(demands.items(), key=lambda kv: kv[1])
    for i, (k, d) in enumerate(items):
        out[k] = min(d, left // (len(items) - i))
        left -= out[k]
    for k, d in items:  # what the even split rounded down
        extra = min(d - out[k], left)
        out[k] += extra
        left -= extra
    return out


class HostStaging:
    """The pool, the engine's tensors and the copies between them, for one
    WorkerSide (see the module doc). Built by ``WorkerSide.register`` before
    the store opens (:attr:`layout` is what the store is opened and
    registered with), bound to the store by :meth:`bind`, closed after the
    store stopped using the pool (:meth:`close`)."""

    def __init__(self, kv_caches, lay, host_staging_bytes, hold_ttl_ms: int = 30000):
        """``lay``: the engine tensors' KVLayout (describe_kv_caches);
        ``host_staging_bytes``: the pool's bytes, or a :class:`SizedFor`
        (:func:`default_bytes` of this KV); ``hold_ttl_ms``: how long a load
        in rounds pins the blocks of its later rounds at most."""
        torch = torch_module()
        g = lay.geometry
        if isinstance(host_staging_bytes, SizedFor):
            host_staging_bytes = default_bytes(g, host_staging_bytes)
        check_host_staging_bytes(host_staging_bytes)
        block_bytes = g.layers * g.page_bytes_per_layer * g.chunk_pages
        pages = min(host_staging_bytes // block_bytes, lay.num_pages // g.chunk_pages) * g.chunk_pages
        if pages == 0:
            raise ValueError(f"host_staging_bytes = {host_staging_bytes}: less than one chain block ({block_bytes} bytes: "
                             f"{g.layers} layers x {g.page_bytes_per_layer} bytes x {g.chunk_pages} pages)")
        self.device = torch.device(lay.device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"host staging: KV cache on {lay.device}; copies are written for cuda (and cpu in tests)")
        self._views = _device_views(kv_caches, lay, lay.layer_names)
        self._streams = Streams(self.device)
        self._pool = Pool(g, pages, pin=self._streams.cuda)
        self.geometry, self.pages, self.hold_ttl_ms = g, pages, hold_ttl_ms
        self.host_staging_bytes = host_staging_bytes
        self.layout = dataclasses.replace(lay, layout="per_layer", num_pages=pages, regions=self._pool.regions(), device="cpu")
        self.store = None
        self.counters: Dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._reported = dict.fromkeys(COUNTERS, 0)
        self._warned = set()
        self._share: Dict[str, int] = {}  # request -> pool pages planned for its load this step
        self._active: List["_StagedLoad"] = []  # loads whose pages are still theirs
        self._saves: List["_StagedSave"] = []  # saves whose pool pages are still theirs, oldest first
        self._issuer = Issuer("tutti-staged-saves")
        self._pending: List[Tuple[Extents, object]] = []  # pages back once the event completes
        log.info("tutti: host staging for a KV cache on %s: %d pages of %d layers, %d MiB%s", lay.device, pages, g.layers,
                 self._pool.nbytes >> 20, " pinned" if self._streams.cuda else "")

    def bind(self, store):
        if store.path != "cpu":
            raise ValueError(f"host staging needs a store on the CPU path, the opener gave path {store.path!r}")
        self.store = store

    @property
    def pages_in_use(self) -> int:
        return self.pages - self._pool.free_pages if self._pool is not None else 0

    def _count(self, key: str, n: int = 1, why: str = ""):
        self.counters[key] += n
        if why:  # a shortfall: logged once as a warning, counted always
            (log.debug if key in self._warned else log.warning)("tutti: host staging: %s (counted in %s)", why, key)
            self._warned.add(key)

    def take_counters(self) -> Dict[str, int]:
        """The counters' growth since the last call (non-zero ones); saves
        the store refused since are counted first."""
        if self._pool is not None:
            self._reclaim(wait=False)
        out = {k: v - self._reported[k] for k, v in self.counters.items() if v != self._reported[k]}
        self._reported = dict(self.counters)
        return out

    # -- pages
    def _reclaim(self, wait: bool, need: int = 0):
        """Gives back the pages of loads whose copies completed and of saves
        the store gathered; ``wait``: waits for the copies already issued,
        then, oldest first, for saves to be handed over and gathered until
        ``need`` pages are free (each wait ends on its own: copies complete,
        a save gathers within the save bound)."""
        keep = []
        for ext, ev in self._pending:
            if wait:
                self._streams.sync(ev)
            if self._streams.done(ev):
                self._pool.give(ext)
            else:
                keep.append((ext, ev))
        self._pending = keep
        for sv in [sv for sv in self._saves if sv.stored()]:
            sv.finish()
        while wait and self._saves and self._pool.free_pages < need:
            self._saves[0].finish()

    def drain(self):
        """Returns once every save so far was handed to the store (its
        copies completed): ``Store.wait_saves`` then covers them."""
        for sv in list(self._saves):
            sv.wait_handed()

    def _release_after(self, extents: Extents, ev):
        self._pending.append((extents, ev))
        self._reclaim(wait=False)

    def plan_loads(self, specs: Sequence) -> None:
        """Splits the free pages over the step's loads (LoadSpecs) before
        :meth:`load` starts them."""
        cp = self.geometry.chunk_pages
        want = {s.req_id: len(s.chain) - s.skip for s in specs if len(s.chain) > s.skip}
        self._reclaim(wait=False)
        if sum(want.values()) * cp > self._pool.free_pages:
            self._reclaim(wait=True, need=sum(want.values()) * cp)  # earlier copies and saves
        self._share = {k: v * cp for k, v in _shares(want, self._pool.free_pages // cp).items()}

    # -- transfers
    def load(self, spec) -> "_StagedLoad":
        """Starts restoring ``spec`` (a LoadSpec) through the pool; returns a
        Load-like object (wait_layer, wait, failure, release)."""
        cp = self.geometry.chunk_pages
        n = len(spec.chain) - spec.skip
        share = self._share.pop(spec.req_id, None)
        if share is None:  # not planned: what is free now
            self._reclaim(wait=False)
            share = self._pool.free_pages // cp * cp
        pages = min(n * cp, share)
        ld = _StagedLoad(self, spec, self._pool.take(pages) if pages else None)
        self.counters["staging_loads"] += 1
        return ld

    def _finish_copied_loads(self):
        for ld in list(self._active):
            if ld.all_copied():
                ld.wait()

    def save(self, chain: Sequence[int], block_ids: Sequence[int], tokens=None, hashes=None) -> Optional["_StagedSave"]:
        """Copies the blocks' engine pages (every layer) into pool pages, on
        the side stream after the engine's work so far (its current stream
        wrote the KV), and hands the save to the store once the copies
        completed (the staging's thread; at once where they are synchronous,
        and then the store's error is raised here); returns without waiting
        for them. None when every block is stored or too few pages are free
        (the save is skipped, counted)."""
        cp = self.geometry.chunk_pages
        # The stored prefix (local hits, loaded blocks) takes no pool page: it
        # is pinned until the save has reserved past it, and the store skips it.
        hold = self.store.match(chain, skip=0, ttl_ms=self.hold_ttl_ms)
        ext, taken = None, False  # taken: the save owns the hold and the pages
        try:
            stored = hold.blocks
            if stored >= len(chain):
                return None
            new = list(block_ids[stored * cp:])
            ext = self._pool.take(len(new))
            if ext is None:
                self._finish_copied_loads()  # this step's loads are copied: their pages are done once the copies are
                self._reclaim(wait=True, need=len(new))
                ext = self._pool.take(len(new))
            if ext is None:
                self._count("staging_skipped_save_blocks", len(chain) - stored)
                self._count("staging_skipped_saves", why=f"a save of {len(chain) - stored} blocks skipped: {len(new)} pages "
                            f"wanted, {self._pool.free_pages} of {self.pages} free (host_staging_bytes = {self.host_staging_bytes})")
                return None
            ev = self._copy_out(ext, new)
            pages = expand(ext)
            out = _StagedSave(self, ext, ev, hold, (chain, pages[:cp] * stored + pages, tokens, hashes))
            if ev is not None:
                self._issuer.put(out)
            taken = True
        finally:
            if not taken:
                hold.release()
                if ext is not None:
                    self._pool.give(ext)
        self._saves.append(out)
        if ev is None:
            out.issue()  # the copies were synchronous: the store's refusal is the caller's
            if out.failure is not None:
                out.finish(count=False)
                raise out.failure
        self.counters["staging_saves"] += 1
        return out

    def _segments(self, extents: Extents, dev_ids: Sequence[int]):
        """(first pool page, pages, the engine page ids as a device tensor)
        per extent; call on the side stream."""
        torch = torch_module()
        out, i = [], 0
        for a, n in extents:
            k = min(n, len(dev_ids) - i)
            if k <= 0:
                break
            out.append((a, k, torch.tensor(dev_ids[i:i + k], dtype=torch.long, device=self.device)))
            i += k
        return out

    def _copy_out(self, extents: Extents, dev_ids: Sequence[int]):
        """Issues the copies of the engine pages dev_ids into the pool pages
        of extents, after the engine's work so far; returns their event
        (None: done)."""
        torch = torch_module()
        with self._streams.on_side(after_engine=True):
            segs = self._segments(extents, dev_ids)
            for view, host in zip(self._views, self._pool.layers):
                for a, n, idx in segs:
                    for q in range(view.shape[0]):
                        if self._streams.cuda:
                            host[q, a:a + n].copy_(view[q].index_select(0, idx), non_blocking=True)
                        else:
                            torch.index_select(view[q], 0, idx, out=host[q, a:a + n])
            ev = self._streams.mark(blocking=True)  # the staging's thread waits for it without spinning
        self.counters["staging_d2h_bytes"] += len(dev_ids) * self.geometry.layers * self.geometry.page_bytes_per_layer
        return ev

    def _copy_in(self, layer: int, segs):
        """Issues the copies of one layer's pool pages into the engine's; the
        engine's stream waits for them. Returns their event."""
        view, host = self._views[layer], self._pool.layers[layer]
        with self._streams.on_side():
            for a, n, idx in segs:
                for q in range(view.shape[0]):
                    view[q].index_copy_(0, idx, host[q, a:a + n].to(self.device, non_blocking=True))
            ev = self._streams.mark()
        self._streams.engine_waits(ev)
        self.counters["staging_h2d_bytes"] += sum(n for _, n, _ in segs) * self.geometry.page_bytes_per_layer
        return ev

    def close(self):
        """Frees the pool. Call after every load and save of it was released
        (``WorkerSide.close`` does: their release drains them) and the store
        no longer moves data through it; idempotent."""
        if self._pool is None:
            return
        for ld in list(self._active):
            ld.release()
        for sv in list(self._saves):
            sv.finish()
        self._issuer.close()
        self._reclaim(wait=True)
        self._pool.close()
        self._pool = None
        self._views = []


class _StagedLoad:
    """One request's restore through the pool, in rounds of the pages it got.
    Load's interface as WorkerSide uses it: ``wait_layer(l)`` (layer l of
    every round is in the engine's pages, or ordered before the engine's next
    kernel on CUDA), ``wait()`` (the blocks restored), ``failure()``,
    ``release()``."""

    def __init__(self, stg: HostStaging, spec, extents: Optional[Extents]):
        self._stg, self.spec = stg, spec
        cp = stg.geometry.chunk_pages
        self._n = len(spec.chain) - spec.skip
        self._extents = extents or []
        self._per_round = sum(n for _, n in self._extents) // cp
        self._ld = self._hold = self._ev = None
        self._start = self._end_block = self._copied = self._restored = 0
        self._segs = []
        self._failure = None
        self._ended = False
        if self._per_round == 0:
            stg._count("staging_short_blocks", self._n, why=f"request {spec.req_id!r}: {self._n} blocks not restored, "
                       f"no free page in the pool (host_staging_bytes = {stg.host_staging_bytes})")
            self._failure = HostStagingExhausted(f"host staging pool exhausted: {self._n} blocks of request "
                                                 f"{spec.req_id!r} not restored (host_staging_bytes = {stg.host_staging_bytes})")
            self._ended = True
            return
        stg._active.append(self)
        try:
            if self._per_round < self._n:  # later rounds read after this one: pin their blocks meanwhile
                stg._count("staging_load_rounds", -(-self._n // self._per_round) - 1,
                           why=f"request {spec.req_id!r}: {self._n} blocks through {self._per_round} pool blocks, in rounds "
                               "(all but the last before the first layer)")
                self._hold = stg.store.match(spec.chain, skip=spec.skip, ttl_ms=stg.hold_ttl_ms)
            self._start_round(0)
        except BaseException:
            self._end()
            raise

    def _start_round(self, start: int):
        stg, spec, cp = self._stg, self.spec, self._stg.geometry.chunk_pages
        self._start, self._end_block, self._copied = start, min(self._n, start + self._per_round), 0
        m = self._end_block - start
        self._ld = stg.store.load_with(spec.chain[:spec.skip + self._end_block], expand(self._extents)[:m * cp],
                                       skip=spec.skip + start, promised=True)
        if self._end_block == self._n and self._hold is not None:  # the last round pins for itself
            self._hold.release()
            self._hold = None
        # The engine's work so far may still read the pages the copies write
        # (blocks it freed); at start_load that is the previous step's only.
        with stg._streams.on_side(after_engine=True):
            self._segs = stg._segments(self._extents, spec.block_ids[start * cp:self._end_block * cp])

    def all_copied(self) -> bool:
        return not self._ended and self._end_block == self._n and self._copied == self._stg.geometry.layers

    def _copy_through(self, layer: int):
        while self._copied <= layer:
            self._ld.wait_layer(self._copied)
            self._ev = self._stg._copy_in(self._copied, self._segs)
            self._copied += 1

    def _end_round(self) -> bool:
        """Ends the current round; True if the next one may start."""
        got = self._ld.wait()
        fail = self._ld.failure()
        self._ld.release()
        self._ld = None
        self._restored += got
        if fail is not None or got < self._end_block - self._start:
            self._failure = fail
            return False
        return self._end_block < self._n

    def wait_layer(self, layer: int):
        L = self._stg.geometry.layers
        if not 0 <= layer < L:
            raise IndexError(f"layer {layer}: the KV cache has {L} layers")
        while not self._ended:
            if self._end_block == self._n:  # the last round: layer by layer
                self._copy_through(layer)
                return
            self._copy_through(L - 1)  # an earlier round: whole, its pages are the next round's
            if not self._end_round():
                self._end()
                return
            self._stg._streams.sync(self._ev)
            try:
                self._start_round(self._end_block)
            except _lib.TuttiError as e:  # e.g. Busy: the rounds so far stay restored, the rest are not
                self._failure = e
                self._end()

    def wait(self) -> int:
        """Ends the restore (copies every layer left) and returns the leading
        blocks restored; the engine pages of the rest hold unspecified bytes."""
        if not self._ended:
            self.wait_layer(self._stg.geometry.layers - 1)
        if not self._ended:
            self._end_round()
            self._end()
        return self._restored

    def failure(self):
        return self._failure

    def _end(self):
        stg = self._stg
        if self._ld is not None:
            self._ld.release()
            self._ld = None
        if self._hold is not None:
            self._hold.release()
            self._hold = None
        if self in stg._active:
            stg._active.remove(self)
        if self._extents:
            stg._release_after(self._extents, self._ev)
            self._extents = []
        self._ended = True

    def release(self):
        """Drains the restore (its reads and copies use the pool) and gives
        its pages back once the copies complete."""
        if self._ended:
            return
        try:
            self.wait()
        except _lib.TuttiError:  # the store as a whole failed or closed: nothing writes the pages any more
            self._end()


class _StagedSave:
    """A save through the pool, with Save's interface as WorkerSide uses it:
    ``gathered`` / ``wait_gathered`` (the engine's pages were copied into the
    pool: they may be reused), ``release`` (nothing: the pool pages are the
    staging's, given back once the store gathered them). Its copies' event,
    the hold on the stored prefix and the store's arguments are kept until
    :meth:`issue` (the staging's thread) hands it to the store."""

    def __init__(self, stg: HostStaging, extents: Extents, ev, hold, args: tuple):
        self._stg, self._extents, self._ev, self._hold, self._args = stg, extents, ev, hold, args
        self._sv = None
        self.failure: Optional[BaseException] = None  # the store's refusal, once handed
        self._handed = threading.Event()

    def wait_gathered(self):
        """Returns once the engine's pages were copied into the pool."""
        Streams.sync(self._ev)

    def gathered(self) -> bool:
        return Streams.done(self._ev)

    def release(self):
        """The worker is done with it; the staging gives the pool pages back
        once the store gathered them (waited for when it needs the pages, or
        at close)."""

    def issue(self):
        """Waits for the copies and hands the save to the store; never raises
        (a refusal is kept in ``failure``). Once, on one thread."""
        try:
            Streams.sync(self._ev)
            self._sv = self._stg.store.save(*self._args)
        except Exception as e:
            self.failure = e
        finally:
            self._args = None
            try:
                self._hold.release()
            except Exception as e:  # the store closed meanwhile
                self.failure = self.failure or e
            self._handed.set()

    def wait_handed(self):
        self._handed.wait()

    def stored(self) -> bool:
        """Handed to the store, and the store gathered the pool pages (never
        blocks)."""
        return self._handed.is_set() and (self._sv is None or self._sv.gathered())

    def finish(self, count: bool = True):
        """Waits until it was handed over and the store gathered the pool
        pages (bounded by the store's save bound), releases the store's save
        and gives the pages back; a refusal is counted (``count``). Caller's
        thread: the worker's."""
        if self._extents is None:
            return
        self._handed.wait()
        stg = self._stg
        if self.failure is not None and count:
            stg._count("staging_failed_saves", why=f"a save of {sum(n for _, n in self._extents)} pool pages refused by "
                       f"the store once copied: {self.failure}")
        if self._sv is not None:
            try:
                self._sv.wait_gathered()
                self._sv.release()
            except _lib.TuttiError:  # the store closed: nothing reads the pages any more
                pass
            self._sv = None
        stg._pool.give(self._extents)
        self._extents = None
        stg._saves.remove(self)

