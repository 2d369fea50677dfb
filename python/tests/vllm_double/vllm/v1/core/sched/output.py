"""The scheduler output a connector's build_connector_meta reads, as vLLM
0.26 shapes it: new requests carry all their blocks so far; running requests
the blocks allocated in this step (None when none), resumed ones (preempted
before) all their new blocks, in resumed_req_ids."""
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: Optional[list]
    mm_features: list
    sampling_params: object
    pooling_params: object
    block_ids: tuple  # one list per KV cache group
    num_computed_tokens: int
    lora_request: object
    prompt_embeds: object = None

    @classmethod
    def from_request(cls, request, block_ids):
        return cls(request.request_id, request.prompt_token_ids, request.mm_features, None, None, block_ids,
                   request.num_computed_tokens, request.lora_request, request.prompt_embeds)


@dataclass
class CachedRequestData:
    req_ids: list = field(default_factory=list)
    resumed_req_ids: set = field(default_factory=set)
    new_token_ids: list = field(default_factory=list)
    all_token_ids: dict = field(default_factory=dict)
    new_block_ids: list = field(default_factory=list)  # per request: tuple of lists per group, or None
    num_computed_tokens: list = field(default_factory=list)
    num_output_tokens: list = field(default_factory=list)

    @classmethod
    def make_empty(cls):
        return cls()


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    finished_req_ids: set
    scheduled_spec_decode_tokens: dict = field(default_factory=dict)
    scheduled_encoder_inputs: dict = field(default_factory=dict)
    num_common_prefix_blocks: list = field(default_factory=list)
    free_encoder_mm_hashes: list = field(default_factory=list)
    preempted_req_ids: Optional[set] = None
    kv_connector_metadata: Optional[object] = None
    has_sync_kv_loads: bool = False  # newer trees only: start_load_kv before the forward only then
