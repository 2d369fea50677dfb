"""The request fields a connector reads."""
from vllm.v1.core.kv_cache_utils import block_hashes


class Request:
    def __init__(self, request_id, prompt_token_ids, block_size):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.output_token_ids = []
        self.num_computed_tokens = 0
        self.block_hashes = block_hashes(self.prompt_token_ids, block_size)

    @property
    def num_tokens(self):
        return self.num_prompt_tokens + len(self.output_token_ids)
