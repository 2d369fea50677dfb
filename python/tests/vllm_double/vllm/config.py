"""The config objects a connector reads (vllm/config: VllmConfig and parts)."""
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = None
    kv_connector_module_path: Optional[str] = None
    kv_role: Optional[str] = None
    kv_connector_extra_config: dict = field(default_factory=dict)
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class CacheConfig:
    block_size: int = 16


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1


@dataclass
class ModelConfig:
    model: str = "facebook/opt-125m"
    revision: Optional[str] = None
    max_model_len: int = 2048


@dataclass
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: Optional[str] = None  # "null" or "zmq"; None: zmq when enabled
    endpoint: str = "tcp://*:5557"
    topic: str = ""

    def __post_init__(self):
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"


@dataclass
class VllmConfig:
    kv_transfer_config: Optional[KVTransferConfig] = None
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    kv_events_config: Optional[KVEventsConfig] = None
    extra: Any = None
