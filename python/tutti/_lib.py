"""Low-level ctypes mirror of the C ABI in runtime/capi/tutti.h.

Everything here maps one-to-one onto the header: the structs, the enums, the
function prototypes, and the status codes (as exception classes). The
friendlier layers (:mod:`tutti.store`, :mod:`tutti.worker_side`) are built on it.

The library is found, in order, at ``$TUTTI_LIB``, inside this package (where
``pip install ./python`` puts it), at ``bin/libtutti.so`` of the repository
that holds this package, or by ``ctypes.util.find_library``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

from . import _args

# The ABI this binding was written for. A library of another major is refused
# at load; a lower minor than ABI_MINOR_NEEDED too.
ABI_MAJOR = 1
# 1.2: tp_rank/tp_size, tutti_load_with (skip, TUTTI_LOAD_PROMISED), tutti_match/tutti_hold_release;
# 1.3: save_writes_per_device (a 1.2 library would not see it: refused, not ignored);
# 1.4: TUTTI_ERR_SETTINGS_MISMATCH (a 1.3 library reports a reopen with other settings as Internal);
# 1.5: tutti_take_kv_events (kv_events="engine");
# 1.6: tutti_get_stats_json (Store.stats);
# 1.7: tutti_connect (Store(connect=...): a node's shared store, tutti serve);
# 1.8: tutti_load_done (Load.done: vLLM's asynchronous loads);
# 1.9: tutti_save_gathered (Save.gathered: a finished request's pages wait until reused).
# 1.10: tutti_save_after (Store.save(after_event=): the gathers wait for the engine's CUDA event).
ABI_MINOR_NEEDED = 10

# enum tutti_path / tutti_dtype / tutti_layout / tutti_memory
PATH_CPU, PATH_GPU = 1, 2
DTYPE_BF16, DTYPE_FP16, DTYPE_FP8, DTYPE_FP32 = 1, 2, 3, 4
LAYOUT_PER_LAYER, LAYOUT_CROSS_LAYER = 1, 2
MEMORY_HOST, MEMORY_CUDA = 1, 2
# enum tutti_gpu_flags (bits of tutti_config.gpu_flags)
GPU_READS_FROM_DEVICES = 1
# enum tutti_load_flags
LOAD_PROMISED = 1


class tutti_config(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("abi_major", ctypes.c_uint32),
        ("dirs", ctypes.POINTER(ctypes.c_char_p)),
        ("num_dirs", ctypes.c_uint32),
        ("path", ctypes.c_uint32),
        ("capacity_bytes", ctypes.c_int64),
        ("layers", ctypes.c_int32),
        ("kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("dtype", ctypes.c_uint32),
        ("planes", ctypes.c_int32),
        ("page_tokens", ctypes.c_int32),
        ("chunk_pages", ctypes.c_int32),
        ("layout", ctypes.c_uint32),
        ("num_pages", ctypes.c_int64),
        ("queue_depth", ctypes.c_int32),
        ("save_bound_ms", ctypes.c_int32),
        ("staging_bytes", ctypes.c_int64),
        ("staging_slot_bytes", ctypes.c_int64),
        ("max_loads", ctypes.c_int32),
        ("tp_rank", ctypes.c_uint32),
    ] + [(f, ctypes.c_double) for f in (
        "compute_fixed_ns", "compute_per_token_ns", "compute_per_pair_ns",
        "device_read_bytes_per_sec", "device_write_bytes_per_sec", "device_read_iops", "device_write_iops",
        "device_read_latency_ns", "device_read_share_under_writes", "device_write_share_under_reads",
    )] + [
        ("save_budget_bytes", ctypes.c_int64),
        ("gpu_device", ctypes.c_int32),
        ("gpu_max_pages", ctypes.c_int32),
        ("gpu_max_runs", ctypes.c_int32),
        ("tp_size", ctypes.c_uint32),
        ("gpu_io_window", ctypes.c_int32),
        ("gpu_max_io_bytes", ctypes.c_int32),
        ("gpu_lookahead", ctypes.c_int32),
        ("gpu_flags", ctypes.c_uint32),
        ("save_writes_per_device", ctypes.c_int32),  # ABI 1.3
        ("reserved3", ctypes.c_uint32),
    ]


class tutti_kv_region(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint64), ("len_bytes", ctypes.c_uint64)]


STATS_FIELDS = (
    "lookups", "lookup_blocks", "hit_blocks", "loads", "cached_blocks", "planned_blocks",
    "restored_blocks", "restored_bytes", "read_ios", "split_ios", "overread_bytes", "miss_blocks",
    "saves", "save_blocks", "saved_blocks", "saved_bytes", "write_ios", "committed_runs",
    "corrupt_dropped", "skipped_blocks", "fallbacks",
)


class tutti_stats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_uint32)] + [
        (name, ctypes.c_uint64) for name in STATS_FIELDS
    ]


class tutti_recovery(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("indexed_runs", ctypes.c_uint64),
                ("indexed_blocks", ctypes.c_uint64), ("dropped_runs", ctypes.c_uint64)]


# --- errors -----------------------------------------------------------------


class TuttiError(Exception):
    """A call into libtutti failed. ``code`` is the tutti_status value,
    ``status`` its name, ``op`` the C function, and the message is the
    library's last-error text for the calling thread."""

    code = -1
    status = "TUTTI_ERR_UNKNOWN"

    def __init__(self, message, op=None):
        super().__init__(message)
        self.op = op


def _err(name, code, *bases, doc=""):
    cls = type(name, (TuttiError,) + bases, {"code": code, "status": _STATUS_NAMES[code], "__doc__": doc})
    return cls


_STATUS_NAMES = {
    0: "TUTTI_OK",
    1: "TUTTI_ERR_INVALID_ARGUMENT",
    2: "TUTTI_ERR_BAD_HANDLE",
    3: "TUTTI_ERR_VERSION",
    4: "TUTTI_ERR_GEOMETRY",
    5: "TUTTI_ERR_OUT_OF_RANGE",
    6: "TUTTI_ERR_NOT_REGISTERED",
    7: "TUTTI_ERR_BUFFER_TOO_SMALL",
    8: "TUTTI_ERR_NO_GPU",
    9: "TUTTI_ERR_NOT_SUPPORTED",
    10: "TUTTI_ERR_LOCKED",
    11: "TUTTI_ERR_CLOSED",
    12: "TUTTI_ERR_NO_SPACE",
    13: "TUTTI_ERR_IO",
    14: "TUTTI_ERR_CORRUPT",
    15: "TUTTI_ERR_BUSY",
    16: "TUTTI_ERR_INTERNAL",
    17: "TUTTI_ERR_SETTINGS_MISMATCH",
}

InvalidArgument = _err("InvalidArgument", 1, ValueError, doc="NULL, zero or oversize argument, bad enum.")
BadHandle = _err("BadHandle", 2, doc="Unknown, released, closed, or wrong kind of handle.")
VersionMismatch = _err("VersionMismatch", 3, doc="ABI major or struct size not supported.")
GeometryMismatch = _err("GeometryMismatch", 4, ValueError, doc="Shapes or lengths do not match the geometry.")
OutOfRange = _err("OutOfRange", 5, IndexError, doc="Page id, layer or block outside its range.")
NotRegistered = _err("NotRegistered", 6, doc="Load or save before register_kv.")
BufferTooSmall = _err("BufferTooSmall", 7, doc="An output array is too short.")
NoGPU = _err("NoGPU", 8, doc="GPU path asked for where there is no GPU or no kernels library.")
NotSupported = _err("NotSupported", 9, doc="The kernel or device lacks a needed feature.")
Locked = _err("Locked", 10, doc="A store directory is held by another open store.")
Closed = _err("Closed", 11, doc="The store was closed.")
NoSpace = _err("NoSpace", 12, doc="The store cannot hold what was asked.")
StoreIOError = _err("StoreIOError", 13, OSError, doc="A read, write or sync failed.")
Corrupt = _err("Corrupt", 14, doc="Stored data failed a checksum or header check.")
Busy = _err("Busy", 15, doc="Too many loads in flight.")
Internal = _err("Internal", 16, doc="A bug in the library.")
SettingsMismatch = _err("SettingsMismatch", 17, ValueError,
                        doc="The directories hold a store created with other settings (its capacity), or not all of "
                            "its directories were given; the message names what differs.")

ERRORS = {c.code: c for c in (
    InvalidArgument, BadHandle, VersionMismatch, GeometryMismatch, OutOfRange, NotRegistered,
    BufferTooSmall, NoGPU, NotSupported, Locked, Closed, NoSpace, StoreIOError, Corrupt, Busy, Internal,
    SettingsMismatch,
)}


# --- loading ------------------------------------------------------------------

_lock = threading.Lock()
_lib = None


def _candidates():
    env = os.environ.get("TUTTI_LIB")
    if env:
        return [env]  # an explicit choice is never second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    packaged = os.path.join(here, "libtutti.so")  # `pip install ./python` puts it here
    repo_lib = os.path.normpath(os.path.join(here, "..", "..", "bin", "libtutti.so"))
    out = [packaged, repo_lib] if os.path.exists(packaged) else [repo_lib]
    found = ctypes.util.find_library("tutti")
    if found:
        out.append(found)
    return out


def _prototype(lib):
    u32, u64, i32, i64 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64
    p = ctypes.POINTER
    protos = {
        "tutti_abi_version": (u32, []),
        "tutti_last_error": (i64, [ctypes.c_char_p, u64]),
        "tutti_open": (i32, [p(tutti_config), p(u64)]),
        "tutti_connect": (i32, [ctypes.c_char_p, p(tutti_config), p(u64)]),
        "tutti_close": (i32, [u64]),
        "tutti_register_kv": (i32, [u64, u32, p(tutti_kv_region), u32]),
        "tutti_lookup": (i32, [u64, p(u64), u32, p(u32)]),
        "tutti_load": (i32, [u64, p(u64), u32, p(i32), u32, p(u64)]),
        "tutti_load_wait_layer": (i32, [u64, i32]),
        "tutti_load_stream_wait_layer": (i32, [u64, i32, u64]),
        "tutti_load_wait": (i32, [u64, p(u32)]),
        "tutti_load_done": (i32, [u64, p(i32)]),
        "tutti_load_plan": (i32, [u64, p(u32), p(u32)]),
        "tutti_load_failure": (i32, [u64, p(i32)]),
        "tutti_load_release": (i32, [u64]),
        "tutti_load_with": (i32, [u64, p(u64), u32, u32, u32, p(i32), u32, p(u64)]),
        "tutti_match": (i32, [u64, p(u64), u32, u32, u32, p(u64), p(u32)]),
        "tutti_hold_release": (i32, [u64]),
        "tutti_save": (i32, [u64, p(u64), u32, p(i32), u32, p(u64)]),
        "tutti_save_wait_gathered": (i32, [u64]),
        "tutti_save_gathered": (i32, [u64, p(i32)]),
        "tutti_save_release": (i32, [u64]),
        "tutti_wait_saves": (i32, [u64]),
        "tutti_get_stats": (i32, [u64, p(tutti_stats)]),
        "tutti_get_recovery": (i32, [u64, p(tutti_recovery)]),
        "tutti_get_gpu_reads": (i32, [u64, ctypes.c_char_p, u64, p(u64)]),
        "tutti_get_stats_json": (i32, [u64, ctypes.c_char_p, u64, p(u64)]),
        "tutti_chain_from_tokens": (i32, [p(u32), u64, u32, u64, p(u64), u32, p(u32)]),
        "tutti_open_kv_events": (i32, [p(tutti_config), ctypes.c_char_p, p(u64)]),
        "tutti_save_tokens": (i32, [u64, p(u64), u32, p(i32), u32, p(u32), u64, p(u64)]),
        "tutti_save_meta": (i32, [u64, p(u64), u32, p(i32), u32, p(u32), u64, p(ctypes.c_uint8), u32, p(u64)]),
        "tutti_save_after": (i32, [u64, p(u64), u32, p(i32), u32, p(u32), u64, p(ctypes.c_uint8), u32, u64, p(u64)]),
        "tutti_take_kv_events": (i32, [u64, p(ctypes.c_uint8), u64, p(u64), p(u32), p(u32)]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def load_library(path=None):
    """Loads libtutti once (or from ``path``), checks its ABI version and
    returns the ctypes handle. Raises :class:`VersionMismatch` if the
    library's major differs from :data:`ABI_MAJOR` or its minor is too old."""
    global _lib
    with _lock:
        if _lib is not None and path is None:
            return _lib
        if path is not None:
            path = os.fsdecode(_args.path("path", path))
        errors = []
        for cand in ([path] if path else _candidates()):
            try:
                lib = ctypes.CDLL(cand)
            except OSError as e:
                errors.append(f"{cand}: {e}")
                continue
            _prototype(lib)
            check_version(lib.tutti_abi_version(), cand)
            if path is None:
                _lib = lib
            return lib
        raise OSError("libtutti not found (build it with `make python-test` or set TUTTI_LIB): " + "; ".join(errors))


def check_version(packed, where="libtutti"):
    packed = _args.uint32("packed", packed)
    major, minor = packed >> 16, packed & 0xFFFF
    if major != ABI_MAJOR or minor < ABI_MINOR_NEEDED:
        raise VersionMismatch(
            f"{where} has ABI {major}.{minor}, this binding needs {ABI_MAJOR}.{ABI_MINOR_NEEDED} or a later {ABI_MAJOR}.x",
            op="tutti_abi_version",
        )
    return major, minor


def lib():
    return load_library()


def last_error(l=None):
    l = l or lib()
    n = l.tutti_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    l.tutti_last_error(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def check(rc, op):
    """Raises the exception class of status ``rc`` with the thread's message."""
    if rc == 0:
        return
    cls = ERRORS.get(rc)
    msg = last_error()
    if cls is None:
        raise TuttiError(f"{op}: unknown status {rc}: {msg}", op=op)
    raise cls(msg or f"{op}: {cls.status}", op=op)


def call(name, *args):
    """Calls C function ``name`` and raises on a non-zero status."""
    check(getattr(lib(), name)(*args), name)
