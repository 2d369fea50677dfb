"""vLLM's KV cache groups (its hybrid KV cache manager's ``KVCacheConfig``)
as :mod:`tutti.groups` rules. Specs are told apart by class name, so this
module imports nothing of vLLM (and serves its test double alike)."""

from __future__ import annotations

from typing import List, Optional

from . import groups


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
        if bs != block_size:
            raise ValueError(f"KV cache group {i} ({kind}) has {bs} tokens per block, the engine's block_size is "
                             f"{block_size}: tutti keys every group by one chain")
        if hasattr(spec, "sliding_window") and "SlidingWindow" in kind:
            rules.append(groups.GroupRule("sliding", bs, int(spec.sliding_window)))
        elif kind == "MambaSpec":
            mode = getattr(spec, "mamba_cache_mode", "none")
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
