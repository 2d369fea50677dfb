"""Hugging Face transformers' KV caches as tutti pages.

transformers keeps a request's KV per layer as two tensors shaped
``(batch, kv_heads, tokens, head_dim)`` (``StaticCache.layers[i].keys`` and
``.values``; ``DynamicCache`` the same). tutti stores pages of
``page_tokens`` tokens in the engine layout ``(2, num_pages, page_tokens,
kv_heads, head_dim)`` per layer (vLLM's FlashAttention layout, the store's
``per_layer`` layout). This module is the mapping between the two and the
block table that places a request's tokens on pages; it needs torch, not
transformers, so CI tests it on the CPU.

Ownership: the functions copy; they keep no reference to the tensors. A
copy into pages is complete when the stream that ran it reaches that point
(the caller synchronizes before handing the pages to a save).
"""

from __future__ import annotations

from typing import List, Sequence

from . import _args


class LayoutError(ValueError):
    """A cache tensor or page pool does not have the shape this mapping needs;
    the message names the tensor and what was found."""


class BlockTable:
    """Page ids of a pool of ``num_pages`` pages, handed out to requests.

    ``allocate(n_tokens)`` returns the pages for that many tokens (whole
    pages, the last one possibly partly used) or raises ``MemoryError``
    naming what was asked and what is free; ``free(pages)`` returns them.
    A page is in at most one allocation at a time."""

    def __init__(self, num_pages: int, page_tokens: int):
        self.num_pages = _args.integer("BlockTable num_pages", num_pages, 1, _args.INT32[1])
        self.page_tokens = _args.integer("BlockTable page_tokens", page_tokens, 1, _args.INT32[1])
        self._free = list(range(num_pages - 1, -1, -1))
        self._used = set()

    def pages_for(self, n_tokens: int) -> int:
        return -(-_args.int64("n_tokens", n_tokens, 0) // self.page_tokens)

    def allocate(self, n_tokens: int) -> List[int]:
        n = self.pages_for(_args.int64("BlockTable.allocate n_tokens", n_tokens, 0))
        if n > len(self._free):
            raise MemoryError(f"BlockTable: {n_tokens} tokens need {n} pages, {len(self._free)} of {self.num_pages} are free")
        pages = [self._free.pop() for _ in range(n)]
        self._used.update(pages)
        return pages

    def free(self, pages: Sequence[int]):
        pages = _pages("BlockTable.free pages", pages)
        for p in pages:
            if p not in self._used:
                raise ValueError(f"BlockTable.free: page {p} is not allocated")
            self._used.remove(p)
            self._free.append(p)

    @property
    def free_pages(self) -> int:
        return len(self._free)


def _pages(name, pages) -> List[int]:
    """Page ids: a sequence of ints (not bools)."""
    if isinstance(pages, (str, bytes)) or not isinstance(pages, Sequence):
        raise TypeError(f"{name}: want a sequence of page ids, got {type(pages).__name__}")
    return [_args.int64(f"{name}[{i}]", p) for i, p in enumerate(pages)]


def _check(keys, values, pool_layer, pages, n_tokens, name):
    _args.string("name", name)
    n_tokens = _args.int64("n_tokens", n_tokens, 0)
    pages = _pages("pages", pages)
    if keys.dim() != 4 or values.dim() != 4:
        raise LayoutError(f"{name}: cache tensors must be (batch, kv_heads, tokens, head_dim), got keys {tuple(keys.shape)}, values {tuple(values.shape)}")
    if keys.shape != values.shape:
        raise LayoutError(f"{name}: keys {tuple(keys.shape)} and values {tuple(values.shape)} differ (an MLA cache with "
                          "separate latent and rope parts is not a K/V pair: register it as one plane)")
    if keys.shape[0] != 1:
        raise LayoutError(f"{name}: batch {keys.shape[0]}: one request per cache (batch 1)")
    if pool_layer.dim() != 5 or pool_layer.shape[0] != 2:
        raise LayoutError(f"{name}: page pool must be (2, num_pages, page_tokens, kv_heads, head_dim), got {tuple(pool_layer.shape)}")
    _, num_pages, page_tokens, heads, dim = pool_layer.shape
    if (keys.shape[1], keys.shape[3]) != (heads, dim):
        raise LayoutError(f"{name}: cache has {keys.shape[1]} heads of {keys.shape[3]}, the pool {heads} of {dim}")
    if keys.dtype != pool_layer.dtype:
        raise LayoutError(f"{name}: cache dtype {keys.dtype}, pool dtype {pool_layer.dtype}")
    if n_tokens > keys.shape[2]:
        raise LayoutError(f"{name}: {n_tokens} tokens, the cache holds {keys.shape[2]}")
    need = -(-n_tokens // page_tokens)
    if len(pages) < need:
        raise LayoutError(f"{name}: {n_tokens} tokens need {need} pages of {page_tokens}, got {len(pages)}")
    bad = [p for p in pages[:need] if not 0 <= p < num_pages]
    if bad:
        raise LayoutError(f"{name}: page ids {bad[:4]} outside the pool's {num_pages} pages")
    return need, page_tokens, pages, n_tokens


def cache_to_pages(keys, values, pool_layer, pages: Sequence[int], n_tokens: int, name="layer"):
    """Copies tokens [0, n_tokens) of one layer's cache into ``pages`` of the
    pool (page i holds tokens [i*page_tokens, (i+1)*page_tokens)). A last
    partial page is zero-filled past n_tokens, so that saved bytes do not
    depend on what the pool held before."""
    import torch

    need, pt, pages, n_tokens = _check(keys, values, pool_layer, pages, n_tokens, name)
    idx = torch.as_tensor(list(pages[:need]), device=pool_layer.device, dtype=torch.long)
    full = need * pt
    for plane, src in ((0, keys), (1, values)):
        # (1, H, T, D) -> (T, H, D) -> (pages, page_tokens, H, D), on the pool's device
        tok = src[0, :, :n_tokens, :].transpose(0, 1).to(pool_layer.device)
        if full != n_tokens:
            pad = torch.zeros((full - n_tokens,) + tuple(tok.shape[1:]), dtype=tok.dtype, device=tok.device)
            tok = torch.cat([tok, pad], 0)
        pool_layer[plane].index_copy_(0, idx, tok.reshape(need, pt, tok.shape[1], tok.shape[2]))


def pages_to_cache(pool_layer, pages: Sequence[int], keys, values, n_tokens: int, name="layer"):
    """Copies tokens [0, n_tokens) from ``pages`` of the pool into one layer's
    cache tensors (the inverse of :func:`cache_to_pages`)."""
    import torch

    need, pt, pages, n_tokens = _check(keys, values, pool_layer, pages, n_tokens, name)
    sel = list(pages[:need])
    run = sel == list(range(sel[0], sel[0] + need)) if need else True
    idx = None if run else torch.as_tensor(sel, device=pool_layer.device, dtype=torch.long)
    for plane, dst in ((0, keys), (1, values)):
        src = pool_layer[plane][sel[0]:sel[0] + need] if run else pool_layer[plane].index_select(0, idx)
        # Pages of a pool in (pinned) host memory move to the cache's device in one copy.
        src = src.to(dst.device, non_blocking=True)
        tok = src.reshape(need * pt, pool_layer.shape[3], pool_layer.shape[4])
        dst[0, :, :n_tokens, :].copy_(tok[:n_tokens].transpose(0, 1))


def set_filled_tokens(layer, n_tokens: int):
    """Tells one transformers cache layer that tokens [0, n_tokens) hold KV
    (after :func:`pages_to_cache` filled them), so that the model's next
    update appends at n_tokens.

    transformers 5's ``StaticLayer`` writes each update at its own counter,
    ``cumulative_length`` (a tensor changed in place: the cache keeps static
    addresses for CUDA graphs), not at the ``cache_position`` the model is
    called with; a cache filled from outside without the counter set has the
    next tokens written over its first ones. The sliding-window layer keeps
    ``cumulative_length_int`` beside it. Earlier versions have neither and
    write at ``cache_position``: nothing to set there."""
    n_tokens = _args.int64("set_filled_tokens n_tokens", n_tokens, 0)
    import torch

    cl = getattr(layer, "cumulative_length", None)
    if isinstance(cl, torch.Tensor):
        cl.fill_(n_tokens)
    elif cl is not None:
        layer.cumulative_length = n_tokens
    if hasattr(layer, "cumulative_length_int"):
        layer.cumulative_length_int = n_tokens
