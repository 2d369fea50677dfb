"""tutti's connector statistics and Prometheus metrics in vLLM's terms
(``get_kv_connector_stats``, ``build_prom_metrics``; docs/vllm.md, Metrics).
``TuttiConnectorStats`` and ``TuttiPromMetrics`` are None on a vLLM without
connector stats."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
except ImportError:  # vLLM before connector stats: stats and metrics are off
    KVConnectorPromMetrics = KVConnectorStats = None

TuttiConnectorStats = TuttiPromMetrics = None


class _Stats:
    """Counters of one connector role since the last report."""

    def __init__(self):
        self.data: Dict[str, float] = {}

    def add(self, key: str, v: float = 1):
        self.data[key] = self.data.get(key, 0) + v

    def take(self) -> Dict[str, float]:
        d, self.data = self.data, {}
        return d


if KVConnectorStats is not None:
    @dataclass
    class TuttiConnectorStats(KVConnectorStats):
        """Sums of tutti's counters (data: name → number), per interval."""

        def reset(self):
            self.data = {}

        def aggregate(self, other):
            for k, v in (other.data or {}).items():
                self.data[k] = self.data.get(k, 0) + v
            return self

        def reduce(self):
            return dict(self.data)

        def is_empty(self):
            return not any(self.data.values())

    class TuttiPromMetrics(KVConnectorPromMetrics):
        """tutti's own names (vllm:tutti_*): they never collide with another
        connector's in one process (vLLM's OffloadingConnector registers
        vllm:kv_offload_*, and under MultiConnector both register)."""

        COUNTERS = {
            "load_bytes": ("vllm:tutti_load_bytes", "Bytes tutti restored into the KV cache"),
            "load_blocks": ("vllm:tutti_load_blocks", "Blocks tutti restored"),
            "save_blocks": ("vllm:tutti_store_blocks", "Blocks tutti was asked to store"),
            "lookups": ("vllm:tutti_lookups", "Lookups answered (get_num_new_matched_tokens)"),
            "lookups_deferred": ("vllm:tutti_lookups_deferred", "Lookups answered 'ask again' (a rank's answer not in yet)"),
            "lookup_tokens": ("vllm:tutti_lookup_tokens", "Tokens looked up beyond local hits"),
            "hit_tokens": ("vllm:tutti_hit_tokens", "Tokens tutti promised to restore and vLLM allocated for"),
            "load_error_blocks": ("vllm:tutti_load_error_blocks", "Promised blocks not restored"),
            "fallbacks": ("vllm:tutti_lookup_fallbacks", "Lookups answered as misses because a rank failed or was late"),
            "engine_hit_incomplete": ("vllm:tutti_engine_hit_incomplete",
                                      "Requests vLLM resumed from its own hit with a KV cache group's part of it gone "
                                      "(Mamba models; docs/vllm.md)"),
            "unkeyable": ("vllm:tutti_unkeyable_lookups", "Lookups of requests whose extra keys tutti cannot represent (misses, never saved)"),
            "save_gave_up_blocks": ("vllm:tutti_save_gave_up_blocks", "Blocks of a save never committed after its retries"),
            "save_dropped_blocks": ("vllm:tutti_save_dropped_blocks", "Queued blocks not saved: their pages were reused"),
            "save_inflight_cap_waits": ("vllm:tutti_save_inflight_cap_waits",
                                        "Saves waited for in a step: more than MAX_INFLIGHT_SAVES still read their pages"),
            "loads_async_cap": ("vllm:tutti_loads_async_cap",
                                "Hits loaded inside their step: MAX_ASYNC_LOADS background loads already in flight"),
            "loads_background_staged": ("vllm:tutti_loads_background_staged",
                                        "Background loads ended within their step: host staging's rounds share its pages"),
            "save_end_waits": ("vllm:tutti_save_end_waits",
                               "Steps whose start ended a request's saves still in flight or queued"),
            "save_end_wait_s": ("vllm:tutti_save_end_wait_seconds",
                                "Seconds steps' starts waited for ended requests' saves (pages copied out, last chunks handed over)"),
            "save_sync_s": ("vllm:tutti_save_sync_seconds",
                            "Seconds the host waited for the GPU to write the KV a step's saves read, before issuing them"),
            "save_issue_s": ("vllm:tutti_save_issue_seconds", "Seconds the host spent handing a step's saves to the store"),
            "save_ends_deferred": ("vllm:tutti_save_ends_deferred",
                                   "Finished requests whose saves went on reading their blocks until vLLM allocated them again"),
            "save_end_reuses": ("vllm:tutti_save_end_reuses",
                                "Finished requests' saves waited for: vLLM allocated a block they still read"),
            "save_ends_deferred_cap": ("vllm:tutti_save_ends_deferred_cap",
                                       "Finished requests' saves waited for: more than MAX_DEFERRED_ENDS deferred"),
            "save_flush_timeouts": ("vllm:tutti_save_flush_timeouts", "A finishing request's last save handed over before the one before it committed"),
            "check_match": ("vllm:tutti_check_match", "Check mode: restored block-layers equal to what the engine computed"),
            "check_mismatch": ("vllm:tutti_check_mismatch", "Check mode: restored block-layers unlike what the engine computed"),
            "check_unknown": ("vllm:tutti_check_unknown", "Check mode: restored block-layers with no digest recorded"),
            # host staging (path "cpu" on a GPU KV cache; tutti.hoststage.COUNTERS)
            "staging_h2d_bytes": ("vllm:tutti_staging_h2d_bytes", "Bytes copied from host staging into the KV cache"),
            "staging_d2h_bytes": ("vllm:tutti_staging_d2h_bytes", "Bytes copied from the KV cache into host staging"),
            "staging_short_blocks": ("vllm:tutti_staging_short_blocks",
                                     "Promised blocks not restored: no host staging page was free"),
            "staging_skipped_saves": ("vllm:tutti_staging_skipped_saves", "Saves skipped: too few host staging pages free"),
            "staging_failed_saves": ("vllm:tutti_staging_failed_saves",
                                     "Saves through host staging the store refused once their copies completed"),
        }

        def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
            super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
            self._counters = {k: self.make_per_engine(self._counter_cls(name=n, documentation=d, labelnames=labelnames))
                              for k, (n, d) in self.COUNTERS.items()}
            self._load_time = self.make_per_engine(self._histogram_cls(
                name="vllm:tutti_load_time_seconds", documentation="Seconds from start_load_kv to the step's loads done",
                labelnames=labelnames, buckets=[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5]))

        def make_per_engine(self, metric):
            # KVConnectorPromMetrics has no such helper in vLLM 0.26
            return {idx: metric.labels(*lv) for idx, lv in self.per_engine_labelvalues.items()}

        def observe(self, transfer_stats_data, engine_idx: int = 0):
            for k, v in transfer_stats_data.items():
                if k in self._counters and v:
                    self._counters[k][engine_idx].inc(v)
            if transfer_stats_data.get("load_time_s"):
                self._load_time[engine_idx].observe(transfer_stats_data["load_time_s"])
