"""The request fields a connector reads (vLLM 0.26's Request): the prompt,
all tokens (outputs appended), the extras vLLM folds into block hashes, and
block_hashes, which grow as output tokens fill blocks."""
from vllm.v1.core.kv_cache_utils import get_request_block_hasher


class Request:
    def __init__(self, request_id, prompt_token_ids, block_size, *, lora_request=None, cache_salt=None,
                 mm_features=None, prompt_embeds=None, max_tokens=16, skip_reading_prefix_cache=False):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids) if prompt_token_ids is not None else None
        self.prompt_embeds = prompt_embeds
        self._prompt_embeds_per_block_hashes = {}
        self.num_prompt_tokens = len(self.prompt_token_ids) if self.prompt_token_ids is not None else int(prompt_embeds.shape[0])
        self._all_token_ids = list(self.prompt_token_ids) if self.prompt_token_ids is not None else [0] * self.num_prompt_tokens
        self._output_token_ids = []
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.mm_features = list(mm_features or [])
        self.max_tokens = max_tokens
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.kv_transfer_params = None
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.status = "WAITING"
        self.block_hashes = []
        self._block_hasher = get_request_block_hasher(block_size)
        self.update_block_hashes()

    @property
    def all_token_ids(self):
        return self._all_token_ids

    @property
    def output_token_ids(self):
        return self._output_token_ids

    def append_output_token_ids(self, token_ids):
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        self._output_token_ids.extend(ids)
        self._all_token_ids.extend(ids)
        self.update_block_hashes()

    def update_block_hashes(self):
        self.block_hashes.extend(self._block_hasher(self))

    @property
    def num_tokens(self):
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self):
        return len(self._output_token_ids)

    def is_finished(self):
        return self.status.startswith("FINISHED")
