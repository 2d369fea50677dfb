"""Pythonic wrappers over the C ABI: Geometry, Store, Load, Save.

A :class:`Store` owns one store handle; :class:`Load` and :class:`Save` own
one load or save handle each and release it on ``release()``, on leaving a
``with`` block, or (as a last resort) when garbage-collected. Calls that wait
release the GIL (ctypes does for every call), so other Python threads run.
"""

from __future__ import annotations

import array
import ctypes
import os
import warnings
from dataclasses import dataclass
from typing import Iterable, List, Sequence

from . import _args, _lib, options
from . import stats as _stats
from .options import GPUOptions, IOOptions, SchedOptions
from .tensor import DTYPE_BYTES, dtype_code

_PATHS = {"cpu": _lib.PATH_CPU, "gpu": _lib.PATH_GPU}
_LAYOUTS = {"per_layer": _lib.LAYOUT_PER_LAYER, "cross_layer": _lib.LAYOUT_CROSS_LAYER}
_MEMORY = {"host": _lib.MEMORY_HOST, "cuda": _lib.MEMORY_CUDA}


@dataclass(frozen=True)
class Geometry:
    """The engine's KV shape (kvshape.Geometry in Go)."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bf16"
    planes: int = 2  # 2 = K and V, 1 = one latent plane (MLA)
    page_tokens: int = 16  # tokens per engine page (vLLM block_size)
    chunk_pages: int = 1  # pages per chain block (hash granularity)

    def __post_init__(self):
        # The int32 fields of tutti_config: ctypes would truncate a wider
        # value, and the store on disk would not be this geometry. What a
        # valid geometry is, the library says (GeometryMismatch).
        for name in ("layers", "kv_heads", "head_dim", "planes", "page_tokens", "chunk_pages"):
            object.__setattr__(self, name, _args.int32(f"Geometry.{name}", getattr(self, name)))
        try:
            dtype_code(self.dtype)
        except ValueError as e:
            raise ValueError(f"Geometry.dtype: {e}") from None

    @property
    def dtype_code(self) -> int:
        return dtype_code(self.dtype)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype_code]

    @property
    def page_bytes_per_plane(self) -> int:
        return self.page_tokens * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def page_bytes_per_layer(self) -> int:
        return self.planes * self.page_bytes_per_plane

    @property
    def block_tokens(self) -> int:
        """Tokens per chain block (one hash)."""
        return self.page_tokens * self.chunk_pages

    def tensor_bytes(self, layout: str, num_pages: int) -> int:
        _args.choice("layout", layout, _LAYOUTS)
        per_layer = _args.integer("num_pages", num_pages, 0) * self.page_bytes_per_layer
        return per_layer if layout == "per_layer" else per_layer * self.layers

    def tensor_shape(self, layout: str, num_pages: int):
        _args.choice("layout", layout, _LAYOUTS)
        _args.integer("num_pages", num_pages, 0)
        if layout == "per_layer":
            return (self.planes, num_pages, self.page_tokens, self.kv_heads, self.head_dim)
        return (num_pages, self.layers, self.planes, self.page_tokens, self.kv_heads, self.head_dim)

    def page_offset(self, layout: str, num_pages: int, layer: int, plane: int, page: int) -> int:
        """Byte offset of (layer, plane, page): inside the layer's tensor
        (per_layer) or the single tensor (cross_layer)."""
        _args.choice("layout", layout, _LAYOUTS)
        num_pages = _args.integer("num_pages", num_pages, 0)
        _args.integer("layer", layer, 0, self.layers - 1)
        _args.integer("plane", plane, 0, self.planes - 1)
        _args.integer("page", page, 0, num_pages - 1)
        pp = self.page_bytes_per_plane
        if layout == "per_layer":
            return (plane * num_pages + page) * pp
        return ((page * self.layers + layer) * self.planes + plane) * pp


def _c_array(typecode, ctype, values, what):
    """A ctypes array over a compact copy of ``values`` (the array module
    checks each element's type and range in C, with no per-element Python
    work). Returns (array, length); the length is a uint32 in the C ABI."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what}: want a sequence of ints, got {type(values).__name__}")
    if isinstance(values, array.array) and values.typecode == typecode:
        buf = values
    else:
        kind = ctype.__name__[2:]
        try:
            buf = array.array(typecode, values)
        except OverflowError as e:
            raise ValueError(f"{what}: every element must be a {kind}: {e}") from None
        except TypeError as e:
            raise TypeError(f"{what}: want a sequence of {kind} ints: {e}") from None
    n = _args.uint32(f"len({what})", len(buf))
    if n == 0:
        return (ctype * 1)(), 0
    arr = (ctype * n).from_buffer(buf)  # borrows buf's memory and keeps buf alive
    return arr, n


def _u64_array(values: Sequence[int], what: str):
    return _c_array("Q", ctypes.c_uint64, values, what)


def _i32_array(values: Sequence[int], what: str):
    return _c_array("i", ctypes.c_int32, values, what)


def _u32_array(values: Sequence[int], what: str):
    return _c_array("I", ctypes.c_uint32, values, what)


def _event_handle(event) -> int:
    """The cudaEvent_t of ``event``: its ``cuda_event`` (a torch.cuda.Event,
    recorded) or the integer itself; never 0."""
    h = getattr(event, "cuda_event", event)
    if isinstance(h, bool) or not isinstance(h, int) or h == 0:
        raise ValueError(f"after_event = {event!r}: want a recorded CUDA event (with cuda_event) or its non-zero handle")
    return _args.uint64("after_event", h)


def chain_from_tokens(tokens: Sequence[int], block_tokens: int, seed: int = 0):
    """The block-hash chain of ``tokens``, computed by the library with the Go
    prefix package's ChainFromTokens (so Python and Go never disagree): one
    id per full block of ``block_tokens`` tokens (a trailing partial block
    has none), XXH64 of the parent id and the block's tokens under ``seed``."""
    lib = _lib.lib()
    block_tokens = _args.uint32("block_tokens", block_tokens, lo=1)
    seed = _args.uint64("seed", seed)
    try:
        len(tokens), tokens[:0]
    except TypeError:
        raise TypeError(f"tokens: want a sequence of uint32 ints, got {type(tokens).__name__}") from None
    n_full = (len(tokens) // block_tokens) * block_tokens
    toks, n = _u32_array(tokens[:n_full], "tokens")
    want = n // block_tokens
    if want == 0:
        return []
    out = (ctypes.c_uint64 * want)()
    out_len = ctypes.c_uint32()
    _lib.check(lib.tutti_chain_from_tokens(toks, n, block_tokens, seed, out, want, ctypes.byref(out_len)),
               "tutti_chain_from_tokens")
    return list(out[: out_len.value])


def _warn_flat(flat):
    """One DeprecationWarning per flat keyword, naming its grouped spelling."""
    for k in flat:
        if k in options.NO_OP:
            msg = (f"Store({k}=...) changes nothing: the GPU path's reads are sized to the devices by default "
                   "(runtime.GPUReadWindow, runtime.GPULookaheadToFill); drop it")
        elif k in options.FLAT:
            msg = f"Store({k}=...) is deprecated and goes in the next release: use {options.spelling(k)}"
        else:
            continue  # from_flat names it
        warnings.warn(msg, DeprecationWarning, stacklevel=3)


class Store:
    """An open tutti store. Use as a context manager or call :meth:`close`."""

    def __init__(self, dirs: Iterable[str] = None, capacity_bytes: int = None, geometry: Geometry = None,
                 num_pages: int = None, layout: str = "per_layer", path: str = "cpu", *, connect: str = None,
                 io: IOOptions = None, sched: SchedOptions = None, gpu: GPUOptions = None, tp_rank: int = 0,
                 tp_size: int = 1, kv_events: str = None, **flat):
        """``io``, ``sched`` and ``gpu`` group the tuning as runtime.Config
        does (:mod:`tutti.options`; each field's 0 is the library default).
        The GPU path's reads are sized to the disks under ``dirs`` unless
        :class:`GPUOptions` sets them (``runtime.GPUReadWindow`` and
        ``runtime.GPULookaheadToFill``); :meth:`gpu_reads` says what was used.

        The flat keywords of earlier releases (``queue_depth=``,
        ``gpu_io_window=``, ``compute=``...) still work for this release and
        warn (DeprecationWarning) naming their grouped spelling;
        ``gpu_reads_from_devices`` is accepted, changes nothing (sizing to
        the devices is the default) and warns too.

        ``kv_events`` ("tcp://HOST:PORT?replay=tcp://HOST:PORT&topic=kv@pod@model")
        publishes what the store serves as vLLM KV events for cache-aware
        routers (docs/routers.md); pass ``tokens`` to :meth:`save` so they are
        published with the blocks. ``kv_events="engine"`` binds nothing: the
        engine takes the events (:meth:`take_kv_events`) and publishes them.

        ``tp_rank``/``tp_size``: with ``tp_size`` = N > 1 the geometry is the
        whole model's, the store holds rank ``tp_rank``'s shard of the KV heads
        (MLA's latent plane whole), ``dirs`` are this rank's own and a
        directory another rank or degree stored into is refused
        (:class:`GeometryMismatch`).

        ``connect`` (the socket of ``tutti serve --dir D1,D2 --socket PATH``)
        connects to the node's shared store instead of opening one: ``dirs``
        and ``capacity_bytes`` are the service's (leave them out), a prefix
        any engine of the node saved is a hit here, and this process still
        moves its own bytes (``path``: host memory or the GPU's HBM). KV events
        and etcd membership are the service's (``kv_events`` is refused), and
        ``tp_size`` must be 1 (one service per rank)."""
        _args.choice("layout", layout, _LAYOUTS)
        _args.choice("path", path, _PATHS)
        if geometry is None or num_pages is None:
            raise TypeError("Store: geometry and num_pages are required")
        if connect is not None:
            connect = _args.string("connect", connect)
            if dirs is not None or capacity_bytes is not None or kv_events is not None:
                raise ValueError("Store(connect=...): dirs, capacity_bytes and kv_events are the service's; leave them out")
            dirs, capacity_bytes = [], 0
        else:
            if dirs is None or capacity_bytes is None:
                raise TypeError("Store: dirs and capacity_bytes are required (or connect=, a tutti serve socket)")
            dirs = _args.paths("dirs", dirs)
            capacity_bytes = _args.int64("capacity_bytes", capacity_bytes)
        _args.instance("geometry", geometry, Geometry)
        num_pages = _args.int64("num_pages", num_pages)
        tp_rank, tp_size = _args.uint32("tp_rank", tp_rank), _args.uint32("tp_size", tp_size)
        kv_events = None if kv_events is None else _args.string("kv_events", kv_events)
        groups = options.from_flat(flat, io=io, sched=sched, gpu=gpu)
        _warn_flat(flat)
        io, sched, gpu = groups["io"], groups["sched"], groups["gpu"]
        self.geometry = geometry
        self.tp_rank, self.tp_size = tp_rank, max(tp_size, 1)
        self.num_pages = num_pages
        self.layout = layout
        self.path = path
        self._lib = _lib.lib()
        self._dirs = (ctypes.c_char_p * max(len(dirs), 1))(*dirs)
        cfg = _lib.tutti_config(
            struct_size=ctypes.sizeof(_lib.tutti_config), abi_major=_lib.ABI_MAJOR,
            dirs=ctypes.cast(self._dirs, ctypes.POINTER(ctypes.c_char_p)), num_dirs=len(dirs),
            path=_PATHS[path], capacity_bytes=capacity_bytes,
            layers=geometry.layers, kv_heads=geometry.kv_heads, head_dim=geometry.head_dim,
            dtype=geometry.dtype_code, planes=geometry.planes, page_tokens=geometry.page_tokens,
            chunk_pages=geometry.chunk_pages, layout=_LAYOUTS[layout], num_pages=num_pages,
            queue_depth=io.queue_depth, staging_bytes=io.staging_bytes, staging_slot_bytes=io.staging_slot_bytes,
            max_loads=io.max_loads, save_writes_per_device=io.save_writes_per_device, save_bound_ms=sched.save_bound_ms, save_budget_bytes=sched.save_budget_bytes,
            gpu_device=gpu.device, gpu_max_pages=gpu.max_pages, gpu_max_runs=gpu.max_runs,
            gpu_io_window=gpu.io_window, gpu_max_io_bytes=gpu.max_io_bytes, gpu_lookahead=gpu.lookahead,
            tp_rank=tp_rank, tp_size=tp_size,
        )
        for prefix, given in (("compute_", sched.compute), ("device_", sched.device)):
            for k, v in (given or {}).items():  # keys and values checked by SchedOptions
                setattr(cfg, prefix + k, v)
        h = ctypes.c_uint64()
        if connect is not None:
            _lib.check(self._lib.tutti_connect(os.fsencode(connect), ctypes.byref(cfg), ctypes.byref(h)), "tutti_connect")
        elif kv_events is None:
            _lib.check(self._lib.tutti_open(ctypes.byref(cfg), ctypes.byref(h)), "tutti_open")
        else:
            _lib.check(self._lib.tutti_open_kv_events(ctypes.byref(cfg), os.fsencode(kv_events), ctypes.byref(h)),
                       "tutti_open_kv_events")
        self.handle = h.value
        self._regions = None
        self._take_buf = (ctypes.c_uint8 * (1 << 20))()

    @property
    def shard_geometry(self) -> Geometry:
        """The geometry this store holds: its rank's share of the KV heads
        (runtime/tp's rule: split evenly; one latent plane is whole)."""
        g = self.geometry
        if self.tp_size == 1 or g.planes == 1:
            return g
        return Geometry(g.layers, g.kv_heads // self.tp_size, g.head_dim, g.dtype, g.planes, g.page_tokens, g.chunk_pages)

    # -- lifecycle
    def close(self):
        """Waits for deferred saves and closes; idempotent."""
        h, self.handle = self.handle, 0
        if h:
            _lib.check(self._lib.tutti_close(h), "tutti_close")

    @property
    def closed(self):
        return self.handle == 0

    def _h(self):
        if not self.handle:
            raise _lib.Closed("the store is closed", op="tutti")
        return self.handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "handle", 0):
                self._lib.tutti_close(self.handle)
        except Exception:  # interpreter shutdown: nothing left to report to
            pass

    # -- KV memory
    def register_kv(self, regions: Sequence[tuple], memory: str = None):
        """Registers KV memory, once per store: ``regions`` is a list of
        (address, length in bytes), one per layer (per_layer) or one
        (cross_layer). ``memory`` is 'host' or 'cuda' (default: by the
        store's path). The memory must stay valid until :meth:`close`
        returns."""
        if memory is None:
            memory = "host" if self.path == "cpu" else "cuda"
        _args.choice("memory", memory, _MEMORY)
        if isinstance(regions, (str, bytes)) or not isinstance(regions, Sequence):
            raise TypeError(f"regions: want a list of (address, length) pairs, got {type(regions).__name__}")
        _args.uint32("len(regions)", len(regions))
        arr = (_lib.tutti_kv_region * max(len(regions), 1))()
        for i, r in enumerate(regions):
            if not isinstance(r, Sequence) or isinstance(r, (str, bytes)) or len(r) != 2:
                raise TypeError(f"regions[{i}] = {r!r}: want an (address, length) pair")
            arr[i].addr = _args.uint64(f"regions[{i}] address", r[0])
            arr[i].len_bytes = _args.uint64(f"regions[{i}] length", r[1])
        _lib.check(self._lib.tutti_register_kv(self._h(), _MEMORY[memory], arr, len(regions)), "tutti_register_kv")
        self._regions = arr  # keep the description alive alongside the registration

    # -- lookup / load / save
    def lookup(self, chain: Sequence[int]) -> int:
        """Leading blocks of ``chain`` that are stored."""
        arr, n = _u64_array(chain, "chain")
        out = ctypes.c_uint32()
        _lib.check(self._lib.tutti_lookup(self._h(), arr, n, ctypes.byref(out)), "tutti_lookup")
        return out.value

    def load(self, chain: Sequence[int], pages: Sequence[int]) -> "Load":
        """Starts restoring the stored prefix of ``chain`` into ``pages``
        (chunk_pages page ids per block)."""
        c, nc = _u64_array(chain, "chain")
        p, np_ = _i32_array(pages, "pages")
        h = ctypes.c_uint64()
        _lib.check(self._lib.tutti_load(self._h(), c, nc, p, np_, ctypes.byref(h)), "tutti_load")
        return Load(self, h.value, nc)

    def load_with(self, chain: Sequence[int], pages: Sequence[int], skip: int = 0, promised: bool = False) -> "Load":
        """:meth:`load` after the engine's own first ``skip`` blocks (its local
        hits; ``skip < len(chain)``): ``pages`` is the block table of
        ``chain[skip:]`` only, and the plan and result count blocks after
        ``skip``. ``promised``: the blocks were promised by :meth:`match`, so
        the planner loads every cached block it can admit."""
        c, nc = _u64_array(chain, "chain")
        p, np_ = _i32_array(pages, "pages")
        skip = _args.uint32("skip", skip)
        h = ctypes.c_uint64()
        flags = _lib.LOAD_PROMISED if _args.boolean("promised", promised) else 0
        _lib.check(self._lib.tutti_load_with(self._h(), c, nc, skip, flags, p, np_, ctypes.byref(h)), "tutti_load_with")
        return Load(self, h.value, nc - skip)

    def match(self, chain: Sequence[int], skip: int = 0, ttl_ms: int = 30000) -> "Hold":
        """The lookup of an engine that commits before it loads (vLLM): the
        returned :class:`Hold`'s ``blocks`` are the blocks after ``skip`` that
        a promised :meth:`load_with` restores unless a read fails (not stored,
        cheaper to recompute, or past one GPU restore: left out), held against
        eviction until :meth:`Hold.release` or ``ttl_ms``."""
        c, nc = _u64_array(chain, "chain")
        skip, ttl_ms = _args.uint32("skip", skip), _args.uint32("ttl_ms", ttl_ms)
        h, n = ctypes.c_uint64(), ctypes.c_uint32()
        _lib.check(self._lib.tutti_match(self._h(), c, nc, skip, ttl_ms, ctypes.byref(h), ctypes.byref(n)), "tutti_match")
        return Hold(self, h.value, n.value)

    def save(self, chain: Sequence[int], pages: Sequence[int], tokens: Sequence[int] = None,
             hashes: Sequence[bytes] = None, after_event=None) -> "Save":
        """Starts saving ``chain``'s blocks from ``pages``; the pages must
        stay unchanged until :meth:`Save.wait_gathered`. For a store opened
        with ``kv_events``: ``tokens`` (the blocks' token ids, block_tokens
        per chain block) are published with the blocks, and ``hashes`` (the
        engine's own hash of each block, e.g. vLLM's block hash bytes, all of
        one length, 1..64 bytes) are published instead of the chain ids.
        ``after_event`` (GPU path): a recorded CUDA event of the store's
        device, e.g. a ``torch.cuda.Event``, behind the engine's writes of
        the pages; the gathers copy them once it completed, so the host
        need not wait for the engine's stream first. The Save keeps it
        referenced until released."""
        c, nc = _u64_array(chain, "chain")
        p, np_ = _i32_array(pages, "pages")
        h = ctypes.c_uint64()
        ev = _event_handle(after_event) if after_event is not None else 0
        if tokens is None and hashes is None and not ev:
            _lib.check(self._lib.tutti_save(self._h(), c, nc, p, np_, ctypes.byref(h)), "tutti_save")
            return Save(self, h.value)
        t, nt = _u32_array(tokens, "tokens") if tokens is not None else (None, 0)
        hb, hlen = None, 0
        if hashes is not None:
            if isinstance(hashes, (str, bytes)):
                raise TypeError(f"hashes: want a sequence of bytes, one per chain block, got {type(hashes).__name__}")
            hashes = list(hashes)
            for i, x in enumerate(hashes):
                if not isinstance(x, (bytes, bytearray, memoryview)):
                    raise TypeError(f"hashes[{i}] = {x!r}: want bytes, got {type(x).__name__}")
            hashes = [bytes(x) for x in hashes]
            if len(hashes) != nc:
                raise ValueError(f"hashes: {len(hashes)} for {nc} chain blocks")
            hlen = len(hashes[0]) if hashes else 0
            if any(len(x) != hlen for x in hashes):
                raise ValueError(f"hashes: lengths {sorted({len(x) for x in hashes})}, want one length")
            joined = b"".join(hashes)
            hb = (ctypes.c_uint8 * max(len(joined), 1)).from_buffer_copy(joined.ljust(max(len(joined), 1), b"\0"))
        if ev:
            _lib.check(self._lib.tutti_save_after(self._h(), c, nc, p, np_, t, nt, hb, hlen, ev, ctypes.byref(h)),
                       "tutti_save_after")
            sv = Save(self, h.value)
            sv.after_event = after_event  # alive while the gathers may wait for it
            return sv
        _lib.check(self._lib.tutti_save_meta(self._h(), c, nc, p, np_, t, nt, hb, hlen, ctypes.byref(h)), "tutti_save_meta")
        return Save(self, h.value)

    # Bounds one take_kv_events answer (the library's own bound is 1 GiB).
    _TAKE_MAX_BYTES = 256 << 20

    def take_kv_events(self) -> List[bytes]:
        """For a store opened with ``kv_events="engine"``: every event queued
        since the last call, oldest first, as msgpack payloads (each one array
        of events in the spec's format, vLLM 0.26's maps by default;
        :func:`tutti.kv_events.decode` reads them). The first call, and the
        first after the queue overflowed, begins with AllBlocksCleared, then
        lists what the store serves: "this store's blocks are the ones that
        follow", never to be forwarded to a router as it is."""
        out = []
        while True:
            buf = self._take_buf
            n, count, more = ctypes.c_uint64(), ctypes.c_uint32(), ctypes.c_uint32()
            rc = self._lib.tutti_take_kv_events(self._h(), buf, len(buf), ctypes.byref(n), ctypes.byref(count),
                                                ctypes.byref(more))
            if rc == _lib.BufferTooSmall.code and n.value <= self._TAKE_MAX_BYTES:
                self._take_buf = (ctypes.c_uint8 * n.value)()
                continue
            _lib.check(rc, "tutti_take_kv_events")
            if count.value:
                out.append(bytes(memoryview(buf)[:n.value]))
            if not more.value:
                return out

    def wait_saves(self):
        """Blocks until every save so far ended (durable and found by lookup, or
        skipped). Raises StoreIOError when saves since the last call lost blocks to
        a failed write or journal append (a full disk: the message names it); the
        store stays usable and saves resume once the disk has room."""
        _lib.check(self._lib.tutti_wait_saves(self._h()), "tutti_wait_saves")

    def recovery(self) -> dict:
        """What open recovered: indexed_runs, indexed_blocks, dropped_runs."""
        r = _lib.tutti_recovery(struct_size=ctypes.sizeof(_lib.tutti_recovery))
        _lib.check(self._lib.tutti_get_recovery(self._h(), ctypes.byref(r)), "tutti_get_recovery")
        return {f: getattr(r, f) for f in ("indexed_runs", "indexed_blocks", "dropped_runs")}

    def gpu_reads(self) -> str:
        """The GPU path's read settings open chose (:class:`GPUOptions`): the
        window, largest read and lookahead and, after "not read:", each
        device fact that could not be read and what was assumed."""
        return self._text("tutti_get_gpu_reads").decode()

    def stats(self) -> _stats.StatsGroup:
        """runtime.Stats, nested by subsystem (:mod:`tutti.stats`): the counters
        since open and the states, each state's reason beside it."""
        return _stats.parse(self._text("tutti_get_stats_json"))

    def _text(self, fn) -> bytes:
        """What the text function ``fn`` (tutti_get_gpu_reads, ...) returns: its
        length asked first, and again when the text grew meanwhile."""
        f = getattr(self._lib, fn)
        n = ctypes.c_uint64()
        rc = f(self._h(), None, 0, ctypes.byref(n))
        while rc == _lib.BufferTooSmall.code:
            buf = ctypes.create_string_buffer(n.value + 1)
            rc = f(self._h(), buf, len(buf), ctypes.byref(n))
        _lib.check(rc, fn)
        return buf.raw[:n.value]


class _Handle:
    _release_fn = ""

    def __init__(self, store, handle):
        self.store = store
        self.handle = handle

    def release(self):
        h, self.handle = self.handle, 0
        if h:
            _lib.check(getattr(self.store._lib, self._release_fn)(h), self._release_fn)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            if getattr(self, "handle", 0) and self.store.handle:
                getattr(self.store._lib, self._release_fn)(self.handle)
        except Exception:
            pass


class Load(_Handle):
    """A restore in progress."""

    _release_fn = "tutti_load_release"

    def __init__(self, store, handle, chain_len):
        super().__init__(store, handle)
        self.chain_len = chain_len

    def plan(self):
        """(cached, planned): leading blocks stored when the load started, and
        those it restores unless an I/O fails (the rest is to be recomputed)."""
        cached, planned = ctypes.c_uint32(), ctypes.c_uint32()
        _lib.check(self.store._lib.tutti_load_plan(self.handle, ctypes.byref(cached), ctypes.byref(planned)),
                   "tutti_load_plan")
        return cached.value, planned.value

    def failure(self):
        """None, or the error (a TuttiError instance, not raised) that turned
        part of this load into a miss: an I/O error, a checksum mismatch..."""
        st = ctypes.c_int32()
        _lib.check(self.store._lib.tutti_load_failure(self.handle, ctypes.byref(st)), "tutti_load_failure")
        if st.value == 0:
            return None
        return _lib.ERRORS.get(st.value, _lib.TuttiError)(_lib.last_error(), op="tutti_load")

    def wait_layer(self, layer: int):
        """Blocks until ``layer`` is in KV memory."""
        layer = _args.int32("layer", layer)
        _lib.check(self.store._lib.tutti_load_wait_layer(self.handle, layer), "tutti_load_wait_layer")

    def stream_wait_layer(self, layer: int, stream: int):
        """GPU path: makes CUDA stream ``stream`` (a cudaStream_t as an int,
        e.g. ``torch.cuda.current_stream().cuda_stream``; 0 = legacy default)
        wait for ``layer`` without blocking this thread."""
        layer, stream = _args.int32("layer", layer), _args.uint64("stream", stream)
        _lib.check(self.store._lib.tutti_load_stream_wait_layer(self.handle, layer, stream),
                   "tutti_load_stream_wait_layer")

    def done(self) -> bool:
        """Whether the load ended (never blocks): :meth:`wait` then returns
        at once. GPU path: its pages are written on the device, so kernels
        enqueued afterwards see them."""
        out = ctypes.c_int32()
        _lib.check(self.store._lib.tutti_load_done(self.handle, ctypes.byref(out)), "tutti_load_done")
        return out.value == 1

    def wait(self) -> int:
        """Blocks until done; returns the leading blocks restored (the rest
        must be recomputed)."""
        out = ctypes.c_uint32()
        _lib.check(self.store._lib.tutti_load_wait(self.handle, ctypes.byref(out)), "tutti_load_wait")
        return out.value


class Save(_Handle):
    """A save in progress."""

    _release_fn = "tutti_save_release"

    def wait_gathered(self):
        """Blocks until the pages have been copied out (they may change after)."""
        _lib.check(self.store._lib.tutti_save_wait_gathered(self.handle), "tutti_save_wait_gathered")

    def gathered(self) -> bool:
        """Whether the pages have been copied out (never blocks):
        :meth:`wait_gathered` then returns at once."""
        out = ctypes.c_int32()
        _lib.check(self.store._lib.tutti_save_gathered(self.handle, ctypes.byref(out)), "tutti_save_gathered")
        return out.value == 1


class Hold(_Handle):
    """A prefix promised by :meth:`Store.match`, pinned until released (or
    its time to live ran out)."""

    _release_fn = "tutti_hold_release"

    def __init__(self, store, handle, blocks):
        super().__init__(store, handle)
        self.blocks = blocks
