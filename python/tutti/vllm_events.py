"""tutti's KV events published by vLLM itself (``kv_connector_extra_config``
``"kv_events": "vllm"``; docs/routers.md), at any tensor-parallel degree.

vLLM's path for a connector's events, read from vLLM 0.26's source: each
worker's ``get_kv_connector_kv_cache_events()`` returns a
``KVConnectorKVEvents``; the executor's ``KVOutputAggregator`` merges the
workers' into one (``add_events(other.get_all_events())``,
``increment_workers(1)``); the scheduler hands it to the connector's
``update_connector_output()``, then publishes what the connector's
``take_events()`` yields, with vLLM's own publisher (its ZeroMQ socket,
topic, sequence numbers and replay), next to the GPU blocks' events.

Here each worker takes its rank's store's events (``Store(kv_events=
"engine")``), their hashes as vLLM publishes its own
(``maybe_convert_block_hash``), and tags them with its rank; the scheduler
feeds them to :class:`tutti.kv_events.CommonBlocks`, which publishes a block
once every rank's store holds its share. vLLM's own ``KVEventAggregator``
(the count of identical events in one step) does not fit tutti: each rank's
store commits its saves at its own pace, so one block's events arrive in
different steps, and runs of different lengths.
"""

from __future__ import annotations

import logging
from typing import List, Optional

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVConnectorKVEvents
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from .kv_events import CommonBlocks, decode

log = logging.getLogger("tutti.vllm")

KV_EVENTS_CONFIG = ('--kv-events-config \'{"enable_kv_cache_events": true, "publisher": "zmq", '
                    '"endpoint": "tcp://*:5557", "topic": "kv@POD@MODEL"}\'')


def check_enabled(vllm_config):
    """tutti's events go out through vLLM's publisher: refuse to start when
    vLLM would drop them."""
    kec = getattr(vllm_config, "kv_events_config", None)
    if kec is None or not getattr(kec, "enable_kv_cache_events", False) or getattr(kec, "publisher", "null") == "null":
        raise ValueError("kv_connector_extra_config.kv_events = 'vllm' publishes through vLLM's own KV events, which "
                         f"are off: start vLLM with {KV_EVENTS_CONFIG} (docs/routers.md)")
    missing = {"lora_name", "extra_keys", "group_idx", "locality"} - set(getattr(BlockStored, "__struct_fields__", ()))
    if missing:
        raise ValueError(f"kv_connector_extra_config.kv_events = 'vllm': this vLLM's BlockStored has no "
                         f"{sorted(missing)}; it needs vLLM 0.26 or later (or a tutti publisher: docs/routers.md)")


class TuttiKVEvents(KVConnectorKVEvents):
    """The workers' events on their way to the scheduler: (rank, event)
    pairs, each rank's in its store's order. vLLM merges the workers' objects
    (add_events, increment_workers); aggregation is the scheduler's
    (:class:`tutti.kv_events.CommonBlocks`), so ``aggregate`` keeps all."""

    def __init__(self, rank: int, events: List[dict]):
        self._items = [(rank, e) for e in events]
        self._workers = 1

    def add_events(self, events):
        self._items.extend(events)

    def aggregate(self):
        return self

    def increment_workers(self, count: int = 1):
        self._workers += count

    def get_all_events(self):
        return list(self._items)

    def get_number_of_workers(self) -> int:
        return self._workers

    def clear_events(self):
        self._items.clear()
        self._workers = 1

    def by_rank(self):
        """{rank: [events]} in each rank's order."""
        out = {}
        for rank, e in self._items:
            out.setdefault(rank, []).append(e)
        return out

    def __repr__(self):
        return f"<TuttiKVEvents workers={self._workers} events={len(self._items)}>"


def _external(h):
    return maybe_convert_block_hash(h) if isinstance(h, (bytes, bytearray)) else h


def worker_events(store, rank: int) -> Optional[TuttiKVEvents]:
    """This rank's store's events since the last step (None: none), hashes
    as vLLM publishes its own."""
    events = [e for p in store.take_kv_events() for e in decode(p)]
    if not events:
        return None
    for e in events:
        if "block_hashes" in e:
            e["block_hashes"] = [_external(h) for h in e["block_hashes"]]
        if e.get("parent_block_hash") is not None:
            e["parent_block_hash"] = _external(e["parent_block_hash"])
    return TuttiKVEvents(rank, events)


_CLASSES = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved}


class SchedulerEvents:
    """The scheduler connector's side: ``update`` with what the workers sent
    (update_connector_output's kv_cache_events), ``take`` vLLM's events to
    publish (take_events)."""

    def __init__(self, ranks: int):
        self.common = CommonBlocks(ranks)
        self._warned = 0

    def update(self, kv_cache_events):
        if not isinstance(kv_cache_events, TuttiKVEvents):
            return
        for rank, events in sorted(kv_cache_events.by_rank().items()):
            self.common.add(rank, events)
        kv_cache_events.clear_events()
        untracked = self.common.counters["untracked_blocks"]
        if untracked > self._warned:
            log.warning("tutti: %d blocks past the %d tracked for KV events were not published",
                        untracked - self._warned, self.common.max_blocks)
            self._warned = untracked

    def take(self) -> list:
        out = []
        for e in self.common.take():
            out.append(_CLASSES[e.pop("type")](**e))
        return out
