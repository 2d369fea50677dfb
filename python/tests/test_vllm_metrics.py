"""tutti.vllm.TuttiConnector beside vLLM's own connectors: its Prometheus
metrics register in one registry with vLLM 0.26's OffloadingConnector's (as
under MultiConnector, a CPU tier in front of tutti), its stats are rebuilt by
class name as MultiConnector rebuilds a child's stats that crossed
processes, and it is a best-effort cache (nothing it saves must be
delivered). Prometheus checks use Debian's python3-prometheus-client
(scripts/test-deps.sh); they skip, saying so, where it is missing."""

import functools
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
DOUBLE = os.path.join(HERE, "vllm_double")

try:
    import prometheus_client
except ImportError:
    prometheus_client = None


class BesideVLLMTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, DOUBLE)

    @classmethod
    def tearDownClass(cls):
        sys.path.remove(DOUBLE)

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="tutti-metrics-")
        self.addCleanup(shutil.rmtree, self.root, True)

    def config(self):
        from vllm.config import KVTransferConfig, VllmConfig
        return VllmConfig(kv_transfer_config=KVTransferConfig(
            "TuttiConnector", "tutti.vllm", "kv_both", {"dirs": [self.root], "capacity_bytes": 1 << 20}))

    @unittest.skipIf(prometheus_client is None, "prometheus_client missing (Debian's python3-prometheus-client)")
    def test_metrics_coexist_with_offloading_connector(self):
        import tutti.vllm as tv
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import Counter, Gauge, Histogram
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadPromMetrics
        reg = prometheus_client.CollectorRegistry()
        types = {Gauge: functools.partial(prometheus_client.Gauge, registry=reg),
                 Counter: functools.partial(prometheus_client.Counter, registry=reg),
                 Histogram: functools.partial(prometheus_client.Histogram, registry=reg)}
        labels, values = ["model_name", "engine"], {0: ["m", "0"]}
        OffloadPromMetrics(self.config(), types, labels, values)
        prom = tv.TuttiConnector.build_prom_metrics(self.config(), types, labels, values)  # raised "Duplicated timeseries"
        prom.observe({"load_bytes": 4096, "hit_tokens": 32, "load_time_s": 0.25, "check_mismatch": 1})
        lv = {"model_name": "m", "engine": "0"}
        self.assertEqual(reg.get_sample_value("vllm:tutti_load_bytes_total", lv), 4096)
        self.assertEqual(reg.get_sample_value("vllm:tutti_hit_tokens_total", lv), 32)
        self.assertEqual(reg.get_sample_value("vllm:tutti_check_mismatch_total", lv), 1)
        self.assertEqual(reg.get_sample_value("vllm:tutti_load_time_seconds_count", lv), 1)
        names = {m.name for m in reg.collect()}
        self.assertLessEqual({"vllm:kv_offload_load_bytes", "vllm:kv_offload_load_time", "vllm:tutti_load_bytes"}, names)

    def test_stats_rebuilt_by_class_name(self):
        """MultiConnector rebuilds a child's stats that crossed processes with
        KVConnectorFactory.get_connector_class_by_name(child class name)."""
        import tutti.vllm as tv
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        cls = KVConnectorFactory.get_connector_class_by_name("TuttiConnector")
        self.assertIs(cls, tv.TuttiConnector)
        st = cls.build_kv_connector_stats(data={"load_bytes": 2, "lookups": 1})
        st.aggregate(cls.build_kv_connector_stats(data={"load_bytes": 3}))
        self.assertEqual(st.reduce(), {"load_bytes": 5, "lookups": 1})

    def test_best_effort_cache(self):
        """kv_role kv_both makes vLLM count tutti as a producer; newer vLLM then
        asks requires_kv_delivery (0.26 does not), and tutti answers False;
        finished requests' blocks are never held for tutti."""
        import tutti.vllm as tv
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.request import Request
        c = KVConnectorFactory.create_connector(self.config(), KVConnectorRole.SCHEDULER, None)
        self.addCleanup(c.shutdown)
        self.assertIs(c.requires_kv_delivery, False)
        self.assertIs(tv.TuttiConnector.requires_kv_delivery.fget(c), False)
        self.assertEqual(c.request_finished(Request("r", list(range(40)), 16), [1, 2, 3]), (False, None))


if __name__ == "__main__":
    unittest.main()
