"""The worker side of a KV connector, engine-neutral: what runs in the process
that owns the paged KV tensors (one per GPU / tensor-parallel rank).

API (everything an engine adapter — vLLM's, a Hugging Face loop — needs):

``describe_kv_caches(kv_caches, block_size) -> KVLayout``
    What the engine's KV tensors are, from their shapes and strides
    (:mod:`tutti.kv_layout`, re-exported here).

``WorkerSide(store_opener, ..., ends_requests=False)``
    ``ends_requests``: the engine calls ``end_requests`` for every request
    whose pages may be reused, before they are (vLLM's adapter does), and a
    request's saved pages do not change while it runs (full attention's
    blocks); then a request's save waits on the worker for the chunk before
    it to commit and is retried while not committed, and its pages are read
    after the step, while the request runs (``wait_for_save``).
    ``register(kv_caches, block_size, host_staging_bytes=None, chunk_pages=1)``
    once: describes the tensors, opens the store through
    ``store_opener(layout)`` (so directories and geometry come from the
    layout), checks the tensors' device against the store's path
    (:class:`tutti.DeviceMismatch`) and registers the memory; returns the
    KVLayout. With ``host_staging_bytes`` the tensors
    (any torch device, a GPU's in practice) are served by the CPU path
    through a pool of that many bytes of pinned host pages
    (:mod:`tutti.hoststage`): the opener gets the pool's layout (device
    "cpu", the pool's pages, the tensors' tag) and must open a CPU-path store.
    Per engine step, in any of the orders engines use:

    * ``end_requests(ended, dropped, finished, reused)``: before anything of
      the step writes the KV cache (vLLM: ``handle_preemptions``), requests
      whose pages may be reused from now on: their queued saves are handed
      over one last time (``ended``) or forgotten (``dropped``); finished
      ones' saves go on until ``reused`` names a page they read.
    * ``bind(loads, saves, ended=, dropped=, finished=, reused=)``: this
      step's :class:`LoadSpec` / :class:`SaveSpec` lists (plain data: they
      cross processes in the scheduler's metadata); ends requests as
      ``end_requests`` if not done yet.
    * ``start_load()``: starts every load of the step and returns at once
      (also started by the first ``wait_for_layer``, so calling it before the
      forward, after it, or not at all works).
    * ``wait_for_layer(name)``: returns once that layer of every load is in
      KV memory (GPU path with torch: torch's current stream is made to wait
      instead, no host round trip).
    * ``save_layer(name)``: after each layer's attention wrote its KV; the
      step's saves start at the last layer (a tutti run holds every layer of a
      block), or at ``wait_for_save`` if the engine skips the hooks, with the
      queued saves of earlier steps whose chunk before them is committed.
    * ``wait_for_save()``: returns once every save of the step copied its
      pages out (the pages may be reused after), bounded by the store's
      ``save_bound_ms``; durability is later (``Store.wait_saves``). With
      ``ends_requests`` it returns at once: a save keeps reading its
      request's pages after the step (the gathers, or host staging's copies
      into its pool), and ``end_requests`` waits for it before they can be
      reused (a save on the step's critical path would stall every request
      of the batch for its copies); at most MAX_INFLIGHT_SAVES such saves, the
      oldest waited for beyond that (counted: ``save_inflight_cap_waits``).
    * ``finish_step(finished_req_ids) -> StepResult``: ends the step's loads;
      reports per request the blocks restored, the block ids promised but not
      restored (load errors), which requests waiting on their saves are done
      (``sending``), which background loads (``LoadSpec.background``, of
      this step or earlier ones: never waited for by a layer) ended since the
      last call (``recving``, each once), and the save queue's counters.
    * ``unbind()``.

``take_stats()``: the worker's counters since the last call (host staging's,
:data:`tutti.hoststage.COUNTERS`; empty without it).

Ownership: the WorkerSide holds references to the registered tensors until
``close``; the store is closed by ``close`` unless it came shared (see
:func:`process_store`).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from . import _args
from .deferred_ends import DeferredEnds
from .save_queue import FLUSH_WAIT_MS, SaveQueue
from .store import Load, Save, Store
from .kv_layout import KVLayout, LayoutError, check_fits, describe_kv_caches  # noqa: F401 (the worker side's API)
from .process_stores import process_store, shared_store  # noqa: F401 (the worker side's API)
from .tensor import DeviceMismatch, describe

MAX_INFLIGHT_SAVES = 4096  # saves still reading a running request's pages (ends_requests); beyond: the oldest is waited for
MAX_DEFERRED_ENDS = 1024  # finished requests whose saves still read their pages; beyond: the oldest is ended (waited for)


# --------------------------------------------------------------- step specs


@dataclass
class LoadSpec:
    """One request's load in a step: restore chain[skip:] into block_ids
    (chunk_pages ids per chain block). ``chain[:skip]`` are the engine's own
    blocks (local hits); every block of chain[skip:] was promised."""

    req_id: str
    chain: List[int]
    skip: int
    block_ids: List[int]
    group: int = 0  # the KV cache group (tutti.groups; 0 for a model of one group)
    # A state group's (tutti.group_worker): the blocks the loaded page is then
    # copied into, where the engine runs the request's state this step.
    copy_to: List[int] = field(default_factory=list)
    # The engine does not compute the request in this step and waits for the
    # load's end (vLLM's asynchronous loads): no layer of the step waits for
    # it; finish_step reports it in ``recving`` once it ended.
    background: bool = False


@dataclass
class SaveSpec:
    """One request's save in a step: chain's blocks from block_ids (blocks
    already stored are skipped by the store). A request's saves in later
    steps extend the same chain (each up to its last computed full block;
    ``start``: where the one before ended); the worker hands them to the
    store in order, each once the one before is committed
    (:mod:`tutti.save_queue`). ``tokens`` (block_tokens per chain block) and
    ``hashes`` (the engine's own hash bytes per block) are optional: a store
    publishing KV events publishes them with the blocks."""

    req_id: str
    chain: List[int]
    block_ids: List[int]
    tokens: Optional[List[int]] = None
    hashes: Optional[List[bytes]] = None
    start: int = 0  # chain blocks an earlier save of the request already covers
    group: int = 0  # the KV cache group (tutti.groups; 0 for a model of one group)


@dataclass
class StepResult:
    """What a step's transfers came to."""

    restored_blocks: Dict[str, int] = field(default_factory=dict)
    error_block_ids: Set[int] = field(default_factory=set)  # promised, not restored
    sending: Set[str] = field(default_factory=set)  # requests whose saves are done (waited for)
    recving: Set[str] = field(default_factory=set)  # requests whose background loads ended (LoadSpec.background)
    failures: Dict[str, Exception] = field(default_factory=dict)
    counters: Counter = field(default_factory=Counter)  # the save queue's (tutti.save_queue)


def _torch_stream_sync():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()


def _torch_save_event():
    """An event recorded on torch's current CUDA stream, behind the step's
    writes of the KV: the saves' gathers wait for it on the device."""
    ev = sys.modules["torch"].cuda.Event()
    ev.record()
    return ev


# ------------------------------------------------------------------ the worker


class WorkerSide:
    """Per-process worker state: the store, the registered layers, the
    loads and saves of the bound step (see the module doc)."""

    def __init__(self, store_opener: Callable[[KVLayout], Store], device_sync: Optional[Callable[[], None]] = None,
                 stream_wait: Optional[bool] = None, holds=None, save_flush_wait_ms: int = FLUSH_WAIT_MS, check=None,
                 ends_requests: bool = False, save_event: Optional[Callable[[], object]] = None):
        """``holds``: what the scheduler's lookups hold in this process (an
        object with ``release(req_id)``, e.g. a
        :class:`tutti.scheduler_side.LocalMatcher`): a request's hold is
        released once its load started, which pins for itself.
        ``save_flush_wait_ms``: how long :meth:`end_requests` waits for a
        request's chunk to commit before handing over the next one
        (:mod:`tutti.save_queue`). ``check``: a :class:`tutti.kvcheck.KVCheck`
        (digests of what is saved and restored) or None. ``ends_requests``:
        the engine names every request whose pages may be reused
        (:meth:`end_requests`) before they are: then a request's saves wait
        for the chunk before them and are retried while not committed
        (tutti.save_queue); otherwise each is handed over in its step only.
        ``save_event``: makes, where saves are handed over, an event of the
        engine's stream behind its KV writes (with ``cuda_event``) for the
        gathers to wait for on the device; None: torch's on the GPU path
        without host staging; ``False``: the host waits (``device_sync``)."""
        self._opener = _args.function("store_opener", store_opener)
        _args.function("device_sync", device_sync, optional=True)
        if save_event is not False:
            _args.function("save_event", save_event, optional=True)
        if stream_wait is not None:
            _args.boolean("stream_wait", stream_wait)
        _args.boolean("ends_requests", ends_requests)
        self.holds = holds
        self.check = check
        self._device_sync = device_sync
        self._save_event = save_event
        self._stream_wait = stream_wait
        self._flush_wait_ms, self._ends_requests = save_flush_wait_ms, ends_requests
        self.store: Optional[Store] = None
        self.kv_layout: Optional[KVLayout] = None
        self.queue: Optional[SaveQueue] = None
        self.staging = None  # a tutti.hoststage.HostStaging when the KV goes through host staging
        self._layer_index: Dict[str, int] = {}
        self._kv_refs = None
        self._loads_spec: List[LoadSpec] = []
        self._saves_spec: List[SaveSpec] = []
        self._loads: Dict[str, Tuple[Load, LoadSpec]] = {}
        self._recving: Dict[str, Tuple[Load, LoadSpec]] = {}  # background loads in flight, over steps
        self._loads_started = False
        self._saves: Dict[str, List[Tuple[Save, Sequence[int]]]] = {}  # the step's: (save, its pages) per request
        self._saves_started = False
        # ends_requests: saves issued, possibly still reading their request's
        # pages, until end_requests names the request (insertion order: oldest first)
        self._inflight: Dict[str, List[Tuple[Save, Sequence[int]]]] = {}
        self._inflight_n = 0
        # finished requests whose saves still read (or are queued to read) their
        # pages, which stay theirs until reused (end_requests' finished/reused)
        self._deferred = DeferredEnds(MAX_DEFERRED_ENDS)
        self._counters = Counter()
        self._await_sending: Set[str] = set()  # finished requests whose blocks wait on their saves
        self._result = StepResult()

    # -- registration
    def register(self, kv_caches: Dict[str, object], block_size: int, layer_names: Optional[Sequence[str]] = None,
                 host_staging_bytes: Optional[int] = None, chunk_pages: int = 1) -> KVLayout:
        """``block_size``: tokens per page; ``chunk_pages``: pages per chain
        block (one key per ``block_size * chunk_pages`` tokens).
        ``host_staging_bytes``: serve the tensors through host staging of
        that size (module doc); the store then holds the pool's pages."""
        if self.store is not None:
            raise RuntimeError("register called twice")
        if self._save_event and host_staging_bytes is not None:
            raise ValueError("save_event: host staging copies the pages itself; pass save_event=None or False")
        lay = describe_kv_caches(kv_caches, block_size, layer_names, chunk_pages)
        # -- host staging: the store moves the pool's pages, not the tensors'
        mem, staging = lay, None
        if host_staging_bytes is not None:
            from .hoststage import HostStaging
            staging = HostStaging(kv_caches, lay, host_staging_bytes)
            mem = staging.layout
        try:
            st = self._opener(mem)
            check_fits(st, mem, describe(kv_caches[lay.layer_names[0]], lay.layer_names[0]))
            want = "cpu" if st.path == "cpu" else "cuda"
            if mem.device.split(":", 1)[0] != want:
                hint = " (host_staging_bytes serves GPU tensors on the CPU path)" if want == "cpu" else ""
                raise DeviceMismatch(mem.layer_names[0], f"the tensors are on {mem.device}, the store's {st.path} path "
                                                         f"needs {want} memory{hint}")
            if staging is not None:
                staging.bind(st)
            st.register_kv(list(mem.regions), memory="host" if mem.device == "cpu" else "cuda")
        except BaseException:
            if staging is not None:
                staging.close()
            raise
        self.store, self.kv_layout, self.staging = st, lay, staging
        self.queue = SaveQueue(st.lookup, flush_wait_ms=self._flush_wait_ms, keep=self._ends_requests)
        self._layer_index = {n: i for i, n in enumerate(lay.layer_names)}
        self._kv_refs = dict(kv_caches)  # the library writes into them until the store closes
        if self._device_sync is None:
            self._device_sync = _torch_stream_sync if st.path == "gpu" else (lambda: None)
        if self._stream_wait is None:
            self._stream_wait = st.path == "gpu" and "torch" in sys.modules
        if self._save_event is None:
            self._save_event = st.path == "gpu" and staging is None and "torch" in sys.modules and _torch_save_event
        if self.check is not None:
            self.check.register(kv_caches, lay, block_size)
        return lay

    @property
    def stream_wait(self) -> bool:
        """Whether :meth:`wait_for_layer` makes torch's current CUDA stream
        wait instead of the host (known once registered)."""
        return bool(self._stream_wait)

    def layer_index(self, name: str) -> int:
        try:
            return self._layer_index[name]
        except KeyError:
            raise KeyError(f"unknown layer {name!r} (registered: {list(self._layer_index)[:4]}...)") from None

    def _need_store(self) -> Store:
        if self.store is None:
            raise RuntimeError("no KV caches registered")
        return self.store

    # -- the step
    def bind(self, loads: Sequence[LoadSpec] = (), saves: Sequence[SaveSpec] = (), await_sending: Sequence[str] = (),
             ended: Sequence[str] = (), dropped: Sequence[str] = (), finished: Sequence[str] = (),
             reused: Iterable[int] = ()):
        """The step's transfers; ``await_sending``: requests the scheduler
        finished with their blocks held until their saves are done (reported
        once each in ``finish_step().sending``); the rest: :meth:`end_requests`."""
        self.end_requests(ended, dropped, finished, reused)
        again = sorted({s.req_id for s in list(loads) + list(saves) if s.req_id in self._deferred})
        if again:  # an id used again: the saves of its finished namesake end first
            self.end_requests(again)
        self._loads_spec, self._saves_spec = list(loads), list(saves)
        self._loads_started = self._saves_started = False
        self._await_sending.update(await_sending)

    def end_requests(self, ended: Sequence[str] = (), dropped: Sequence[str] = (), finished: Sequence[str] = (),
                     reused: Iterable[int] = ()):
        """Call before anything of the step writes the KV cache (vLLM:
        ``handle_preemptions``). ``ended`` (finished or preempted: their pages
        still hold their KV) hand their queued saves to the store one last
        time and wait until the pages are copied out; ``dropped`` (pages
        possibly already reused) forget theirs. ``finished`` (pages that keep
        their KV until allocated again: full attention's) go on reading them,
        no wait (``save_ends_deferred``), until ``reused`` (the pages this
        step writes afresh: allocations, loads) names one they read: their
        saves in flight are waited for then, not their commits
        (``save_end_reuses``). One with a chunk never handed over ends as
        ``ended`` do: only a step hands it over, and the engine may not step
        again. At most MAX_DEFERRED_ENDS deferred (beyond, the oldest ends:
        ``save_ends_deferred_cap``)."""
        if self.queue is None:
            return
        ended, late = list(ended), []  # late: deferred ones ended now
        for rid in finished:
            if rid in ended or rid in self._deferred:
                continue
            if self.queue.unhanded(rid):  # a queued chunk goes only at a step: the engine may not step again
                ended.append(rid)
                continue
            pages = [p for _, pg in self._inflight.get(rid, ()) for p in pg] + self.queue.pages(rid)
            self._counters["save_ends_deferred"] += bool(pages)
            over = self._deferred.add(rid, pages)
            self._counters["save_ends_deferred_cap"] += len(over)
            late.extend(over)
        hit = self._deferred.readers(reused)
        self._counters["save_end_reuses"] += len(hit)
        late.extend(hit)
        for rid in late + ended + list(dropped):
            self._deferred.remove(rid)
        self.queue.drop(late)  # handed over whole: their commits go on, no retry once the pages are reused
        gone = ended + late + list(dropped)
        if not any(r in self._inflight or self.queue.pending(r) for r in gone):
            return
        # the engine's step waits here: how long, counted (a save still copying
        # out a finished request's pages, or its last chunk waiting for the one
        # before it to commit, holds the whole batch)
        t0 = time.monotonic()
        self._wait_inflight(gone)
        self.queue.drop(dropped)
        specs = self.queue.flush(ended)
        if specs:
            self._device_sync()  # the KV they save may still be being written
            saves = [self._issue(spec, keep=False) for spec in specs]
            for sv in saves:
                if sv is not None:
                    sv.wait_gathered()
                    sv.release()
        self._counters["save_end_waits"] += 1
        self._counters["save_end_wait_s"] += time.monotonic() - t0

    def _reap_deferred(self):
        """Releases the deferred requests' saves that gathered their pages
        (never blocks); a request with none left in flight or queued is done."""
        for rid in self._deferred.requests():
            svs = self._inflight.get(rid, [])
            done = {id(sv): sv for sv, _ in svs if sv.gathered()}
            for sv in done.values():
                sv.release()
            self._inflight_n -= len(done)
            svs[:] = [(sv, pg) for sv, pg in svs if id(sv) not in done]
            if svs:
                continue
            self._inflight.pop(rid, None)
            if not self.queue.pending(rid):  # its want, handed over whole, is retried until committed
                self._deferred.remove(rid)

    def start_load(self):
        """Starts the bound step's loads (once; returns at once)."""
        if self._loads_started:
            return
        self._loads_started = True
        if not self._loads_spec:
            return
        st = self._need_store()
        self._device_sync()  # the engine's kernels may still use the pages a load overwrites
        cp = st.geometry.chunk_pages
        if self.staging is not None:  # host staging: the step's loads share its free pages
            self.staging.plan_loads(self._loads_spec)
        for spec in self._loads_spec:
            want = (len(spec.chain) - spec.skip) * cp
            if len(spec.block_ids) != want:
                raise ValueError(f"request {spec.req_id!r}: {len(spec.block_ids)} block ids for {len(spec.chain) - spec.skip} "
                                 f"blocks after {spec.skip} local ones (need {want})")
            into = self._loads
            if spec.background and self.staging is None:
                into = self._recving
            elif spec.background:  # staged rounds share the step's pool pages: it ends with this step
                self._counters["loads_background_staged"] += 1
            try:
                if want and self.staging is not None:  # host staging: through the pool
                    into[spec.req_id] = (self.staging.load(spec), spec)
                elif want:
                    into[spec.req_id] = (st.load_with(spec.chain, spec.block_ids, skip=spec.skip, promised=True), spec)
                elif spec.background:
                    self._result.recving.add(spec.req_id)  # nothing to restore: ended already
            except Exception as e:  # a promise not kept: every block of it is a load error
                self._result.failures[spec.req_id] = e
                self._result.error_block_ids.update(spec.block_ids)
                if spec.background:
                    self._result.recving.add(spec.req_id)  # the engine waits for its end: this is it
            finally:
                if self.holds is not None:
                    self.holds.release(spec.req_id)

    def wait_for_layer(self, name: str):
        layer = self.layer_index(name)
        self.start_load()
        # A background load through host staging ends with the step, in
        # finish_step, but no layer waits for it (LoadSpec.background).
        loads = [(ld, spec) for ld, spec in self._loads.values() if not spec.background]
        if self._stream_wait:
            stream = sys.modules["torch"].cuda.current_stream().cuda_stream
            for ld, _ in loads:
                ld.stream_wait_layer(layer, stream)
        else:
            for ld, _ in loads:
                ld.wait_layer(layer)
        if self.check is not None and loads:
            self.check.layer_loaded(name, [spec for _, spec in loads])

    def save_layer(self, name: str):
        if self.layer_index(name) == len(self._layer_index) - 1:
            self._start_saves()

    def _start_saves(self):
        if self._saves_started:
            return
        self._saves_started = True
        for spec in self._saves_spec:
            self._need_store()
            self.queue.add(spec)
        self._hand_ready(wait=False)

    def _hand_ready(self, wait: bool):
        """Hands the queued saves that may go now to the store; ``wait``: and
        ends the wait on them here (:meth:`_let_go`), outside the step's saves;
        else wait_for_save does."""
        specs = self.queue.ready() if self.queue is not None and len(self.queue) else []
        if not specs:
            return
        t0 = time.monotonic()  # the KV must be written before the copies read it: they wait for an event, or the host does
        after = self._save_event() if self._save_event else None
        if after is None:
            self._device_sync()
        t1 = time.monotonic()
        saves = [(spec.req_id, self._issue(spec, keep=not wait, after=after), spec.block_ids) for spec in specs]
        self._counters["save_sync_s"] += t1 - t0  # the host's time here holds the step: counted
        self._counters["save_issue_s"] += time.monotonic() - t1
        if wait:
            self._let_go(saves)

    def _defers(self) -> bool:
        """Whether issued saves may read their pages after the step (module doc)."""
        return self._ends_requests

    def _let_go(self, saves: Sequence[Tuple[str, Optional[Save], Sequence[int]]]):
        """Ends the caller's wait on (request, save, its pages): kept in
        flight until the request ends where the pages stay the request's
        (:meth:`_defers`), else waited until gathered and released."""
        for rid, sv, pages in saves:
            if sv is None:
                continue
            if not self._defers():
                sv.wait_gathered()
                sv.release()
                continue
            while self._inflight_n >= MAX_INFLIGHT_SAVES:
                oldest = next(iter(self._inflight))
                self._counters["save_inflight_cap_waits"] += 1
                self._wait_inflight([oldest])
            self._inflight.setdefault(rid, []).append((sv, pages))
            self._inflight_n += 1

    def _wait_inflight(self, req_ids: Sequence[str]):
        """Waits until the requests' saves in flight stopped reading their
        pages, and releases them."""
        for rid in req_ids:
            for sv, _ in self._inflight.pop(rid, ()):
                self._inflight_n -= 1
                sv.wait_gathered()
                sv.release()

    def _issue(self, spec: SaveSpec, keep: bool = True, after=None) -> Optional[Save]:
        """Hands spec's blocks to the store (it skips those it has), its
        gathers after the engine's event ``after`` (save_event's) if not
        None; the Save is waited for in wait_for_save if ``keep``, else by
        the caller."""
        st = self._need_store()
        cp = st.geometry.chunk_pages
        n = min(len(spec.chain), len(spec.block_ids) // cp)
        if n == 0:
            return None
        bt = cp * st.geometry.page_tokens
        tokens = spec.tokens[:n * bt] if spec.tokens is not None and len(spec.tokens) >= n * bt else None
        hashes = spec.hashes[:n] if spec.hashes is not None and len(spec.hashes) >= n else None
        if self.check is not None:
            self.check.saving(spec.req_id, spec.chain[:n], spec.block_ids[:n * cp], st.lookup(spec.chain[:n]))
        save = self.staging.save if self.staging is not None else st.save  # host staging: None when skipped
        kw = {"after_event": after} if after is not None else {}
        sv = save(spec.chain[:n], spec.block_ids[:n * cp], tokens=tokens, hashes=hashes, **kw)
        if keep and sv is not None:
            self._saves.setdefault(spec.req_id, []).append((sv, spec.block_ids))
        return sv

    def wait_for_save(self):
        """Every save of the step has copied its pages out when this returns,
        or, where saves read their pages after the step (:meth:`_defers`),
        is in flight until its request ends."""
        self._start_saves()
        saves, self._saves = self._saves, {}
        self._let_go([(rid, sv, pg) for rid, svs in saves.items() for sv, pg in svs])

    def finish_step(self, finished_req_ids: Sequence[str] = ()) -> StepResult:
        """Ends the step's loads (waits for the rest of them) and returns the
        step's result; ``finished_req_ids`` are the engine's finished requests
        (those of them the scheduler holds for their saves are reported in
        ``sending`` once their saves are done)."""
        self.start_load()
        res, self._result = self._result, StepResult()
        loads, self._loads = list(self._loads.items()), {}
        ended = [(rid, x) for rid, x in self._recving.items() if x[0].done()]  # background: those that ended
        for rid, _ in ended:
            del self._recving[rid]
        res.recving.update(rid for rid, (_, spec) in loads + ended if spec.background)
        try:
            for req_id, (ld, spec) in loads + ended:
                self._end_load(res, req_id, ld, spec, whole=spec.background)
        finally:  # every load ends with its step, whatever raised (a released one would be waited on next step)
            for _, (ld, _) in loads + ended:
                ld.release()
        self._wait_inflight(sorted(self._await_sending))  # the blocks held for them are freed once reported
        done = [r for r in self._await_sending if r not in self._saves]  # the step's saves are waited for in wait_for_save
        self.end_requests(done)  # and queued ones handed over: the engine reuses the pages once told
        res.sending.update(done)
        self._await_sending.difference_update(done)
        if self.queue is not None:
            self._hand_ready(wait=True)  # a chunk whose one before committed during the step goes now
            self._reap_deferred()
            res.counters.update(self.queue.take_counters())
        res.counters.update(self._counters)
        self._counters.clear()
        return res

    def _end_load(self, res: StepResult, req_id: str, ld: Load, spec: LoadSpec, whole: bool):
        """Records an ended load in res (``whole``: the check digests every
        layer now: no layer waited for it, a background load)."""
        cp = self.store.geometry.chunk_pages if self.store is not None else 1
        try:
            blocks = ld.wait()
            failure = ld.failure()
        except Exception as e:  # how far it got is unknown: every block of it is recomputed
            blocks, failure = 0, e
        res.restored_blocks[req_id] = blocks
        if failure is not None:
            res.failures[req_id] = failure
        res.error_block_ids.update(spec.block_ids[blocks * cp:])
        if self.check is not None:
            if whole:
                for name in self._layer_index:
                    self.check.layer_loaded(name, [spec])
            self.check.restored(spec, blocks)

    def unbind(self):
        self._loads_spec, self._saves_spec = [], []

    def take_stats(self) -> Dict[str, int]:
        """Counters grown since the last call (host staging's; empty without it)."""
        return self.staging.take_counters() if self.staging is not None else {}

    def close(self, close_store: bool = True):
        """Releases the step's loads and saves and closes the store (unless
        ``close_store`` is False: a shared store). Host staging's pool is
        freed here either way, once its loads and saves drained: a store
        left open no longer reads or writes it."""
        for ld, _ in list(self._loads.values()) + list(self._recving.values()):
            ld.release()  # waits: a load writes its pages until it ended
        self._loads.clear()
        self._recving.clear()
        for saves in self._saves.values():
            for sv, _ in saves:
                sv.release()
        self._saves.clear()
        self._wait_inflight(list(self._inflight))
        self._deferred.clear()
        if self.staging is not None:  # waits for its saves to gather, then frees the pool
            self.staging.close()
            self.staging = None
        if self.check is not None:
            self.check.close()
        if close_store and self.store is not None:
            self.store.close()
        self._kv_refs = None
