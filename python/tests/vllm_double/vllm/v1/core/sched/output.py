"""The scheduler output a connector's build_connector_meta reads."""
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    block_ids: tuple  # one list per KV cache group
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: list = field(default_factory=list)
    resumed_req_ids: set = field(default_factory=set)  # newest tree (older: resumed_from_preemption list)
    new_token_ids: list = field(default_factory=list)
    new_block_ids: list = field(default_factory=list)  # per request: tuple of lists per group, or None
    num_computed_tokens: list = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    finished_req_ids: set
    kv_connector_metadata: Optional[object] = None
    has_sync_kv_loads: bool = False  # newest tree: start_load_kv before the forward only then
