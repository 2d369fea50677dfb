"""KVConnectorStats and KVConnectorPromMetrics as vLLM 0.26 defines them
(the prometheus classes are passed in by vLLM as metric_types, keyed by
prometheus_client's Gauge, Counter and Histogram: here stand-in key classes;
0.26's base class has no per-engine helper)."""
from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVConnectorStats:
    data: dict[str, Any] = field(default_factory=dict)

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other):
        raise NotImplementedError

    def reduce(self):
        raise NotImplementedError

    def is_empty(self):
        raise NotImplementedError


class Gauge:  # the keys of metric_types (prometheus_client's classes in vLLM)
    pass


class Counter:
    pass


class Histogram:
    pass


class KVConnectorPromMetrics:
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._gauge_cls = metric_types[Gauge]
        self._counter_cls = metric_types[Counter]
        self._histogram_cls = metric_types[Histogram]
        self._labelnames = labelnames
        self.per_engine_labelvalues = per_engine_labelvalues

    def observe(self, transfer_stats_data, engine_idx=0):
        raise NotImplementedError
