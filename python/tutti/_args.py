"""Argument checks of the public Python entry points.

The one home of what ctypes would otherwise get wrong in silence: it
truncates an int to its C field's width, cuts a path at a NUL byte, and
takes ``True`` as 1; a string given where a list of paths belongs iterates
as one-character paths. Each check raises TypeError (the wrong kind of
value) or ValueError (out of range) naming the argument. What a value means
(a geometry that is valid, a capacity that fits) is the library's to check:
it answers with the field's name too.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import List, Optional

INT32 = (-(1 << 31), (1 << 31) - 1)
UINT32 = (0, (1 << 32) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
UINT64 = (0, (1 << 64) - 1)


def integer(name: str, v, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """``v`` as an int: an integral number (not a bool) within [lo, hi]."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} = {v!r}: want an int, got {type(v).__name__}")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        want = f"{lo}..{hi}" if lo is not None and hi is not None else (f">= {lo}" if lo is not None else f"<= {hi}")
        raise ValueError(f"{name} = {v}: want {want}")
    return v


def int32(name: str, v, lo: int = INT32[0]) -> int:
    return integer(name, v, lo, INT32[1])


def uint32(name: str, v, lo: int = 0) -> int:
    return integer(name, v, lo, UINT32[1])


def int64(name: str, v, lo: int = INT64[0]) -> int:
    return integer(name, v, lo, INT64[1])


def uint64(name: str, v) -> int:
    return integer(name, v, *UINT64)


def real(name: str, v) -> float:
    """``v`` as a float: a finite real number (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} = {v!r}: want a number, got {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f):
        raise ValueError(f"{name} = {v!r}: want a finite number")
    return f


def boolean(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} = {v!r}: want True or False, got {type(v).__name__}")
    return v


def string(name: str, v) -> str:
    """A str without NUL bytes (C would end it at the first)."""
    if not isinstance(v, str):
        raise TypeError(f"{name} = {v!r}: want a str, got {type(v).__name__}")
    if "\0" in v:
        raise ValueError(f"{name} = {v!r}: contains a NUL byte")
    return v


def choice(name: str, v, choices) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{name} = {v!r}: want one of {sorted(choices)}, got {type(v).__name__}")
    if v not in choices:
        raise ValueError(f"{name} = {v!r}: want one of {sorted(choices)}")
    return v


def path(name: str, v) -> bytes:
    """A file system path (str, bytes or os.PathLike) as bytes, without NUL bytes."""
    if not isinstance(v, (str, bytes, os.PathLike)):
        raise TypeError(f"{name} = {v!r}: want a path (str, bytes or os.PathLike), got {type(v).__name__}")
    b = os.fsencode(v)
    if b"\0" in b:
        raise ValueError(f"{name} = {v!r}: contains a NUL byte")
    return b


def paths(name: str, v) -> List[bytes]:
    """A list (or other iterable) of paths; one path alone is refused, not
    taken as a sequence of characters."""
    if isinstance(v, (str, bytes, os.PathLike)):
        raise TypeError(f"{name} = {v!r}: want a list of paths, got one path (write [{v!r}])")
    try:
        items = list(v)
    except TypeError:
        raise TypeError(f"{name} = {v!r}: want a list of paths, got {type(v).__name__}") from None
    return [path(f"{name}[{i}]", p) for i, p in enumerate(items)]


def instance(name: str, v, cls, optional: bool = False):
    """``v`` is a ``cls`` (or None when optional)."""
    if (v is None and optional) or isinstance(v, cls):
        return v
    raise TypeError(f"{name} = {v!r}: want a {cls.__name__}{' or None' if optional else ''}, got {type(v).__name__}")


def function(name: str, v, optional: bool = False):
    """``v`` is callable (or None when optional)."""
    if (v is None and optional) or callable(v):
        return v
    raise TypeError(f"{name} = {v!r}: want a callable{' or None' if optional else ''}, got {type(v).__name__}")
