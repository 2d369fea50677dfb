"""Store's tuning, grouped as runtime.Config groups it (runtime/config.go).

Every field's zero is the library's default. :class:`GPUOptions` is
runtime.GPUConfig (the GPU path's part); :class:`IOOptions` and
:class:`SchedOptions` are the I/O engine's and the scheduler's fields of
runtime.Config. :data:`FLAT` maps the flat ``Store`` keywords of earlier
releases (and the keys of vLLM's ``store_options``) onto them; it is the one
place that knows both spellings.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Dict, Mapping, Optional, Tuple

from . import _args, _lib

# The keys of SchedOptions.compute and .device: tutti_config's compute_* and
# device_* fields without the prefix.
COMPUTE_KEYS = tuple(f[len("compute_"):] for f, _ in _lib.tutti_config._fields_ if f.startswith("compute_"))
DEVICE_KEYS = tuple(f[len("device_"):] for f, _ in _lib.tutti_config._fields_ if f.startswith("device_"))


def _check_ints(obj, widths):
    """Checks each int field of a frozen options dataclass against its C
    field's width (``widths``: field → _args check) and keeps it as an int."""
    for f in fields(obj):
        check = widths.get(f.name)
        if check is not None:
            object.__setattr__(obj, f.name, check(f"{type(obj).__name__}.{f.name}", getattr(obj, f.name)))


def _check_profile(owner, name, v, keys):
    """A mapping of known keys to finite numbers (SchedOptions.compute, .device), or None."""
    if v is None:
        return None
    what = f"{owner}.{name}"
    if not isinstance(v, Mapping):
        raise TypeError(f"{what} = {v!r}: want a dict with keys from {list(keys)}, got {type(v).__name__}")
    out = {}
    for k, x in v.items():
        if k not in keys:
            raise ValueError(f"unknown {name} field {k!r} in {what} (want one of {list(keys)})")
        out[k] = _args.real(f"{what}[{k!r}]", x)
    return out


@dataclass(frozen=True)
class IOOptions:
    """The I/O engines (runtime.Config's QueueDepth ... MaxLoads, SaveWritesPerDevice)."""

    queue_depth: int = 0  # I/Os in flight per engine
    staging_bytes: int = 0  # off-heap staging memory; bounds the bytes in flight
    staging_slot_bytes: int = 0  # largest single I/O; divides staging_bytes
    max_loads: int = 0  # loads in flight at once (more: Busy)
    save_writes_per_device: int = 0  # save writes in flight per device, 0..256

    def __post_init__(self):
        _check_ints(self, {"queue_depth": _args.int32, "staging_bytes": _args.int64, "staging_slot_bytes": _args.int64,
                           "max_loads": _args.int32, "save_writes_per_device": _args.int32})


@dataclass(frozen=True)
class SchedOptions:
    """The scheduler (runtime.Config's SaveBoundMs, SaveBudgetBytes, Compute,
    Device).

    ``compute`` (keys fixed_ns, per_token_ns, per_pair_ns: prefill time per
    layer) lets the scheduler leave a stored tail to recompute where that is
    faster; without it every stored block is loaded. ``device`` (keys
    read_bytes_per_sec, write_bytes_per_sec, read_iops, write_iops,
    read_latency_ns, read_share_under_writes, write_share_under_reads; from
    `tutti devbench`) describes each directory's device."""

    save_bound_ms: int = 0  # longest a save may be deferred behind loads
    save_budget_bytes: int = 0  # save bytes admitted and not yet written, per device
    compute: Optional[Mapping[str, float]] = None
    device: Optional[Mapping[str, float]] = None

    def __post_init__(self):
        _check_ints(self, {"save_bound_ms": _args.int32, "save_budget_bytes": _args.int64})
        object.__setattr__(self, "compute", _check_profile("SchedOptions", "compute", self.compute, COMPUTE_KEYS))
        object.__setattr__(self, "device", _check_profile("SchedOptions", "device", self.device, DEVICE_KEYS))


@dataclass(frozen=True)
class GPUOptions:
    """The GPU path (runtime.GPUConfig); ignored on the CPU path.

    ``io_window``, ``max_io_bytes`` and ``lookahead`` left 0 are sized at open
    to the disks under the store's directories, by the rules named in
    runtime.GPUConfig: the window is ``runtime.GPUReadWindow`` of their request
    queues, the largest read the largest every disk takes unsplit, and the
    lookahead ``runtime.GPULookaheadToFill`` of that window. A value set wins;
    :meth:`Store.gpu_reads` says what was used."""

    device: int = 0  # CUDA ordinal of the KV tensors
    max_pages: int = 0  # pages one restore moves (a longer load is cut); 0 = min(num_pages, 4096)
    max_runs: int = 0  # runs (extents per layer) of one restore; 0 = 64
    io_window: int = 0  # reads in flight; 0 = sized to the disks
    max_io_bytes: int = 0  # largest read, a multiple of 4096 up to 16 MiB; 0 = sized to the disks
    lookahead: int = 0  # layers in flight beyond the one waited for; 0 = fill the window

    def __post_init__(self):
        _check_ints(self, {f.name: _args.int32 for f in fields(self)})


#: flat keyword → (group, field).
FLAT: Dict[str, Tuple[str, str]] = {
    "queue_depth": ("io", "queue_depth"),
    "staging_bytes": ("io", "staging_bytes"),
    "staging_slot_bytes": ("io", "staging_slot_bytes"),
    "max_loads": ("io", "max_loads"),
    "save_writes_per_device": ("io", "save_writes_per_device"),
    "save_bound_ms": ("sched", "save_bound_ms"),
    "save_budget_bytes": ("sched", "save_budget_bytes"),
    "compute": ("sched", "compute"),
    "device": ("sched", "device"),
    "gpu_device": ("gpu", "device"),
    "gpu_max_pages": ("gpu", "max_pages"),
    "gpu_max_runs": ("gpu", "max_runs"),
    "gpu_io_window": ("gpu", "io_window"),
    "gpu_max_io_bytes": ("gpu", "max_io_bytes"),
    "gpu_lookahead": ("gpu", "lookahead"),
}

#: Accepted and ignored: GPU reads are sized to the devices by default.
NO_OP = frozenset({"gpu_reads_from_devices"})

GROUPS = {"io": IOOptions, "sched": SchedOptions, "gpu": GPUOptions}


def spelling(flat: str) -> str:
    """The grouped spelling of flat keyword ``flat``, for messages."""
    group, name = FLAT[flat]
    return f"{group}={GROUPS[group].__name__}({name}=...)"


def from_flat(flat: Mapping[str, object], io: Optional[IOOptions] = None, sched: Optional[SchedOptions] = None,
              gpu: Optional[GPUOptions] = None) -> Dict[str, object]:
    """The groups (keys io, sched, gpu) with the flat keywords ``flat`` applied.
    A flat keyword whose group is also given is a TypeError (which would
    win is not obvious); an unknown one too."""
    given = {"io": _args.instance("io", io, IOOptions, optional=True),
             "sched": _args.instance("sched", sched, SchedOptions, optional=True),
             "gpu": _args.instance("gpu", gpu, GPUOptions, optional=True)}
    fields: Dict[str, Dict[str, object]] = {g: {} for g in GROUPS}
    for k, v in flat.items():
        if k in NO_OP:
            continue
        if k not in FLAT:
            raise TypeError(f"unknown store option {k!r}")
        group, name = FLAT[k]
        if given[group] is not None:
            raise TypeError(f"{k}= together with {group}=: give it as {spelling(k)}")
        fields[group][name] = v
    return {g: given[g] if given[g] is not None else cls(**fields[g]) for g, cls in GROUPS.items()}

