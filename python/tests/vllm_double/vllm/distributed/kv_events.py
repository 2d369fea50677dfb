"""vLLM 0.26's KV event structs and the connector's event container
(vllm/distributed/kv_events.py): same classes, fields, order and defaults,
as plain dataclasses instead of msgspec structs (msgspec is not installed
here); ``__struct_fields__`` names the fields as msgspec does."""
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any, Optional

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_FS = "FS"
MEDIUM_OBJ = "OBJ"


class KVCacheEvent:
    """Base class for all KV cache-related events"""


def _struct(cls):
    cls = dataclass(kw_only=True)(cls)
    cls.__struct_fields__ = tuple(f.name for f in fields(cls))
    return cls


@_struct
class BlockStored(KVCacheEvent):
    block_hashes: list
    parent_block_hash: Any
    token_ids: list
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None


@_struct
class BlockRemoved(KVCacheEvent):
    block_hashes: list
    medium: Optional[str]
    group_idx: Optional[int] = None
    locality: Optional[str] = None


@_struct
class AllBlocksCleared(KVCacheEvent):
    pass


class KVConnectorKVEvents(ABC):
    @abstractmethod
    def add_events(self, events): raise NotImplementedError

    @abstractmethod
    def aggregate(self): raise NotImplementedError

    @abstractmethod
    def increment_workers(self, count: int = 1): raise NotImplementedError

    @abstractmethod
    def get_all_events(self): raise NotImplementedError

    @abstractmethod
    def get_number_of_workers(self): raise NotImplementedError

    @abstractmethod
    def clear_events(self): raise NotImplementedError

    def merge(self, other):
        self.add_events(other.get_all_events())
        return self
