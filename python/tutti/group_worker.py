"""The worker side of a hybrid model (several KV cache groups): one
:class:`tutti.worker_side.WorkerSide` per group, each over its group's store
of a :class:`tutti.groups.HybridStore`, behind the WorkerSide's own API.

``GroupWorkers(open_group, rules, holds=None, save_flush_wait_ms=...)``
    ``open_group(i, layout) -> Store``: opens group i's store for its
    tensors' layout (and attaches it to the HybridStore).
    ``register(kv_caches, block_size, group_layers, host_staging_bytes=None)``:
    ``group_layers[i]``: the layer names of group i, in layer order. A state
    group's layer (vLLM's Mamba layers) is a list of state tensors, views of
    one page per block (vLLM lays them so): tutti moves the whole page.
    Then the WorkerSide's per-step calls; specs carry their group
    (``LoadSpec.group``, ``SaveSpec.group``). Differences:

    * a state group's loads are waited for in ``start_load`` (the engine
      calls no per-layer hook for recurrent layers, and the first of them may
      run before any attention layer), then each restored state is copied
      into the block the engine runs it in (``LoadSpec.copy_to``; vLLM 0.26
      copies it there before the load); its saves and a sliding group's are
      handed over in the step that asks for them and gathered by
      ``wait_for_save`` (the engine frees their pages while the request still
      runs), never queued;
    * a save of a non-full group whose block ids hold the engine's null block
      (pages it freed, or never had: a local hit outside the window) is cut
      before the first such block not stored yet; the stored ones are pinned
      until the save gathered, so no null page is ever read.
"""

from __future__ import annotations

import logging
import sys
from typing import Callable, Dict, List, Optional, Sequence

from .groups import NULL_BLOCK, GroupRule, HybridStore
from .hoststage import SizedFor
from .save_queue import FLUSH_WAIT_MS
from .scheduler_side import base_request
from .tensor import RawTensor
from .worker_side import LoadSpec, SaveSpec, StepResult, WorkerSide

log = logging.getLogger("tutti.group_worker")

PIN_TTL_MS = 60000  # a pin of a save's stored prefix outlives the save's gather by far


def state_page_view(name: str, states, block_size: int):
    """One recurrent layer's state tensors (views of one page per block,
    vLLM's ``MambaSpec`` layout: state i at the page's start plus the sizes
    before it) as one tensor of the whole page per block:
    ``(blocks, block_size, 1, C)`` of a 2-byte (else 1-byte) type, a
    :class:`tutti.RawTensor` over the first state's address (the caller keeps
    the tensors alive)."""
    if isinstance(states, RawTensor) or hasattr(states, "data_ptr") and not isinstance(states, (list, tuple)):
        return states  # a page view already
    if not isinstance(states, (list, tuple)) or not states:
        raise TypeError(f"kv_caches[{name!r}]: a state group's layer is a list of state tensors, got {type(states).__name__}")
    torch = sys.modules.get("torch")
    t0 = states[0]
    if torch is None or not isinstance(t0, torch.Tensor):
        raise TypeError(f"kv_caches[{name!r}]: state tensors must be torch tensors, got {type(t0).__name__}")
    page_bytes = t0.stride(0) * t0.element_size()
    nb = t0.shape[0]
    for s in states[1:]:
        if s.shape[0] != nb or s.stride(0) * s.element_size() != page_bytes:
            raise ValueError(f"kv_caches[{name!r}]: state tensors of different pages ({list(s.shape)}, stride "
                             f"{s.stride()}): want views of one page per block")
    for dt, es in (("fp16", 2), ("fp8", 1)):
        if page_bytes % (block_size * es) == 0:
            break
    else:
        raise ValueError(f"kv_caches[{name!r}]: a state page of {page_bytes} bytes is not {block_size} tokens' worth "
                         f"of whole 2-byte or 1-byte elements")
    c = page_bytes // (block_size * es)
    tdt = {"fp16": torch.float16, "fp8": getattr(torch, "float8_e4m3fn", None)}[dt]
    if hasattr(t0, "untyped_storage") and tdt is not None:  # a torch view (check mode and host staging read it)
        v = torch.empty(0, dtype=tdt, device=t0.device)
        v.set_(t0.untyped_storage(), t0.storage_offset() * t0.element_size() // es, (nb, block_size, 1, c),
               (page_bytes // es, c, c, 1))
        if v.data_ptr() == t0.data_ptr():
            return v
    # By address (the bytes of the page, whatever the states' types): tutti
    # moves pages and never reads them as numbers.
    return RawTensor(t0.data_ptr(), (nb, block_size, 1, c), (page_bytes // es, c, c, 1), dt, str(t0.device))


class _Checks:
    """The groups' check modes, as the connector reads one."""

    def __init__(self, checks):
        self.checks = checks

    def take_counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for c in self.checks:
            for k, v in c.take_counts().items():
                out[k] = out.get(k, 0) + v
        return out


class GroupWorkers:
    """A WorkerSide per KV cache group (see the module doc)."""

    def __init__(self, open_group: Callable, rules: Sequence[GroupRule], store: HybridStore, holds=None,
                 save_flush_wait_ms: int = FLUSH_WAIT_MS, checks: Optional[Sequence[object]] = None, save_event=None):
        """``checks[i]``: group i's :class:`tutti.kvcheck.KVCheck` (check
        mode), or None; ``save_event``: each group's WorkerSide's."""
        self.rules = list(rules)
        self.store = store
        self.holds = holds
        self.check = _Checks([c for c in checks or () if c is not None]) if checks and any(checks) else None
        self.workers: List[WorkerSide] = []
        for i, r in enumerate(self.rules):
            self.workers.append(WorkerSide(lambda lay, i=i: open_group(i, lay), save_flush_wait_ms=save_flush_wait_ms,
                                           ends_requests=r.kind == "full", check=checks[i] if checks else None,
                                           save_event=save_event))
        self._group_of: Dict[str, int] = {}
        self._pins: list = []
        self._load_reqs: List[str] = []
        self._started = False  # the bound step's loads started
        self.counters: Dict[str, int] = {}
        self.kv_layouts = []
        self._states: List[Dict[str, list]] = []  # a state group's layers' state tensors (the engine's)

    @property
    def kv_layout(self):
        return self.kv_layouts[0] if self.kv_layouts else None

    def register(self, kv_caches: Dict[str, object], block_size: int, group_layers: Sequence[Sequence[str]],
                 host_staging_bytes=None):
        """``host_staging_bytes``: split evenly over the groups, or a
        :class:`tutti.hoststage.SizedFor`: each group's pool sized for what
        its rule moves of such a request (GroupRule.staging_tokens)."""
        if len(group_layers) != len(self.rules):
            raise ValueError(f"{len(group_layers)} layer lists for {len(self.rules)} KV cache groups")
        if isinstance(host_staging_bytes, SizedFor):
            shares = [SizedFor(r.staging_tokens(host_staging_bytes.tokens), len(self.rules)) for r in self.rules]
        else:
            shares = [None if host_staging_bytes is None else max(1, host_staging_bytes // len(self.rules))] * len(self.rules)
        for i, (w, names, r, share) in enumerate(zip(self.workers, group_layers, self.rules, shares)):
            names = list(names)
            missing = [n for n in names if n not in kv_caches]
            if not names or missing:
                raise ValueError(f"KV cache group {i}: layers {missing or names} not among the registered tensors")
            sub = {n: (state_page_view(n, kv_caches[n], block_size) if r.kind == "state" else kv_caches[n])
                   for n in names}
            if r.kind == "state" and share is not None:
                raise ValueError(f"KV cache group {i}: recurrent state through host staging is not supported: use the "
                                 f"GPU path (kv_connector_extra_config.path \"gpu\")")
            self.kv_layouts.append(w.register(sub, block_size, layer_names=names, host_staging_bytes=share))
            self._states.append({n: list(kv_caches[n]) if isinstance(kv_caches[n], (list, tuple)) else [kv_caches[n]]
                                 for n in names} if r.kind == "state" else {})
            for n in names:
                self._group_of[n] = i
        return self.kv_layouts

    def _worker_of(self, name: str) -> WorkerSide:
        try:
            return self.workers[self._group_of[name]]
        except KeyError:
            raise KeyError(f"unknown layer {name!r} (registered: {list(self._group_of)[:4]}...)") from None

    def layer_index(self, name: str) -> int:
        return self._worker_of(name).layer_index(name)

    @property
    def stream_wait(self) -> bool:
        return any(w.stream_wait for w in self.workers)

    # -- the step
    def end_requests(self, ended: Sequence[str] = (), dropped: Sequence[str] = (), finished: Sequence[str] = (),
                     reused: Sequence[int] = ()):
        """As WorkerSide's; ``finished`` end here too (the scheduler of a
        hybrid model names its finished requests in ``ended``: other groups'
        blocks are freed while a request runs), ``reused`` is not needed."""
        ended = sorted(set(ended) | set(finished))
        for w in self.workers:
            w.end_requests(ended, dropped)

    def bind(self, loads: Sequence[LoadSpec] = (), saves: Sequence[SaveSpec] = (), ended: Sequence[str] = (),
             dropped: Sequence[str] = (), finished: Sequence[str] = (), reused: Sequence[int] = ()):
        ended = sorted(set(ended) | set(finished))
        by = [([], []) for _ in self.workers]
        for ld in loads:
            by[ld.group][0].append(ld)
        for sv in saves:
            sv = self._safe_save(sv)
            if sv is not None:
                by[sv.group][1].append(sv)
        for w, (ls, ss) in zip(self.workers, by):
            w.bind(ls, ss, ended=ended, dropped=dropped)
        self._load_reqs = sorted({base_request(ld.req_id) for ld in loads})
        self._started = False

    def _safe_save(self, spec: SaveSpec) -> Optional[SaveSpec]:
        """A non-full group's save never reads the null block (module doc)."""
        if self.rules[spec.group].kind == "full" or NULL_BLOCK not in spec.block_ids:
            return spec
        st = self.store.stores[spec.group]
        stored = st.lookup(spec.chain)
        cut = next((i for i, b in enumerate(spec.block_ids) if b == NULL_BLOCK and i >= stored), len(spec.chain))
        if cut < len(spec.chain):
            self._count("save_null_cut_blocks", len(spec.chain) - cut)
        if cut <= stored:
            return None  # nothing new to save
        if NULL_BLOCK in spec.block_ids[:cut]:
            pin = st.match(spec.chain[:stored], 0, PIN_TTL_MS)
            if st.lookup(spec.chain[:stored]) < stored:  # evicted meanwhile: not safe
                pin.release()
                self._count("save_null_raced", 1)
                return None
            self._pins.append(pin)
        return SaveSpec(spec.req_id, spec.chain[:cut], spec.block_ids[:cut], start=0, group=spec.group)

    def _count(self, k: str, v: int):
        self.counters[k] = self.counters.get(k, 0) + v

    def start_load(self):
        """Starts every group's loads (once a step, as WorkerSide.start_load),
        waits for a state group's, then releases the requests' holds."""
        if self._started:
            return
        self._started = True
        for w in self.workers:
            w.start_load()
        for w, r, states in zip(self.workers, self.rules, self._states):
            if r.kind == "state" and w._loads:  # no per-layer hook runs for recurrent layers
                for name in w.kv_layout.layer_names:
                    w.wait_for_layer(name)
                self._copy_states(w, states)
        if self.holds is not None:  # every group's load pins for itself now
            for rid in self._load_reqs:
                self.holds.release(rid)
            self._load_reqs = []

    def _copy_states(self, w: WorkerSide, states: Dict[str, list]):
        """A restored state copied into the block the engine runs the
        request's state in (``LoadSpec.copy_to``: vLLM copied the state
        there before the load), after the load: every state tensor of the
        layer, as vLLM copies them, on torch's current stream, which waits
        for the load (a GPU path), or once it is in (a CPU one)."""
        moves = [(spec.block_ids[-1], dst) for _, spec in w._loads.values() for dst in spec.copy_to]
        if not moves:
            return
        torch = sys.modules.get("torch")
        for name in w.kv_layout.layer_names:
            for x in states[name]:
                if torch is None or not isinstance(x, torch.Tensor):
                    raise TypeError(f"kv_caches[{name!r}]: a restored state is copied with torch, the layer's state "
                                    f"is a {type(x).__name__}")
                for src, dst in moves:
                    x[dst].copy_(x[src])
        self._count("state_copies", len(moves))

    def wait_for_layer(self, name: str):
        self.start_load()
        self._worker_of(name).wait_for_layer(name)

    def save_layer(self, name: str):
        self._worker_of(name).save_layer(name)

    def wait_for_save(self):
        for w in self.workers:
            w.wait_for_save()
        pins, self._pins = self._pins, []
        for p in pins:
            p.release()

    def finish_step(self, finished_req_ids: Sequence[str] = ()) -> StepResult:
        self.start_load()  # as WorkerSide's: a step nobody started loads for still ends them (and the holds)
        out, err = StepResult(), None
        for i, (w, r) in enumerate(zip(self.workers, self.rules)):
            try:
                res = w.finish_step(finished_req_ids)
            except Exception as e:  # every group's step still ends (its loads released), then the first error raises
                log.exception("tutti: KV cache group %d: ending the step's loads and saves failed", i)
                err = err or e
                continue
            if r.kind == "full" and not out.restored_blocks:
                out.restored_blocks = dict(res.restored_blocks)
            if res.restored_blocks and w.store is not None:  # every group's bytes (tutti_load_bytes)
                g = w.store.shard_geometry
                n = sum(res.restored_blocks.values())
                out.counters["load_bytes"] += n * g.layers * g.page_bytes_per_layer * g.chunk_pages
            out.error_block_ids |= res.error_block_ids
            out.sending |= res.sending
            for k, e in res.failures.items():
                out.failures.setdefault(base_request(k), e)
            out.counters.update(res.counters)
        for k, v in self.counters.items():
            out.counters[k] += v
        self.counters = {}
        if err is not None:
            raise err
        return out

    def unbind(self):
        for w in self.workers:
            w.unbind()

    def take_stats(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for w in self.workers:
            for k, v in w.take_stats().items():
                out[k] = out.get(k, 0) + v
        return out

    def close(self, close_store: bool = True):
        for p in self._pins:
            p.release()
        self._pins = []
        for w in self.workers:
            w.close(close_store=close_store)
