"""Tensor descriptions, and the errors that say what is wrong with one.

A KV tensor is accepted either as a PyTorch tensor (duck-typed: anything with
``data_ptr()``, ``shape``, ``stride()``, ``dtype``, ``device`` and
``is_contiguous()``; torch itself is never imported here) or as a
:class:`RawTensor`, a plain description (address, shape, strides in elements,
dtype name, device) for memory that torch does not own: a ctypes buffer, an
``mmap``, or a device pointer from another framework.

A KV tensor tutti cannot serve raises :class:`LayoutError`; where one
property is wrong (its dtype, shape, strides, alignment, device, address or
type), the :class:`TensorMismatch` subclass for that property, whose message
names the tensor (its layer name), the property, what was found and what was
expected. :func:`tutti.worker_side.describe_kv_caches` and
:meth:`tutti.worker_side.WorkerSide.register` raise them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from . import _args, _lib

# Alignment of every registered region (REGION_ALIGN in the C library).
REGION_ALIGN = 16


class LayoutError(ValueError):
    """KV tensors whose layout tutti cannot serve (the message names the layer
    and why)."""


class TensorMismatch(LayoutError):
    """One property of a KV tensor is wrong. ``field`` is the property that is
    wrong: 'dtype', 'shape', 'stride', 'alignment', 'device', 'address' or
    'type'; ``name`` is the tensor's name (the layer name)."""

    field = "tensor"

    def __init__(self, name, message):
        super().__init__(f"KV tensor {name!r}: {self.field}: {message}")
        self.name = name


class DTypeMismatch(TensorMismatch):
    field = "dtype"


class ShapeMismatch(TensorMismatch):
    field = "shape"


class StrideMismatch(TensorMismatch):
    field = "stride"


class AlignmentError(TensorMismatch):
    field = "alignment"


class DeviceMismatch(TensorMismatch):
    field = "device"


class AddressError(TensorMismatch):
    field = "address"


class NotATensor(TensorMismatch, TypeError):
    field = "type"


# Names accepted for each dtype (torch's str(dtype) without the prefix, and
# the short names of the Go geometry).
_DTYPES = {
    "bfloat16": _lib.DTYPE_BF16, "bf16": _lib.DTYPE_BF16,
    "float16": _lib.DTYPE_FP16, "half": _lib.DTYPE_FP16, "fp16": _lib.DTYPE_FP16,
    "float8_e4m3fn": _lib.DTYPE_FP8, "float8_e5m2": _lib.DTYPE_FP8, "float8_e4m3fnuz": _lib.DTYPE_FP8,
    "float8_e5m2fnuz": _lib.DTYPE_FP8, "fp8": _lib.DTYPE_FP8, "uint8": _lib.DTYPE_FP8,
    "float32": _lib.DTYPE_FP32, "float": _lib.DTYPE_FP32, "fp32": _lib.DTYPE_FP32,
}
DTYPE_BYTES = {_lib.DTYPE_BF16: 2, _lib.DTYPE_FP16: 2, _lib.DTYPE_FP8: 1, _lib.DTYPE_FP32: 4}
DTYPE_NAMES = {_lib.DTYPE_BF16: "bf16", _lib.DTYPE_FP16: "fp16", _lib.DTYPE_FP8: "fp8", _lib.DTYPE_FP32: "fp32"}


def dtype_code(name) -> int:
    """The tutti_dtype of a dtype name ('bf16', 'torch.bfloat16', ...)."""
    s = str(name)
    if s.startswith("torch."):
        s = s[len("torch."):]
    code = _DTYPES.get(s)
    if code is None:
        raise ValueError(f"unknown dtype {name!r} (want one of {sorted(set(_DTYPES))})")
    return code


@dataclass(frozen=True)
class RawTensor:
    """A tensor given by address. ``strides`` are in elements (as torch's
    ``stride()``); ``device`` is 'cpu' for host memory or 'cuda'/'cuda:N'
    for a device pointer."""

    data_ptr: int
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    dtype: str
    device: str = "cpu"

    def __post_init__(self):
        # Types and widths only: what fits a store is describe_kv_caches's to
        # say, naming the tensor.
        object.__setattr__(self, "data_ptr", _args.uint64("RawTensor.data_ptr", self.data_ptr))
        object.__setattr__(self, "shape", _int_tuple("RawTensor.shape", self.shape, 0))
        object.__setattr__(self, "strides", _int_tuple("RawTensor.strides", self.strides, _args.INT64[0]))
        _args.string("RawTensor.dtype", self.dtype)
        _args.string("RawTensor.device", self.device)

    @staticmethod
    def contiguous(data_ptr, shape, dtype, device="cpu"):
        return RawTensor(data_ptr, tuple(shape), contiguous_strides(shape), dtype, device)


def _int_tuple(name, values, lo):
    """A tuple of int64 values >= lo (a shape, strides)."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} = {values!r}: want a sequence of ints, got {type(values).__name__}")
    try:
        items = tuple(values)
    except TypeError:
        raise TypeError(f"{name} = {values!r}: want a sequence of ints, got {type(values).__name__}") from None
    return tuple(_args.integer(f"{name}[{i}]", v, lo, _args.INT64[1]) for i, v in enumerate(items))


def contiguous_strides(shape):
    strides, acc = [], 1
    for d in reversed(_int_tuple("shape", shape, 0)):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def describe(t, name="tensor") -> RawTensor:
    """A RawTensor for ``t`` (a RawTensor, or a torch-like tensor)."""
    _args.string("name", name)
    if isinstance(t, RawTensor):
        return t
    needed = ("data_ptr", "shape", "stride", "dtype", "device")
    missing = [a for a in needed if not hasattr(t, a)]
    if missing:
        raise NotATensor(name, f"{type(t).__name__} is neither a RawTensor nor a torch tensor (lacks {', '.join(missing)})")
    return RawTensor(
        data_ptr=int(t.data_ptr()),
        shape=tuple(int(d) for d in t.shape),
        strides=tuple(int(s) for s in t.stride()),
        dtype=str(t.dtype),
        device=str(t.device),
    )


def shared_memory(regions):
    """The first two layers whose memory is the same or overlaps, as a message
    naming both, or None. ``regions``: (layer name, address, bytes) per layer.
    tutti writes each layer's KV into its own memory, so a tensor given for two
    layers (vLLM does so for layers that share another's KV cache) would mix
    them."""
    prev = None
    for name, addr, nbytes in sorted(regions, key=lambda r: (r[1], r[0])):
        if prev is not None and addr < prev[1] + prev[2]:
            how = "are the same tensor" if addr == prev[1] else f"overlap ({prev[1] + prev[2] - addr} bytes)"
            return (f"layers {prev[0]!r} and {name!r} {how} (data_ptr {prev[1]:#x} and {addr:#x}): one tensor "
                    f"registered for two layers; tutti needs each layer's KV in its own memory (models whose layers "
                    f"share a KV cache are not served)")
        prev = (name, addr, nbytes)
    return None
