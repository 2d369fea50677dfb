"""What vLLM 0.26's OffloadingConnector (its CPU tier) registers with
Prometheus, names and kinds (offloading/metrics.py, kv_offload/cpu/spec.py):
a connector beside it under MultiConnector registers in the same registry."""
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import Counter, Gauge, Histogram, KVConnectorPromMetrics

COUNTERS = ("vllm:kv_offload_load_bytes", "vllm:kv_offload_load_time", "vllm:kv_offload_store_bytes",
            "vllm:kv_offload_store_time", "vllm:kv_offload_allocation_failure", "vllm:kv_offload_stores_skipped")
HISTOGRAMS = ("vllm:kv_offload_load_size", "vllm:kv_offload_store_size", "vllm:kv_offload_lookup_sync_delay_seconds",
              "vllm:kv_offload_lookup_async_delay_seconds", "vllm:kv_offload_cpu_allocation_size")
GAUGES = ("vllm:kv_offload_cpu_cache_usage_perc", "vllm:kv_offload_cpu_cache_write_usage_perc",
          "vllm:kv_offload_cpu_cache_read_usage_perc")
DEPRECATED = {"vllm:kv_offload_total_bytes": Counter, "vllm:kv_offload_total_time": Counter,
              "vllm:kv_offload_size": Histogram}  # with a transfer_type label


class OffloadPromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.metrics = {}
        for kind, names in ((Counter, COUNTERS), (Histogram, HISTOGRAMS), (Gauge, GAUGES)):
            for n in names:
                self.metrics[n] = metric_types[kind](name=n, documentation=n, labelnames=list(labelnames))
        for n, kind in DEPRECATED.items():
            self.metrics[n] = metric_types[kind](name=n, documentation=n, labelnames=list(labelnames) + ["transfer_type"])

    def observe(self, transfer_stats_data, engine_idx=0):
        pass
