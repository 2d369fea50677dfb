"""tutti: SSD-backed KV cache for LLM serving, Python binding (stdlib ctypes).

Low level: :mod:`tutti._lib` mirrors the C ABI (runtime/capi/tutti.h).
:class:`Store`/:class:`Load`/:class:`Save` wrap its handles (the Store's
tuning grouped in :class:`IOOptions`, :class:`SchedOptions`, :class:`GPUOptions`);
:mod:`tutti.worker_side` and :mod:`tutti.scheduler_side` are the
engine-neutral halves of a KV connector (:mod:`tutti.keys`: what a stored
block is keyed by); :mod:`tutti.vllm` (needs vLLM) is vLLM's connector,
``tutti.vllm.TuttiConnector``, over them.
"""

from ._lib import (  # noqa: F401
    ABI_MAJOR, ABI_MINOR_NEEDED, TuttiError, InvalidArgument, BadHandle, VersionMismatch,
    GeometryMismatch, OutOfRange, NotRegistered, BufferTooSmall, NoGPU, NotSupported, Locked,
    Closed, NoSpace, StoreIOError, Corrupt, Busy, Internal, SettingsMismatch, load_library, last_error,
)
from .tensor import (  # noqa: F401
    RawTensor, LayoutError, TensorMismatch, DTypeMismatch, ShapeMismatch, StrideMismatch, AlignmentError,
    DeviceMismatch, AddressError, NotATensor, describe, contiguous_strides,
)
from .options import IOOptions, SchedOptions, GPUOptions  # noqa: F401
from .store import Geometry, Store, Load, Save, Hold, chain_from_tokens  # noqa: F401


def abi_version():
    """(major, minor) of the loaded library."""
    v = load_library().tutti_abi_version()
    return v >> 16, v & 0xFFFF
