"""KVOutputAggregator's merge of the workers' KV cache events
(vllm/distributed/kv_transfer/kv_connector/utils.py, vLLM 0.26): the first
worker's object that is not None collects the others' events, one
increment_workers per further worker that sent some."""
from vllm.v1.outputs import KVConnectorOutput


class KVOutputAggregator:
    def aggregate(self, outputs, output_rank: int = 0):
        combined = None
        for out in outputs:
            kv_output = out.kv_connector_output
            if not kv_output:
                continue
            if combined is None:
                combined = kv_output.kv_cache_events
            elif kv_cache_events := kv_output.kv_cache_events:
                assert isinstance(combined, type(kv_cache_events))
                combined.add_events(kv_cache_events.get_all_events())
                combined.increment_workers(1)
        output = outputs[output_rank]
        output.kv_connector_output = KVConnectorOutput(kv_cache_events=combined or None)
        return output
