"""The keys (:mod:`tutti.keys`) of an engine request's prompt blocks.

Reads a vLLM-shaped request duck-typed (``request_id``, ``prompt_token_ids``
or ``all_token_ids``, ``num_prompt_tokens``, and the fields that make vLLM
add extra keys to a block's hash: ``lora_request``, ``cache_salt``,
``mm_features``, ``prompt_embeds``). A block's extras are exactly those vLLM
folds into its own hash of that block, taken from vLLM's
``generate_block_hash_extra_keys(request, start, end, mm_index)`` (passed in
as ``extra_keys_fn``), so a request is keyed by everything its KV depends on
in the engine's own view; a version of vLLM whose extras change changes the
keys (a miss, never a wrong hit). Only prompt blocks are keyed: decode tokens
are never saved.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, List, Optional

from .keys import Unkeyable, chain_keys, encode_extras

MAX_REQUESTS_CACHED = 65536  # requests whose keys are kept between calls (oldest dropped first)


def needs_extras(request) -> bool:
    """Whether vLLM adds extra keys to any block of ``request``'s hash."""
    return bool(getattr(request, "mm_features", None)) or getattr(request, "lora_request", None) is not None \
        or getattr(request, "cache_salt", None) is not None or getattr(request, "prompt_embeds", None) is not None


def prompt_tokens(request) -> List[int]:
    n = int(request.num_prompt_tokens)
    toks = getattr(request, "prompt_token_ids", None)
    if toks is None:  # prompt embeddings: vLLM hashes placeholder ids (and the embeddings, as extras)
        toks = getattr(request, "all_token_ids")
    return list(toks[:n])


class RequestKeys:
    """Keys of requests' prompt blocks, computed once per request (and again
    if its prompt grows, as a streaming session's does)."""

    def __init__(self, block_tokens: int, seed: int, extra_keys_fn: Optional[Callable] = None,
                 max_requests: int = MAX_REQUESTS_CACHED):
        if block_tokens <= 0 or max_requests <= 0:
            raise ValueError(f"block_tokens = {block_tokens}, max_requests = {max_requests}: want > 0")
        self.block_tokens, self.seed = block_tokens, seed
        self.extra_keys_fn = extra_keys_fn
        self.max_requests = max_requests
        self._cache: "OrderedDict[str, tuple]" = OrderedDict()
        self.dropped = 0  # cached keys dropped for the limit (recomputed if asked again)

    def chain(self, request) -> List[int]:
        """The keys of the request's full prompt blocks; raises
        :class:`tutti.keys.Unkeyable`."""
        rid = request.request_id
        n = int(request.num_prompt_tokens)
        hit = self._cache.get(rid)
        if hit is not None and hit[0] == n:
            self._cache.move_to_end(rid)
            return hit[1]
        chain = chain_keys(prompt_tokens(request), self.block_tokens, self.seed, self._extras(request, n))
        self._cache[rid] = (n, chain)
        while len(self._cache) > self.max_requests:
            self._cache.popitem(last=False)
            self.dropped += 1
        return chain

    def _extras(self, request, num_tokens: int):
        if not needs_extras(request):
            return None
        if self.extra_keys_fn is None:
            raise Unkeyable("the request has extra keys (LoRA, cache salt, multimodal inputs or prompt embeddings) "
                            "and this engine offers no generate_block_hash_extra_keys to read them")
        bt, out, mm = self.block_tokens, [], 0
        for i in range(num_tokens // bt):
            try:
                extra, mm = self.extra_keys_fn(request, i * bt, (i + 1) * bt, mm)
            except Exception as e:  # an engine whose extras we cannot read: no key, never a guess
                raise Unkeyable(f"block {i}: the engine's extra keys failed: {type(e).__name__}: {e}") from e
            out.append(encode_extras(extra) if extra else None)
        return out

    def forget(self, req_id: str):
        self._cache.pop(req_id, None)
