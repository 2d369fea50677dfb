"""What an engine's KV tensors are, read from their shapes and strides: the
layout the worker side (:mod:`tutti.worker_side`) opens a store for.

``describe_kv_caches(kv_caches, block_size) -> KVLayout``
    Reads what the engine's KV tensors are from their shapes AND strides
    (never from what an engine version promised): per layer, FlashAttention's
    ``(2, num_blocks, block_size, kv_heads, head_size)`` in NHD or HND stride
    order, FlashInfer's ``(num_blocks, 2, block_size, kv_heads, head_size)``,
    MLA's ``(num_blocks, block_size, head_size)``, 4-dim per-layer views
    ``(num_blocks, kv_heads, block_size, C)`` or ``(num_blocks, block_size,
    kv_heads, C)`` (K then V in C), each dense per layer or all cut from one
    buffer with the blocks outermost (then tutti's cross-layer layout). The
    result is the geometry, layout, regions and a ``tag`` naming the physical
    order; tensors tutti cannot serve raise :class:`LayoutError`, naming the
    layer and why (a :class:`tutti.TensorMismatch` subclass naming the
    property where one is wrong: dtype, shape, stride, alignment, device,
    address, type).

``check_fits(store, layout, first_tensor)``
    The store opened for a layout holds its shape, else the error naming
    what differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from . import _args
from .store import Geometry, Store
from .tensor import (DTYPE_BYTES, DTYPE_NAMES, REGION_ALIGN, AddressError, AlignmentError, DeviceMismatch, DTypeMismatch,
                     LayoutError, ShapeMismatch, StrideMismatch, describe, dtype_code, shared_memory)

__all__ = ["KVLayout", "LayoutError", "check_fits", "describe_kv_caches"]


@dataclass(frozen=True)
class KVLayout:
    """What a set of KV tensors is, as the store needs it."""

    geometry: Geometry
    layout: str  # "per_layer" or "cross_layer"
    num_pages: int
    regions: Tuple[Tuple[int, int], ...]  # (address, bytes) per layer, or one
    layer_names: Tuple[str, ...]  # index = layer number
    device: str  # "cpu" or "cuda:N"
    tag: str  # physical order, e.g. "kv.block.token.head.dim": stores of different tags never mix


_FA_NAMES = ("kv", "block", "token", "head", "dim")
_FI_NAMES = ("block", "kv", "token", "head", "dim")


def _dim_names(name, shape, block_size):
    """Names of the dimensions of one layer's tensor (block_size tells the
    token dimension from the heads in the 4-dim views)."""
    n = len(shape)
    if n == 5 and shape[0] == 2 and shape[2] == block_size:
        return _FA_NAMES
    if n == 5 and shape[1] == 2 and shape[2] == block_size:
        return _FI_NAMES
    if n == 3 and shape[1] == block_size:
        return ("block", "token", "dim")
    if n == 4 and shape[2] == block_size:
        return ("block", "head", "token", "dim")
    if n == 4 and shape[1] == block_size:
        return ("block", "token", "head", "dim")
    raise ShapeMismatch(name, f"{list(shape)} is none of (2, blocks, {block_size}, heads, head_size), "
                              f"(blocks, 2, {block_size}, heads, head_size), (blocks, {block_size}, head_size), "
                              f"(blocks, heads, {block_size}, C), (blocks, {block_size}, heads, C)")


def _dense_unit(name, dims):
    """dims: (size, stride) of the dimensions inside one page unit. Checks
    they tile a dense range (any order) and returns its length in elements."""
    acc = 1
    for size, stride in sorted((d for d in dims if d[0] != 1), key=lambda d: d[1]):
        if stride != acc:
            raise StrideMismatch(name, f"a page is not one dense range (a dimension of size {size} has "
                                       f"stride {stride}, a dense page needs {acc}); tutti moves whole pages")
        acc *= size
    return acc


@dataclass(frozen=True)
class _Layer:
    ptr: int
    planes: int
    unit: int  # elements of one page of one plane
    block_stride: int
    plane_stride: int
    num_blocks: int
    heads: int
    order: str


def _read_layer(name, t, block_size) -> _Layer:
    names = _dim_names(name, t.shape, block_size)
    dims = dict(zip(names, zip(t.shape, t.strides)))
    nb, sb = dims["block"]
    heads = dims["head"][0] if "head" in dims else 1
    # Physical order, outermost first (size-1 dimensions have no order).
    order = ".".join(n for n, (size, _) in sorted(dims.items(), key=lambda kv: -kv[1][1]) if size != 1 or n == "block")
    if "kv" in dims:
        _, sk = dims["kv"]
        inner = [d for n, d in dims.items() if n not in ("block", "kv")]
        unit = _dense_unit(name, inner)
        if sk == nb * sb and sb == unit:  # K planes, then V planes: tutti's two planes
            return _Layer(t.data_ptr, 2, unit, sb, sk, nb, heads, order)
        if sk == unit and sb >= 2 * unit:  # K and V of a block side by side: one opaque page
            return _Layer(t.data_ptr, 1, 2 * unit, sb, 0, nb, heads, order)
        raise StrideMismatch(name, f"{list(t.strides)} for shape {list(t.shape)}: K/V stride {sk} is "
                                   f"neither num_blocks * block stride ({nb * sb}) nor one page ({unit})")
    unit = _dense_unit(name, [d for n, d in dims.items() if n != "block"])
    if sb < unit:
        raise StrideMismatch(name, f"block stride {sb} is less than a page ({unit} elements)")
    return _Layer(t.data_ptr, 1, unit, sb, 0, nb, heads, order)


def describe_kv_caches(kv_caches: Dict[str, object], block_size: int, layer_names: Optional[Sequence[str]] = None,
                       chunk_pages: int = 1) -> KVLayout:
    """The KVLayout of ``kv_caches`` (layer name → torch tensor or
    :class:`tutti.RawTensor`; the order of ``layer_names``, default the dict's,
    is the layer order). Raises :class:`LayoutError`."""
    if block_size <= 0:
        raise LayoutError(f"block_size = {block_size}, want > 0")
    if layer_names is not None:
        if isinstance(layer_names, (str, bytes)) or not hasattr(layer_names, "__iter__"):
            raise TypeError(f"layer_names = {layer_names!r}: want a sequence of layer names, got {type(layer_names).__name__}")
        layer_names = [_args.string(f"layer_names[{i}]", n) for i, n in enumerate(layer_names)]
    names = list(layer_names) if layer_names is not None else list(kv_caches)
    if not names or set(names) != set(kv_caches) or len(set(names)) != len(names):
        raise LayoutError(f"layer names {names[:4]}... do not match the {len(kv_caches)} tensors")
    descs = [describe(kv_caches[n], n) for n in names]
    d0 = descs[0]
    codes = [_dtype_code(n, d) for n, d in zip(names, descs)]
    code = codes[0]
    esize = DTYPE_BYTES[code]
    layers = [_read_layer(n, d, block_size) for n, d in zip(names, descs)]
    same = shared_memory([(n, ly.ptr, 1) for n, ly in zip(names, layers)])
    if same:  # the same tensor twice: before any layout rule reads it as something else
        raise LayoutError(f"KV tensors: {same}")
    first = layers[0]
    for n, d, c, ly in zip(names, descs, codes, layers):
        _same_layout(n, d, c, ly, names[0], d0, first)
        if ly.ptr == 0:
            raise AddressError(n, "data pointer is NULL")
        if ly.ptr % REGION_ALIGN:
            raise AlignmentError(n, f"data pointer {ly.ptr:#x} is not {REGION_ALIGN}-byte aligned")
    L = len(layers)
    per_plane_tokens = block_size * first.heads
    if first.unit % per_plane_tokens:
        raise ShapeMismatch(names[0], f"a page of {first.unit} elements is not {block_size} tokens × {first.heads} heads")
    geo = Geometry(layers=L, kv_heads=first.heads, head_dim=first.unit // per_plane_tokens, dtype=DTYPE_NAMES[code],
                   planes=first.planes, page_tokens=block_size, chunk_pages=chunk_pages)
    plane_unit = first.planes * first.unit
    if first.block_stride == plane_unit or first.planes == 2:
        if first.planes == 2 and first.block_stride != first.unit:
            raise StrideMismatch(names[0], "separate K and V planes with gaps between blocks")
        nbytes = first.num_blocks * plane_unit * esize
        regions = tuple((ly.ptr, nbytes) for ly in layers)
        shared = shared_memory([(n, ly.ptr, nbytes) for n, ly in zip(names, layers)])
        if shared:
            raise LayoutError(f"KV tensors: {shared}")
        kind = "per_layer"
    else:
        # Blocks outermost over every layer: views cut from one buffer. Layer
        # i's pages must sit at i pages into each block, as tutti's
        # cross-layer layout places them.
        if first.block_stride != L * plane_unit:
            raise StrideMismatch(names[0], f"block stride {first.block_stride} elements, a page is {plane_unit}: "
                                           f"not {L} layers' pages side by side (views of one buffer)")
        base = first.ptr
        for i, (n, ly) in enumerate(zip(names, layers)):
            if ly.ptr != base + i * plane_unit * esize:
                raise AddressError(n, f"layer {i} starts {ly.ptr - base} bytes into the buffer, "
                                      f"want {i * plane_unit * esize} (layers in order within each block)")
        regions = ((base, first.num_blocks * first.block_stride * esize),)
        kind = "cross_layer"
    return KVLayout(geometry=geo, layout=kind, num_pages=first.num_blocks, regions=regions, layer_names=tuple(names),
                    device=str(d0.device), tag=f"{kind}.{first.order}.{DTYPE_NAMES[code]}")


def _dtype_code(name, t) -> int:
    try:
        return dtype_code(t.dtype)
    except ValueError as e:
        raise DTypeMismatch(name, str(e)) from None


def _same_layout(name, t, code, ly: _Layer, name0, t0, ly0: _Layer):
    """Layer ``name`` has layer ``name0``'s dtype, device, shape and strides,
    else the mismatch naming the first property that differs."""
    why = "every layer must have one layout (hybrid models: one KV cache group)"
    if code != dtype_code(t0.dtype):
        raise DTypeMismatch(name, f"{t.dtype}, layer {name0!r} is {t0.dtype}: {why}")
    if str(t.device) != str(t0.device):
        raise DeviceMismatch(name, f"on {t.device}, layer {name0!r} on {t0.device}: {why}")
    if tuple(t.shape) != tuple(t0.shape):
        raise ShapeMismatch(name, f"{list(t.shape)}, layer {name0!r} is {list(t0.shape)}: {why}")
    if (ly.planes, ly.unit, ly.block_stride, ly.order) != (ly0.planes, ly0.unit, ly0.block_stride, ly0.order):
        raise StrideMismatch(name, f"{list(t.strides)} ({ly.order}), layer {name0!r} has {list(t0.strides)} ({ly0.order}): {why}")


def check_fits(st: Store, mem: KVLayout, t0):
    """The store opened for ``mem`` holds its shape, else the error naming
    what differs: the dtype (of ``t0``, the first layer's tensor), the layer
    count or layout, or the page shape and count."""
    g, held = mem.geometry, st.shard_geometry
    if (held, st.num_pages, st.layout) == (g, mem.num_pages, mem.layout):
        return
    name, store = mem.layer_names[0], f"the store opened for {mem.tag} holds {held}, {st.num_pages} pages, {st.layout}"
    if dtype_code(held.dtype) != dtype_code(g.dtype):
        raise DTypeMismatch(name, f"{t0.dtype}; {store}")
    if (held.layers, st.layout) != (g.layers, mem.layout):
        raise LayoutError(f"the KV memory is {g.layers} layers, {mem.layout}; {store}")
    raise ShapeMismatch(name, f"the KV memory is {g}, {mem.num_pages} pages; {store}")
