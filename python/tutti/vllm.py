"""tutti as a vLLM KV connector (a thin adapter; see docs/vllm.md):

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"TuttiConnector",
        "kv_connector_module_path":"tutti.vllm","kv_role":"kv_both",
        "kv_connector_extra_config":{"dirs":["/nvme0/tutti"],"capacity_bytes":500000000000,"path":"auto"}}'

The work is done by :mod:`tutti.scheduler_side` and :mod:`tutti.worker_side`
(engine-neutral, tested without vLLM); this module maps vLLM's objects and
call order onto them. Blocks are keyed by their tokens and vLLM's extra keys
(:mod:`tutti.keys`, :mod:`tutti.request_keys`), never by vLLM's block hashes,
whose seed is random per process: the store serves every process and restart
of the same model; vLLM's own hashes only name what KV events publish.
Importing it without vLLM raises ImportError saying so.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole,
    )
except ImportError as e:  # pragma: no cover - exercised by test_vllm_adapter without the double
    raise ImportError(
        "tutti.vllm is tutti's vLLM connector and needs vLLM installed (pip install vllm); "
        f"the rest of tutti works without it ({e})") from e

try:  # hybrid models: vLLM keeps its hybrid KV cache manager on only for a connector that subclasses it
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
except ImportError:  # a vLLM before the hybrid manager took connectors
    class SupportsHMA:  # type: ignore[no-redef]
        pass

try:  # vLLM's own block extras (LoRA, cache salt, multimodal inputs, prompt embeddings)
    from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys as _extra_keys_fn
except ImportError:  # a vLLM without it: requests with extras are not keyed (misses, counted)
    _extra_keys_fn = None

from . import _lib, groups, options
from .vllm_settings import Settings, kv_role_parts
from .group_worker import GroupWorkers
from .hoststage import SizedFor
from .vllm_groups import engine_hit_incomplete, group_capacities, group_rules
from .vllm_metrics import KVConnectorStats, _Stats
from .vllm_metrics import TuttiConnectorStats, TuttiPromMetrics  # noqa: F401 (None without vLLM's stats)
from .keys import Unkeyable, seed_of
from .kvcheck import MAX_RECORDS, KVCheck
from .lookup_service import LookupServer, RemoteMatcher, socket_path
from .request_keys import RequestKeys, prompt_tokens
from .scheduler_side import LocalMatcher, SchedulerSide
from .store import Geometry, Store
from .worker_side import KVLayout, LoadSpec, SaveSpec, WorkerSide, process_store, shared_store

log = logging.getLogger("tutti.vllm")

# The vLLM releases and trees this adapter follows (docs/vllm.md): the
# released 0.26.0's Python source, and the trees it was first written against.
VLLM_VERSIONS = ("0.26.0",)
VLLM_COMMITS = ("003df29", "00f4240")

def _hash_bytes(request):
    """vLLM's own block hashes as bytes (BlockHash is bytes since v0.10), the
    ids a router that also hears vLLM's events knows; None for older vLLM
    (then the chain ids are published)."""
    hs = list(request.block_hashes)
    if hs and all(isinstance(h, (bytes, bytearray)) and 0 < len(h) <= 64 for h in hs) and len({len(h) for h in hs}) == 1:
        return [bytes(h) for h in hs]
    return None

def key_identity(vllm_config) -> str:
    """What the chain seed names (tutti.keys): the model (and revision) whose
    KV the blocks hold, and the tokens per block."""
    mc = getattr(vllm_config, "model_config", None)
    model = str(getattr(mc, "model", "model"))
    rev = getattr(mc, "revision", None)
    return f"{model}|revision={rev or ''}|block_size={int(vllm_config.cache_config.block_size)}"


@dataclass
class TuttiConnectorMetadata(KVConnectorMetadata):
    """One step's loads and saves, from the scheduler to every worker, and
    the requests whose blocks may be reused from this step on (preempted, or
    finished where blocks of other kinds than full attention's are: hand over
    their queued saves; resumed: drop them; finished, one KV group: their
    saves go on until ``reused``, the blocks the step writes afresh, names a
    block they read: tutti.scheduler_side.StepMeta)."""

    loads: List[LoadSpec] = field(default_factory=list)
    saves: List[SaveSpec] = field(default_factory=list)
    ended: List[str] = field(default_factory=list)
    dropped: List[str] = field(default_factory=list)
    finished: List[str] = field(default_factory=list)
    reused: List[int] = field(default_factory=list)


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s)[-48:] or "model"


def _tp(vllm_config):
    pc = getattr(vllm_config, "parallel_config", None)
    return max(1, int(getattr(pc, "tensor_parallel_size", 1) or 1))


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return int(get_tensor_model_parallel_rank())
    except Exception as e:
        raise RuntimeError(f"tutti.vllm: cannot get this worker's tensor-parallel rank: {e}") from e


class TuttiConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's KV connector over tutti stores; one per role and process. A
    hybrid model's KV cache groups (vLLM's hybrid manager) are served as
    tutti.groups says."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self.settings = Settings.parse(getattr(ktc, "kv_connector_extra_config", None))
        self.loads, self.saves = kv_role_parts(getattr(ktc, "kv_role", None))
        self.block_size = int(vllm_config.cache_config.block_size)
        self.tp_size = _tp(vllm_config)
        model = str(getattr(getattr(vllm_config, "model_config", None), "model", "model"))
        self._model = model
        mml = getattr(getattr(vllm_config, "model_config", None), "max_model_len", None)
        self._max_model_len = mml if isinstance(mml, int) and not isinstance(mml, bool) and mml > 0 else None
        self._key = f"{getattr(ktc, 'engine_id', '')}|{model}|{'|'.join(self.settings.dirs)}"
        self._stats = _Stats()
        self._worker: Optional[WorkerSide] = None
        self._sched: Optional[SchedulerSide] = None
        self._keys = RequestKeys(self.block_size, seed_of(key_identity(vllm_config)), _extra_keys_fn)
        self.rules = group_rules(kv_cache_config, self.block_size)
        self._group_layers = [list(g.layer_names) for g in kv_cache_config.kv_cache_groups] if self.rules else None
        self._group_capacity = None
        if self.rules is not None:  # the hybrid store's directory names every group's rule
            rules = "|".join(f"{r.kind}:{r.window_tokens}" for r in self.rules)
            self._hybrid_tag = hashlib.sha256(f"{model}|{rules}|{self.block_size}".encode()).hexdigest()[:12]
            self._group_capacity = group_capacities(self.settings.capacity_bytes, kv_cache_config)
        self._server: Optional[LookupServer] = None
        self._block_pool = None  # vLLM's (the scheduler's), read only: bind_gpu_block_pool
        self._incomplete: set = set()  # live requests counted in engine_hit_incomplete (once each)
        self._errors: set = set()
        self._load_started_at = None
        if role == KVConnectorRole.WORKER:
            self.rank = _tp_rank()
            self._holds: Optional[LocalMatcher] = None
            check = None
            if self.settings.check is not None:
                check = KVCheck(self.settings.check["dir"], self._store_subdir,
                                self.settings.check.get("max_records", MAX_RECORDS))
            save_event = None if self.settings.save_wait == "device" else False
            if self.rules is not None:
                checks = None
                if self.settings.check is not None:  # one per group, in the group's folder of the hybrid store's
                    checks = [KVCheck(self.settings.check["dir"], lambda lay, i=i: self._group_subdir(i),
                                      self.settings.check.get("max_records", MAX_RECORDS)) for i in range(len(self.rules))]
                self._hybrid = groups.HybridStore(self.rules)
                self._worker = GroupWorkers(self._open_group, self.rules, self._hybrid, holds=_HoldsProxy(self),
                                            save_flush_wait_ms=self.settings.save_flush_wait_ms, checks=checks,
                                            save_event=save_event)
            else:
                self._worker = WorkerSide(self._open_store, holds=_HoldsProxy(self), ends_requests=True,
                                          save_flush_wait_ms=self.settings.save_flush_wait_ms, check=check,
                                          save_event=save_event)
        else:
            self.rank = None
        self._events = None  # kv_events "vllm": the scheduler's side (tutti.vllm_events)
        if self.settings.kv_events == "vllm":
            from . import vllm_events
            vllm_events.check_enabled(vllm_config)
            if role != KVConnectorRole.WORKER:
                self._events = vllm_events.SchedulerEvents(self.tp_size)

    @property
    def requires_kv_delivery(self) -> bool:
        """Newer vLLM asks this of a kv_both/kv_producer connector (vLLM 0.26
        does not): tutti is a best-effort cache, nothing it saves must reach
        anyone, so a preempted request's KV is never waited for."""
        return False

    # ------------------------------------------------------------ worker
    def _store_subdir(self, lay: KVLayout) -> str:
        tag = hashlib.sha256(f"{self._model}|{lay.tag}|{self.block_size}".encode()).hexdigest()[:12]
        return os.path.join(f"{_slug(self._model)}-{tag}", f"tp{self.tp_size}-rank{self.rank}")

    def _store_dirs(self, lay: KVLayout) -> List[str]:
        out = []
        for d in self.settings.dirs:
            p = os.path.join(d, self._store_subdir(lay))
            os.makedirs(p, exist_ok=True)
            out.append(p)
        return out

    def _hybrid_subdir(self) -> str:
        return os.path.join(f"{_slug(self._model)}-hybrid-{self._hybrid_tag}", f"tp{self.tp_size}-rank{self.rank}")

    def _group_subdir(self, i: int) -> str:
        return groups.group_dir(self._hybrid_subdir(), i)

    def _open_group(self, i: int, lay: KVLayout) -> Store:
        """Group i's store (tutti.groups) in the hybrid store's directory:
        its manifest is written (or checked) with the first group, which
        also names the directory by every group's rule; the hybrid store is
        this process's store once every group is attached."""
        if i == 0:
            self._group_tags = []
        self._group_tags.append(f"{lay.tag}|{lay.geometry}")
        sub = self._hybrid_subdir()
        dirs = [groups.group_dir(os.path.join(d, sub), i) for d in self.settings.dirs]
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        first_full = next(j for j, r in enumerate(self.rules) if r.kind == "full") if any(
            r.kind == "full" for r in self.rules) else 0
        st = self._open_store(lay, dirs=dirs, kv_events=i == first_full, shared=False,
                              capacity_bytes=self._group_capacity[i] if self._group_capacity else None)
        self._hybrid.attach(i, st)
        if i == len(self.rules) - 1:
            want = groups.manifest(self.rules, self._group_tags)
            for d in self.settings.dirs:
                groups.ensure_manifest(os.path.join(d, sub), want)
            process_store(self._key, lambda: self._hybrid)
            self._holds = _process_matcher(self._key, self._hybrid, self.settings.hold_ttl_ms)
            self._server = LookupServer(socket_path(self.settings.lookup_socket_dir, self._key, self.rank), self._holds)
        return st

    def _open_store(self, lay: KVLayout, dirs: Optional[List[str]] = None, kv_events: bool = True,
                    shared: bool = True, capacity_bytes: Optional[int] = None) -> Store:
        """``capacity_bytes``: a hybrid group's share (default: the rank's)."""
        g = lay.geometry
        if self.tp_size > 1 and g.planes == 2:  # the store takes the whole model's heads and keeps its rank's share
            g = Geometry(g.layers, g.kv_heads * self.tp_size, g.head_dim, g.dtype, g.planes, g.page_tokens, g.chunk_pages)
        # The path decision: "cpu" on a GPU KV cache came through host staging
        # (register_kv_caches), so ``lay`` is then the host pool's.
        path = self.settings.path
        if path == "auto":
            path = "cpu" if lay.device == "cpu" else "gpu"
        elif (path == "cpu") != (lay.device == "cpu"):
            raise ValueError(f"kv_connector_extra_config.path = {path!r} but the KV cache is on {lay.device}")
        opts = dict(self.settings.store_options)
        kv_events = ("engine" if self.settings.kv_events == "vllm" else self.settings.kv_events) if kv_events else None
        if kv_events and kv_events != "engine" and self.tp_size > 1:
            raise ValueError("kv_connector_extra_config.kv_events: a tutti publisher with tensor parallelism (each "
                             "rank's store holds a shard; a router must see a block only when every rank holds it): "
                             "use 'vllm', which publishes the blocks every rank holds (docs/routers.md)")
        if path == "gpu" and lay.device.startswith("cuda:"):
            opts.setdefault("gpu_device", int(lay.device.split(":")[1]))
        opt_groups = options.from_flat(opts)

        def opener():
            if self.settings.connect is not None:  # the node's store (TP > 1 is refused: one service per shard)
                if dirs is not None:
                    raise ValueError("kv_connector_extra_config.connect: a hybrid model's KV groups need a store "
                                     "each; a node service serves one (leave 'connect' out for this model)")
                return Store(connect=self.settings.connect, geometry=g, num_pages=lay.num_pages, layout=lay.layout,
                             path=path, tp_rank=self.rank, tp_size=self.tp_size, **opt_groups)
            return Store(dirs or self._store_dirs(lay), capacity_bytes or self.settings.capacity_bytes, g, lay.num_pages,
                         layout=lay.layout, path=path, tp_rank=self.rank, tp_size=self.tp_size, kv_events=kv_events,
                         **opt_groups)
        try:
            if not shared:  # a group of a hybrid store: the hybrid store is the process's
                return opener()
            st = process_store(self._key, opener)
        except (_lib.NoGPU, _lib.NotSupported) as e:
            raise _gpu_path_error(e) from e
        self._holds = _process_matcher(self._key, st, self.settings.hold_ttl_ms)
        self._server = LookupServer(socket_path(self.settings.lookup_socket_dir, self._key, self.rank), self._holds)
        log.info("tutti: rank %d of %d, %s, store %s (%s path)", self.rank, self.tp_size, lay.tag, st.shard_geometry, path)
        return st

    def _host_staging_bytes(self, kv_caches):
        """Path "cpu" on a KV cache outside host memory: the CPU path through
        host staging (None: the tensors themselves)."""
        first = next(iter(kv_caches.values()), None)
        if isinstance(first, (list, tuple)) and first:  # a recurrent layer's state tensors
            first = first[0]
        on_host = str(getattr(first, "device", "cpu")) == "cpu"
        return self._staging_size() if self.settings.path == "cpu" and not on_host else None

    def _staging_size(self):
        """host_staging_bytes, or by default a pool sized for the engine's
        longest request (hoststage.SizedFor max_model_len)."""
        if self.settings.host_staging_bytes is not None:
            return self.settings.host_staging_bytes
        if self._max_model_len is None:
            raise ValueError("kv_connector_extra_config.host_staging_bytes: not given, and vLLM's config has no "
                             "model_config.max_model_len to size host staging by: set it")
        return SizedFor(self._max_model_len)

    def _register(self, kv_caches):
        try:
            if self.rules is not None:
                self._worker.register(kv_caches, self.block_size, self._group_layers,
                                      host_staging_bytes=self._host_staging_bytes(kv_caches))
                return
            self._worker.register(kv_caches, self.block_size, host_staging_bytes=self._host_staging_bytes(kv_caches))
        except (_lib.NoGPU, _lib.NotSupported) as e:  # the GPU path binds its kernels at registration
            raise _gpu_path_error(e) from e

    def register_kv_caches(self, kv_caches):
        self._register(kv_caches)

    def handle_preemptions(self, kv_connector_metadata):
        """vLLM calls this first in a step, before anything writes the KV
        cache: the queued saves of requests whose blocks may be reused from
        this step on are handed over (or dropped) now."""
        m = kv_connector_metadata
        self._worker.end_requests(m.ended, m.dropped, m.finished, m.reused)

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)  # the per-layer hooks run only while metadata is bound
        m = connector_metadata
        self._worker.bind(m.loads, m.saves, ended=m.ended, dropped=m.dropped, finished=m.finished, reused=m.reused)
        self._load_started_at = None

    def clear_connector_metadata(self):
        super().clear_connector_metadata()
        self._worker.unbind()

    def start_load_kv(self, forward_context=None, **kwargs):
        if self._load_started_at is None:
            self._load_started_at = time.monotonic()
        self._worker.start_load()

    def wait_for_layer_load(self, layer_name):
        self._worker.wait_for_layer(layer_name)

    def save_kv_layer(self, layer_name, kv_layer=None, attn_metadata=None, **kwargs):
        self._worker.save_layer(layer_name)

    def wait_for_save(self):
        self._worker.wait_for_save()

    def get_finished(self, finished_req_ids):
        """(None, requests whose background loads ended): saves are handed
        over before a finished request's blocks can be reused, so no finished
        request waits on tutti; a background load (async_loads) is reported
        once, when it ended, whether its request still waits or was aborted
        (vLLM frees its blocks then)."""
        res = self._worker.finish_step(finished_req_ids)
        st = self._worker.store
        if res.restored_blocks and st is not None:
            n = sum(res.restored_blocks.values())
            self._stats.add("load_blocks", n)
            if self.rules is None:  # a hybrid model's bytes come per group in res.counters (tutti.group_worker)
                g = st.shard_geometry
                self._stats.add("load_bytes", n * g.layers * g.page_bytes_per_layer * g.chunk_pages)
            if self._load_started_at is not None:
                self._stats.add("load_time_s", time.monotonic() - self._load_started_at)
        if res.error_block_ids:
            self._stats.add("load_error_blocks", len(res.error_block_ids))
            for rid, e in res.failures.items():
                log.warning("tutti: request %s: promised blocks not restored: %s", rid, e)
        for k, v in res.counters.items():
            self._stats.add(k, v)
        if self._worker.check is not None:
            for k, v in self._worker.check.take_counts().items():
                self._stats.add(k, v)
        self._errors |= res.error_block_ids
        return None, (res.recving or None)

    def get_kv_connector_kv_cache_events(self):
        st = self._worker.store if self._worker is not None else None
        if isinstance(st, groups.HybridStore):  # the first full group's store publishes (tutti.groups)
            st = next((s for s, r in zip(st.stores, st.rules) if r.kind == "full" and s is not None), None)
        if self.settings.kv_events != "vllm" or st is None:
            return None
        from .vllm_events import worker_events
        return worker_events(st, self.rank)

    def get_block_ids_with_load_errors(self):
        out, self._errors = self._errors, set()
        return out

    def get_kv_connector_stats(self):
        if KVConnectorStats is None:
            return None
        d = self._stats.take()
        if self._worker is not None:
            d.update(self._worker.take_stats())
        if self._sched is not None:
            d.update({k: v for k, v in self._sched.counters.items() if not k.startswith("fallback")})
            d["fallbacks"] = sum(v for k, v in self._sched.counters.items() if k.startswith("fallback"))
            self._sched.counters.clear()
        return TuttiConnectorStats(data=d) if any(d.values()) else None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return TuttiConnectorStats(data=dict(data or {})) if KVConnectorStats is not None else None

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        if KVConnectorStats is None:
            return None
        return TuttiPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None  # tutti reads the layout from the tensors' strides

    @classmethod
    def requires_piecewise_for_cudagraph(cls, *args, **kwargs) -> bool:
        return True  # wait_for_layer_load must run between layers

    def shutdown(self):
        if self._sched is not None and isinstance(self._sched.matcher, RemoteMatcher):
            self._sched.matcher.close()
        if self._server is not None:
            self._server.close()
        if self._worker is not None:
            self._worker.close(close_store=False)
        st = shared_store(self._key)
        if st is not None and self._worker is not None:
            st.close()

    # --------------------------------------------------------- scheduler
    def _scheduler(self) -> SchedulerSide:
        if self._sched is None:
            st = shared_store(self._key)
            if st is not None:  # the worker is in this process (TP = 1, one process): its store serves both roles
                matcher = _process_matcher(self._key, st, self.settings.hold_ttl_ms)
            else:
                paths = [socket_path(self.settings.lookup_socket_dir, self._key, r) for r in range(self.tp_size)]
                matcher = RemoteMatcher(paths, self.settings.lookup_timeout_ms / 1000)
            self._sched = SchedulerSide(matcher, self.block_size, rules=self.rules, async_loads=self.settings.async_loads,
                                        loads=self.loads, saves=self.saves)
        return self._sched

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens tutti restores beyond the local hits, whether the load runs
        in the background: async_loads, vLLM's WAITING_FOR_REMOTE_KVS).
        (None, False) while a rank's answer is not in: vLLM asks again at a
        later step."""
        sched = self._scheduler()
        rid = request.request_id
        try:
            chain = self._keys.chain(request)
        except Unkeyable as e:
            sched.counters["unkeyable"] += 1
            log.debug("tutti: request %s: not keyed, a miss: %s", rid, e)
            return 0, False
        if rid in self._incomplete:
            return 0, False  # vLLM resumes it from a broken hit: none of it is saved any more (below)
        if self.settings.kv_events:
            sched.track(rid, chain, request, tokens_of=prompt_tokens, hashes_of=_hash_bytes)
        else:
            sched.track(rid, chain)
        if getattr(request, "skip_reading_prefix_cache", False):
            return 0, False  # saved, never read
        n = sched.get_num_new_matched_tokens(rid, chain, int(request.num_tokens), int(num_computed_tokens))
        if n == 0 and rid not in self._incomplete and engine_hit_incomplete(
                self._block_pool, request, int(num_computed_tokens), self.block_size, [r.kind for r in self.rules or ()]):
            self._incomplete.add(rid)
            sched.counters["engine_hit_incomplete"] += 1
            sched.untrack(rid)  # what it computes from there is not what the tokens give: never stored
            log.warning("tutti: vLLM resumes request %s from its own hit of %d tokens with a KV cache group's part of "
                        "it gone (docs/vllm.md): its outputs may part from a run without a connector; tutti saves "
                        "none of it", rid, num_computed_tokens)
        return n, bool(n) and sched.background(rid)

    def bind_gpu_block_pool(self, gpu_block_pool):
        self._block_pool = gpu_block_pool  # read by engine_hit_incomplete only

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        ids = blocks.get_block_ids()
        if self.rules is not None:
            self._scheduler().update_state_after_alloc(request.request_id, [list(g) for g in ids], num_external_tokens)
            return
        ids = ids[0] if ids and isinstance(ids[0], (list, tuple)) else ids
        self._scheduler().update_state_after_alloc(request.request_id, list(ids), num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        m = self._scheduler().build_meta(scheduler_output)
        return TuttiConnectorMetadata(loads=m.loads, saves=m.saves, ended=m.ended, dropped=m.dropped, finished=m.finished,
                                      reused=m.reused)

    def request_finished(self, request, block_ids):
        self._keys.forget(request.request_id)
        self._incomplete.discard(request.request_id)
        return self._scheduler().request_finished(request.request_id), None

    def request_finished_all_groups(self, request, block_ids):
        """vLLM's hybrid manager's request_finished (SupportsHMA): block ids per
        KV cache group. False: the blocks are freed at once (saves are handed
        over before they can be reused, as for one group)."""
        return self.request_finished(request, block_ids)

    def update_connector_output(self, connector_output):
        if self._sched is not None:
            self._sched.recv_ended(getattr(connector_output, "finished_recving", None) or ())
        if self._events is not None:
            self._events.update(getattr(connector_output, "kv_cache_events", None))

    def take_events(self):
        return self._events.take() if self._events is not None else ()


def _gpu_path_error(e: Exception) -> RuntimeError:
    return RuntimeError(f"tutti: the GPU path cannot run here ({e}). Set kv_connector_extra_config.path = \"cpu\" to use "
                        "tutti's CPU path through pinned host staging (host_staging_bytes; docs/vllm.md)")


class _HoldsProxy:
    """The worker releases a request's hold once its load started; the holds
    are the process matcher, known once the store is open."""

    def __init__(self, conn: TuttiConnector):
        self._conn = conn

    def release(self, req_id: str):
        if self._conn._holds is not None:
            self._conn._holds.release(req_id)


_matchers: Dict[str, LocalMatcher] = {}


def _process_matcher(key: str, store: Store, ttl_ms: int) -> LocalMatcher:
    m = _matchers.get(key)
    if m is None or m.store is not store:
        m = _matchers[key] = LocalMatcher(store, ttl_ms)
    return m


def _register_by_name():
    """MultiConnector rebuilds a child's stats that crossed processes by the
    child's class name (KVConnectorFactory.get_connector_class_by_name): a
    connector loaded by module path must be in the factory's registry too."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        KVConnectorFactory.register_connector("TuttiConnector", __name__, "TuttiConnector")
    except ValueError:
        pass  # registered already (this module imported again)
    except (ImportError, AttributeError) as e:  # a vLLM without the registry: nothing to rebuild by name
        log.debug("tutti: not registered by name: %s", e)


_register_by_name()

__all__ = ["TuttiConnector", "group_rules", "TuttiConnectorMetadata", "Settings", "key_identity", "VLLM_VERSIONS", "VLLM_COMMITS", "_lib"]
