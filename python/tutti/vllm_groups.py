"""vLLM's KV cache groups (its hybrid KV cache manager's ``KVCacheConfig``)
as :mod:`tutti.groups` rules. Specs are told apart by class name, so this
module imports nothing of vLLM (and serves its test double alike)."""

from __future__ import annotations

from typing import List, Optional, Sequence

from . import groups


def group_capacities(capacity_bytes: Optional[int], kv_cache_config) -> Optional[List[int]]:
    """A hybrid rank's ``capacity_bytes`` shared over its groups' stores by
    their bytes per block (tutti.groups.capacity_shares); None: the default."""
    if capacity_bytes is None:
        return None
    return groups.capacity_shares(capacity_bytes, [int(g.kv_cache_spec.page_size_bytes) * len(g.layer_names)
                                                   for g in kv_cache_config.kv_cache_groups])


def group_rules(kv_cache_config, block_size: int) -> Optional[List[groups.GroupRule]]:
    """The KV cache groups of a hybrid model (vLLM's hybrid manager on) as
    tutti's rules (tutti.groups), with each group's layer names; None for a
    model of one group (a plain store, as before). Raises ValueError for a
    group tutti cannot keep, naming it."""
    gs = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(gs) <= 1:
        return None
    rules = []
    for i, g in enumerate(gs):
        spec = g.kv_cache_spec
        kind = type(spec).__name__
        bs = int(getattr(spec, "block_size", block_size))
        mode = getattr(spec, "mamba_cache_mode", "none")
        if kind == "MambaSpec" and mode == "none":  # its block is then max_model_len tokens
            raise ValueError(f"KV cache group {i} (MambaSpec): vLLM keeps no prefix of the model's Mamba/linear-attention "
                             f"state (prefix caching off, mamba_cache_mode 'none'; vLLM turns prefix caching off for "
                             f"hybrid models unless asked): start it with --enable-prefix-caching (mamba_cache_mode "
                             f"'align', vLLM's default then)")
        if bs != block_size:
            raise ValueError(f"KV cache group {i} ({kind}) has {bs} tokens per block, the engine's block_size is "
                             f"{block_size}: tutti keys every group by one chain")
        if hasattr(spec, "sliding_window") and "SlidingWindow" in kind:
            rules.append(groups.GroupRule("sliding", bs, int(spec.sliding_window)))
        elif kind == "MambaSpec":
            if mode != "align":
                raise ValueError(f"KV cache group {i} (MambaSpec) has mamba_cache_mode {mode!r}: tutti keeps recurrent "
                                 f"state at block boundaries, as vLLM's 'align' mode holds it (enable prefix caching, "
                                 f"--mamba-cache-mode align)")
            if int(getattr(spec, "num_speculative_blocks", 0) or 0):
                raise ValueError(f"KV cache group {i} (MambaSpec) keeps {spec.num_speculative_blocks} speculative "
                                 f"state blocks: tutti does not serve speculative decoding's states")
            rules.append(groups.GroupRule("state", bs))
        elif "FullAttention" in kind or kind == "MLAAttentionSpec":
            rules.append(groups.GroupRule("full", bs))
        else:
            raise ValueError(f"KV cache group {i}: {kind} is not a kind tutti keeps (full attention, sliding window, "
                             f"Mamba/linear-attention state)")
    return rules


def engine_hit_incomplete(block_pool, request, num_computed_tokens: int, block_size: int,
                          kinds: Sequence[str]) -> bool:
    """Whether vLLM 0.26 resumes ``request`` from its own prefix hit of
    ``num_computed_tokens`` with a group's part of it missing: with a
    connector and Mamba layers it takes each group's hit on its own
    (``find_longest_cache_hit_per_group``) and the longest of them, so the
    recurrent state at its end, or full-attention blocks before it, may be
    gone (vLLM then reads its null block's bytes or unwritten pages;
    docs/vllm.md). ``kinds``: the groups' rule kinds. Read from vLLM's block
    pool; False where that cannot be told (no pool, hashes of another block
    size) and for a model without a state group (vLLM takes the common hit)."""
    if "state" not in kinds or block_pool is None or num_computed_tokens <= 0 or num_computed_tokens % block_size:
        return False
    if getattr(block_pool, "hash_block_size", None) != block_size:
        return False
    hashes = list(getattr(request, "block_hashes", None) or [])
    j = num_computed_tokens // block_size - 1
    if j >= len(hashes):
        return False
    state = [i for i, k in enumerate(kinds) if k == "state"]
    full = [i for i, k in enumerate(kinds) if k == "full"]
    return block_pool.get_cached_block(hashes[j], state) is None or (
        bool(full) and any(block_pool.get_cached_block(h, full) is None for h in hashes[:j + 1]))
