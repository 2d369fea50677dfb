"""A KV connector shaped like vLLM's ``KVConnectorBase_V1``.

vLLM is not a dependency: the connector has the same method names and call
order, and takes duck-typed requests, so that a thin subclass can plug it into
vLLM while tests and the example drive it directly.

Per step, in vLLM's order:

scheduler side
    ``get_num_new_matched_tokens(request, num_computed_tokens)`` → how many
    more prompt tokens tutti can supply (block granular), and whether the
    load is asynchronous (never: loads run inside the forward, layer by layer).
    ``build_connector_meta`` packs what the workers must load and save.

worker side
    ``register_kv_caches`` once; then per forward ``bind_connector_metadata``,
    ``start_load_kv`` (starts every load, returns at once),
    ``wait_for_layer_load(layer)`` before each layer's attention,
    ``save_kv_layer(layer, ...)`` after it (the save starts at the last layer:
    a tutti run holds all layers of a block), ``wait_for_save`` at the end of
    the forward (returns once the saved pages may be overwritten),
    ``get_finished``, ``clear_connector_metadata``.

Chains: a request names its blocks by ``block_hashes`` (a chain of uint64,
e.g. vLLM's block hashes folded to 64 bits, or Mooncake hash ids) or by
``token_ids``, from which the chain is derived by the library itself
(:func:`tutti.chain_from_tokens`, the Go prefix package's ChainFromTokens,
seeded with ``hash_seed``: use one seed per model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import sys
from typing import Callable, Dict, List, Optional, Sequence

from . import _args
from .store import Load, Save, Store, chain_from_tokens
from .tensor import TensorMismatch, check_tensor, describe, shared_memory


@dataclass
class ReqMeta:
    """One request's part of a step: what to load (or save) and where.

    ``block_ids`` are the engine's page ids for the request's tokens in
    order (vLLM's block table row). ``num_tokens`` limits the blocks used to
    those covering the first ``num_tokens`` tokens (only whole blocks have a
    hash, so a trailing partial block is never loaded or saved)."""

    req_id: str
    block_ids: Sequence[int]
    token_ids: Optional[Sequence[int]] = None
    block_hashes: Optional[Sequence[int]] = None
    num_tokens: Optional[int] = None

    def __post_init__(self):
        _args.string("ReqMeta.req_id", self.req_id)
        self.block_ids = _int_list("ReqMeta.block_ids", self.block_ids, _args.int32)
        if self.token_ids is not None:
            self.token_ids = _int_list("ReqMeta.token_ids", self.token_ids, _args.uint32)
        if self.block_hashes is not None:
            self.block_hashes = [_args.uint64(f"ReqMeta.block_hashes[{i}]", _hash64(h))
                                 for i, h in enumerate(_seq("ReqMeta.block_hashes", self.block_hashes))]
        if self.num_tokens is not None:
            _args.integer("ReqMeta.num_tokens", self.num_tokens, 0)


def _seq(name, v):
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise TypeError(f"{name} = {v!r}: want a sequence, got {type(v).__name__}")
    return list(v)


def _int_list(name, v, check):
    return [check(f"{name}[{i}]", x) for i, x in enumerate(_seq(name, v))]


@dataclass
class ConnectorMetadata:
    """What the scheduler hands the workers for one step."""

    loads: List[ReqMeta] = field(default_factory=list)
    saves: List[ReqMeta] = field(default_factory=list)


def _torch_stream_sync():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()


def _hash64(h) -> int:
    """A block hash as a uint64 chain id: an int (folded to 64 bits), bytes
    (vLLM's BlockHash: the first 8 bytes, little-endian; the bytes are already
    a chained hash of the whole prefix), or an object with ``hash_value``."""
    if isinstance(h, (bytes, bytearray, memoryview)):
        return int.from_bytes(bytes(h[:8]), "little")
    if hasattr(h, "hash_value"):
        return _hash64(h.hash_value)
    return int(h) & 0xFFFFFFFFFFFFFFFF


def _torch_current_stream() -> int:
    return sys.modules["torch"].cuda.current_stream().cuda_stream


class TuttiConnector:
    """vLLM-style KV connector over one tutti :class:`Store`.

    ``layer_names``, if given, fixes the layer order (index = layer number);
    otherwise the order of the dict passed to :meth:`register_kv_caches` is
    used (vLLM passes layers in model order)."""

    def __init__(self, store: Store, layer_names: Optional[Sequence[str]] = None, hash_seed: int = 0,
                 device_sync: Optional[Callable[[], None]] = None, stream_wait: Optional[bool] = None):
        self.store = _args.instance("store", store, Store)
        self.hash_seed = _args.uint64("hash_seed", hash_seed)
        if device_sync is not None and not callable(device_sync):
            raise TypeError(f"device_sync = {device_sync!r}: want a callable or None")
        if stream_wait is not None:
            _args.boolean("stream_wait", stream_wait)
        if layer_names is not None:
            layer_names = [_args.string(f"layer_names[{i}]", n) for i, n in enumerate(_seq("layer_names", layer_names))]
        # On the GPU path tutti's copies run on their own CUDA streams: the
        # engine's kernels that wrote the pages to save (or still use the
        # pages a load overwrites) must be finished first. Default: sync
        # torch's current stream when torch is loaded.
        if device_sync is None and store.path == "gpu":
            device_sync = _torch_stream_sync
        self._device_sync = device_sync or (lambda: None)
        # GPU path with torch: wait_for_layer_load makes torch's current CUDA
        # stream wait for the layer (no host round trip); the loads are then
        # finished on the host by get_finished, after the forward.
        if stream_wait is None:
            stream_wait = store.path == "gpu" and "torch" in sys.modules
        self.stream_wait = stream_wait
        self.geometry = store.geometry
        self._layer_index: Dict[str, int] = {}
        if layer_names is not None:
            self._set_layers(list(layer_names))
        self._meta: Optional[ConnectorMetadata] = None
        self._pending_meta = ConnectorMetadata()
        self._loads: Dict[str, Load] = {}
        self._load_chains: Dict[str, int] = {}
        self._load_pages: Dict[str, List[int]] = {}
        self._saves: Dict[str, Save] = {}
        self._saves_started = False
        self._finished_recving: set = set()
        self._finished_sending: set = set()
        self._load_errors: set = set()
        # Per request: blocks the load restored (after it finished), and the
        # blocks it set out to restore (known when start_load_kv returns: the
        # engine computes every token past planned_blocks * block_tokens).
        self.loaded_blocks: Dict[str, int] = {}
        self.planned_blocks: Dict[str, int] = {}
        # Per request whose load lost blocks to an error: the first such error.
        self.load_failures: Dict[str, Exception] = {}

    def _set_layers(self, names):
        if len(names) != self.geometry.layers:
            raise ValueError(f"{len(names)} layer names, the geometry has {self.geometry.layers} layers")
        if len(set(names)) != len(names):
            raise ValueError("layer names repeat")
        self._layer_index = {n: i for i, n in enumerate(names)}

    def layer_index(self, layer_name: str) -> int:
        try:
            return self._layer_index[layer_name]
        except KeyError:
            raise KeyError(f"unknown layer {layer_name!r} (registered: {list(self._layer_index)[:4]}...)") from None

    # ------------------------------------------------------------------ chains
    def chain_of(self, req) -> List[int]:
        """The block-hash chain of a request (ReqMeta or a vLLM-like request
        with ``block_hashes`` or ``prompt_token_ids``/``token_ids``)."""
        hashes = getattr(req, "block_hashes", None)
        if hashes is not None and len(hashes) > 0:
            chain = [_hash64(h) for h in hashes]
        else:
            toks = getattr(req, "token_ids", None)
            if toks is None:
                toks = getattr(req, "prompt_token_ids", None)
            if toks is None:
                raise ValueError(f"request {getattr(req, 'req_id', getattr(req, 'request_id', '?'))!r} has neither block_hashes nor token ids")
            toks = toks.tolist() if hasattr(toks, "tolist") else list(toks)  # a tensor, or any sequence
            chain = chain_from_tokens(toks, self.geometry.block_tokens, self.hash_seed)
        n = getattr(req, "num_tokens", None)
        if n is not None:
            # The blocks covering the first n tokens: a block the count ends
            # inside is loaded whole (get_num_new_matched_tokens reports one
            # token less than a fully cached prompt; that token is recomputed
            # over its own, identical, KV).
            chain = chain[: -(-n // self.geometry.block_tokens)]
        return chain

    # ------------------------------------------------------------ scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        """(tokens beyond ``num_computed_tokens`` that tutti can load, False).

        A hit is whole chain blocks. If it covers the entire prompt, one token
        less is reported so the engine still computes the last token (it needs
        its logits); the last block is loaded whole and that token's KV is
        rewritten with the same values."""
        chain = self.chain_of(request)
        if not chain:
            return 0, False
        hit = self.store.lookup(chain) * self.geometry.block_tokens
        toks = getattr(request, "num_tokens", None)
        if toks is None:
            t = getattr(request, "prompt_token_ids", None) or getattr(request, "token_ids", None)
            toks = len(t) if t is not None else hit
        if hit >= toks:
            hit = toks - 1
        return max(0, hit - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        """vLLM calls this once the request's pages are allocated: queue the
        load of the blocks covering its first num_computed_tokens +
        num_external_tokens tokens. ``blocks`` is a list of page ids or an
        object with ``get_block_ids()`` (vLLM's KVCacheBlocks)."""
        if num_external_tokens <= 0:
            return
        ids = blocks.get_block_ids()[0] if hasattr(blocks, "get_block_ids") else blocks
        req_id = getattr(request, "request_id", None) or getattr(request, "req_id")
        n = getattr(request, "num_computed_tokens", 0) + num_external_tokens
        self.add_load(ReqMeta(req_id, list(ids), token_ids=getattr(request, "prompt_token_ids", None)
                              or getattr(request, "token_ids", None),
                              block_hashes=getattr(request, "block_hashes", None), num_tokens=n))

    def request_finished(self, request, block_ids):
        """(delay freeing the pages?, transfer params): never delayed, since a
        save's pages are released by wait_for_save in the step that wrote them."""
        return False, None

    def build_connector_meta(self, scheduler_output=None) -> ConnectorMetadata:
        """Returns the loads and saves queued with :meth:`add_load` /
        :meth:`add_save` since the last call."""
        meta, self._pending_meta = self._pending_meta, ConnectorMetadata()
        return meta

    def add_load(self, req: ReqMeta):
        self._pending_meta.loads.append(req)

    def add_save(self, req: ReqMeta):
        self._pending_meta.saves.append(req)

    # --------------------------------------------------------------- worker side
    def register_kv_caches(self, kv_caches: Dict[str, object]):
        """Registers the paged KV memory: layer name → tensor (torch tensor or
        :class:`RawTensor`). Per-layer layout: one tensor per layer shaped
        [planes, num_pages, page_tokens, kv_heads, head_dim] (MLA: the plane
        dimension may be omitted). Cross-layer layout: the same tensor under
        every name, or a single entry, shaped
        [num_pages, layers, planes, page_tokens, kv_heads, head_dim].
        Raises a :class:`tutti.TensorMismatch` subclass naming the layer and
        the property (dtype, shape, stride, alignment, device) that is wrong."""
        g, st = self.geometry, self.store
        names = list(kv_caches)
        device = "cpu" if st.path == "cpu" else "cuda"
        if st.layout == "per_layer":
            if not self._layer_index:
                self._set_layers(names)
            missing = [n for n in self._layer_index if n not in kv_caches]
            if missing or len(names) != g.layers:
                raise ValueError(f"kv_caches has {len(names)} layers, the geometry has {g.layers}; missing {missing[:4]}")
            shape = g.tensor_shape("per_layer", st.num_pages)
            alts = [shape[1:]] if g.planes == 1 else []
            if g.planes == 1 and g.kv_heads == 1:
                alts.append(shape[1:3] + shape[4:])
            regions = [None] * g.layers
            spans = []
            for name in names:
                t = describe(kv_caches[name], name)
                n = check_tensor(t, name, shape, g.dtype_code, device, alts)
                regions[self._layer_index[name]] = (t.data_ptr, n)
                spans.append((name, t.data_ptr, n))
            shared = shared_memory(spans)
            if shared:
                raise ValueError(f"register_kv_caches: {shared}")
        else:
            shape = g.tensor_shape("cross_layer", st.num_pages)
            descs = [describe(kv_caches[n], n) for n in names]
            ptrs = {d.data_ptr for d in descs}
            if len(ptrs) != 1:
                raise TensorMismatch(names[0], "cross-layer layout needs one tensor shared by every layer name")
            if not self._layer_index:
                self._layer_index = {n: i for i, n in enumerate(names)} if len(names) == g.layers else {}
            n = check_tensor(descs[0], names[0], shape, g.dtype_code, device)
            regions = [(descs[0].data_ptr, n)]
        st.register_kv(regions)
        # The library writes into these tensors until the store is closed:
        # hold them so that they cannot be freed under it.
        self._kv_refs = dict(kv_caches)

    def bind_connector_metadata(self, meta: ConnectorMetadata):
        self._meta = meta
        self._saves_started = False

    def clear_connector_metadata(self):
        self._meta = None

    def _pages_for(self, req: ReqMeta, chain_len: int) -> List[int]:
        cp = self.geometry.chunk_pages
        need = chain_len * cp
        if len(req.block_ids) < need:
            raise ValueError(f"request {req.req_id!r}: {len(req.block_ids)} block ids for {chain_len} chain blocks "
                             f"of {cp} pages (need {need})")
        return [int(b) for b in req.block_ids[:need]]

    def start_load_kv(self, forward_context=None, **kwargs):
        """Starts every load of the bound metadata (returns at once)."""
        meta = self._meta or ConnectorMetadata()
        if meta.loads:
            self._device_sync()
        for req in meta.loads:
            chain = self.chain_of(req)
            if not chain:
                continue
            pages = self._pages_for(req, len(chain))
            ld = self.store.load(chain, pages)
            self._loads[req.req_id] = ld
            self._load_chains[req.req_id] = len(chain)
            self._load_pages[req.req_id] = pages
            self.planned_blocks[req.req_id] = ld.plan()[1]

    def wait_for_layer_load(self, layer_name: str):
        """Returns once ``layer_name`` of every load of this step is in KV
        memory (host wait), or once torch's current CUDA stream has been made
        to wait for it (``stream_wait``, GPU path)."""
        layer = self.layer_index(layer_name)
        if self.stream_wait:
            stream = _torch_current_stream()
            for ld in self._loads.values():
                ld.stream_wait_layer(layer, stream)
            return
        for ld in self._loads.values():
            ld.wait_layer(layer)
        if layer == self.geometry.layers - 1:
            self._finish_loads()

    def _finish_loads(self):
        cp = self.geometry.chunk_pages
        for req_id, ld in list(self._loads.items()):
            blocks = ld.wait()
            failure = ld.failure()
            if failure is not None:
                self.load_failures[req_id] = failure
            ld.release()
            self.loaded_blocks[req_id] = blocks
            pages = self._load_pages.pop(req_id)
            self._load_errors.update(pages[blocks * cp:])
            self._load_chains.pop(req_id)
            self._finished_recving.add(req_id)
        self._loads.clear()

    def save_kv_layer(self, layer_name: str, kv_layer=None, attn_metadata=None, **kwargs):
        """Called after each layer's attention wrote its KV. Tutti stores all
        layers of a block in one run, so the saves of this step start once the
        last layer has been written."""
        layer = self.layer_index(layer_name)
        if layer != self.geometry.layers - 1 or self._saves_started:
            return
        self._saves_started = True
        meta = self._meta or ConnectorMetadata()
        if meta.saves:
            self._device_sync()
        for req in meta.saves:
            chain = self.chain_of(req)
            if not chain:
                continue
            self._saves[req.req_id] = self.store.save(chain, self._pages_for(req, len(chain)))

    def wait_for_save(self):
        """Blocks until every save of this step has copied its pages out, so
        the engine may reuse them. Durability is later (``store.wait_saves``)."""
        if self._meta is not None and self._meta.saves and not self._saves_started:
            # The forward never reached the last layer's save_kv_layer (e.g. a
            # caller that does not call it): start the saves now.
            self.save_kv_layer(next(n for n, i in self._layer_index.items() if i == self.geometry.layers - 1))
        for req_id, sv in list(self._saves.items()):
            sv.wait_gathered()
            sv.release()
            self._finished_sending.add(req_id)
        self._saves.clear()

    def get_finished(self, finished_req_ids=()):
        """(finished sending, finished receiving) request ids since the last
        call, each None when empty (vLLM's convention)."""
        self._finish_loads()
        s, r = self._finished_sending, self._finished_recving
        self._finished_sending, self._finished_recving = set(), set()
        return (s or None), (r or None)

    def get_block_ids_with_load_errors(self):
        """Page ids that were asked for but not restored (to recompute)."""
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self):
        for ld in self._loads.values():
            ld.release()
        for sv in self._saves.values():
            sv.release()
        self._loads.clear()
        self._saves.clear()
