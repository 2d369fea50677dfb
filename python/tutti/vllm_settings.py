"""kv_connector_extra_config of tutti's vLLM connector, checked: one home
for its keys, their defaults and limits (docs/vllm.md lists every key).
Needs no vLLM: :class:`Settings` is tested and used without it."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from . import hoststage, options
from .kvcheck import MAX_RECORDS
from .save_queue import FLUSH_WAIT_MS

log = logging.getLogger("tutti.vllm")

_KEYS = {"dirs", "capacity_bytes", "connect", "path", "hold_ttl_ms", "lookup_socket_dir", "lookup_timeout_ms",
         "pythonhashseed", "store_options", "kv_events", "host_staging_bytes", "save_flush_wait_ms", "check",
         "async_loads", "save_wait"}
_CHECK_KEYS = {"dir", "max_records"}
# store_options take the flat names of tutti.options.FLAT (a JSON object has
# no dataclasses); the connector picks the CUDA device itself.
_STORE_OPTIONS = (set(options.FLAT) - {"gpu_device"}) | options.NO_OP


@dataclass
class Settings:
    """kv_connector_extra_config, checked (every key is in docs/vllm.md)."""

    dirs: Optional[List[str]] = None  # required unless connect
    capacity_bytes: Optional[int] = None  # required unless connect
    connect: Optional[str] = None  # the socket of the node's `tutti serve` (docs/serve.md)
    path: str = "auto"
    hold_ttl_ms: int = 30000
    lookup_socket_dir: str = field(default_factory=tempfile.gettempdir)
    lookup_timeout_ms: int = 2000
    pythonhashseed: Optional[str] = None  # deprecated, no effect (blocks are keyed by their tokens)
    store_options: Dict[str, Any] = field(default_factory=dict)
    # "vllm" (vLLM publishes tutti's blocks with its own, any TP) or a tutti
    # publisher's spec "tcp://HOST:PORT?replay=...&topic=kv@pod@model" (TP = 1): docs/routers.md
    kv_events: Optional[str] = None
    host_staging_bytes: Optional[int] = None  # path "cpu" on a GPU KV cache: pinned pool per rank (None: hoststage.SizedFor max_model_len)
    save_flush_wait_ms: int = FLUSH_WAIT_MS
    check: Optional[Dict[str, Any]] = None  # {"dir": PATH, "max_records": N}: check mode (tutti.kvcheck)
    # Restores run beside the engine's steps (vLLM's WAITING_FOR_REMOTE_KVS)
    # instead of inside their request's step; "auto": while other requests
    # are live (docs/vllm.md).
    async_loads: Any = False
    # Where a step's saves wait for its KV writes on the GPU path: "device"
    # (the gathers wait for an event of the engine's stream) or "host" (the
    # host waits for the stream at the save point).
    save_wait: str = "device"

    @staticmethod
    def parse(extra: Optional[dict]) -> "Settings":
        extra = dict(extra or {})
        unknown = set(extra) - _KEYS
        if unknown:
            raise ValueError(f"kv_connector_extra_config: unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}")
        conn = extra.get("connect")
        service_keys = {"dirs", "capacity_bytes", "kv_events"} & set(extra)
        if "connect" in extra and (not isinstance(conn, str) or not conn or service_keys):
            raise ValueError(f"kv_connector_extra_config.connect = {conn!r}: want the socket of `tutti serve`, and no dirs, "
                             "capacity_bytes or kv_events (the service's)")
        for k in ("dirs", "capacity_bytes"):
            if k not in extra and conn is None:
                raise ValueError(f"kv_connector_extra_config: {k!r} is required unless 'connect' (see docs/vllm.md)")
        s = Settings(**extra)
        if conn is None and (isinstance(s.dirs, str) or not s.dirs or not all(isinstance(d, str) and d for d in s.dirs)):
            raise ValueError(f"kv_connector_extra_config.dirs = {s.dirs!r}: want a non-empty list of directories")
        if conn is None and (not isinstance(s.capacity_bytes, int) or s.capacity_bytes <= 0):
            raise ValueError(f"kv_connector_extra_config.capacity_bytes = {s.capacity_bytes!r}: want bytes > 0 (per rank)")
        if s.path not in ("gpu", "cpu", "auto"):
            raise ValueError(f"kv_connector_extra_config.path = {s.path!r}: want 'gpu', 'cpu' or 'auto'")
        if s.host_staging_bytes is not None:
            hoststage.check_host_staging_bytes(s.host_staging_bytes, "kv_connector_extra_config.host_staging_bytes")
        if s.kv_events is not None and (not isinstance(s.kv_events, str) or
                                        (s.kv_events != "vllm" and not s.kv_events.startswith("tcp://"))):
            raise ValueError(f"kv_connector_extra_config.kv_events = {s.kv_events!r}: want 'vllm' or an endpoint string "
                             "(docs/routers.md)")
        if s.pythonhashseed is not None:
            if s.pythonhashseed not in ("require", "warn"):
                raise ValueError(f"kv_connector_extra_config.pythonhashseed = {s.pythonhashseed!r}: deprecated, and "
                                 f"'require' or 'warn' if given")
            log.warning("kv_connector_extra_config.pythonhashseed is deprecated and has no effect: tutti keys blocks "
                        "by their tokens, the same in every process; PYTHONHASHSEED is not needed")
        if s.check is not None:
            if not isinstance(s.check, dict) or set(s.check) - _CHECK_KEYS or not isinstance(s.check.get("dir"), str) \
                    or not s.check["dir"]:
                raise ValueError(f"kv_connector_extra_config.check = {s.check!r}: want {{\"dir\": PATH}} and optionally "
                                 f"\"max_records\" (keys {sorted(_CHECK_KEYS)})")
            mr = s.check.get("max_records", MAX_RECORDS)
            if not isinstance(mr, int) or isinstance(mr, bool) or mr <= 0:
                raise ValueError(f"kv_connector_extra_config.check.max_records = {mr!r}: want an int > 0")
        bad = set(s.store_options) - _STORE_OPTIONS
        if bad:
            raise ValueError(f"kv_connector_extra_config.store_options: unknown {sorted(bad)}; known: {sorted(_STORE_OPTIONS)}")
        for k in ("hold_ttl_ms", "lookup_timeout_ms"):
            if not isinstance(getattr(s, k), int) or not 0 < getattr(s, k) <= 3600 * 1000:
                raise ValueError(f"kv_connector_extra_config.{k} = {getattr(s, k)!r}: want 1..3600000")
        if not (isinstance(s.async_loads, bool) or s.async_loads == "auto"):
            raise ValueError(f"kv_connector_extra_config.async_loads = {s.async_loads!r}: want true, false or \"auto\"")
        if s.save_wait not in ("device", "host"):
            raise ValueError(f"kv_connector_extra_config.save_wait = {s.save_wait!r}: want \"device\" or \"host\"")
        if not isinstance(s.save_flush_wait_ms, int) or not 0 <= s.save_flush_wait_ms <= 600 * 1000:
            raise ValueError(f"kv_connector_extra_config.save_flush_wait_ms = {s.save_flush_wait_ms!r}: want 0..600000")
        return s


KV_ROLES = {"kv_both": (True, True), "kv_producer": (False, True), "kv_consumer": (True, False)}


def kv_role_parts(role) -> Tuple[bool, bool]:
    """vLLM's kv_role as (loads, saves): a producer only saves, a consumer
    only loads (what it restores was saved by another engine)."""
    if role not in KV_ROLES:
        raise ValueError(f"kv_transfer_config.kv_role = {role!r}: want one of {sorted(KV_ROLES)}")
    return KV_ROLES[role]
