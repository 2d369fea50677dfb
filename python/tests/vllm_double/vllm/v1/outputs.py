"""What a worker's step returns to the scheduler (vllm/v1/outputs.py): the
parts a KV connector fills."""
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class KVConnectorOutput:
    finished_sending: Optional[set] = None
    finished_recving: Optional[set] = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    invalid_block_ids: set = field(default_factory=set)


@dataclass
class ModelRunnerOutput:
    kv_connector_output: Optional[KVConnectorOutput] = None
