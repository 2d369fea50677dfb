"""KV events an engine takes from its stores (``Store(kv_events="engine")``)
and publishes itself, engine-neutral (docs/routers.md):

``decode(payload) -> list[dict]``
    One :meth:`tutti.Store.take_kv_events` payload as vLLM 0.26's event
    fields: ``{"type": "BlockStored", "block_hashes": [...], ...}`` with the
    keys vLLM's structs have (those at their default left out), extra_keys
    entries as tuples. Reads msgpack with msgspec (vLLM's dependency) or,
    where that is missing, msgpack.

``CommonBlocks(ranks)``
    What a router may be told when a block's KV is split over tensor-parallel
    ranks, each rank's store holding its share: a block is stored once EVERY
    rank's store holds it, removed once one of them no longer does.
    ``add(rank, events)`` takes one rank's events in its store's order (its
    takes may arrive in any step: saves commit on each rank at its own pace);
    ``take()`` returns the events to publish since the last call, one
    BlockStored per run of blocks that became whole (parents first), one
    BlockRemoved per run of blocks that stopped being. A rank's
    AllBlocksCleared (its store's first take, or the first after its queue
    overflowed) means "this rank's blocks are the ones that follow": blocks
    it no longer lists are removed, none is published twice, and the event
    itself is never passed on (a router would drop the engine's other tiers
    with it). At most ``max_blocks`` blocks are tracked; past it a block is
    never published (``counters["untracked_blocks"]``).
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional

# Blocks tracked by default: about 100 bytes each while published, a block's
# token ids more until every rank holds it.
MAX_BLOCKS = 1 << 21

_unpack = None


def _unpacker():
    global _unpack
    if _unpack is None:
        try:
            import msgspec
            _unpack = msgspec.msgpack.Decoder().decode
        except ImportError:
            try:
                import msgpack
            except ImportError as e:
                raise ImportError("decoding tutti's KV events needs msgspec (vLLM installs it) or msgpack") from e
            _unpack = lambda b: msgpack.unpackb(b, raw=False, strict_map_key=False)  # noqa: E731
    return _unpack


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def decode(payload: bytes) -> List[dict]:
    """The events of one take, as field dicts (see the module doc)."""
    events = _unpacker()(payload)
    if not isinstance(events, list) or not all(isinstance(e, dict) and "type" in e for e in events):
        raise ValueError("tutti KV events: a take is not an array of vLLM 0.26 event maps (was the store opened "
                         "with format=vllm-0.11?)")
    for e in events:
        if e.get("extra_keys") is not None:
            e["extra_keys"] = [_tuples(x) for x in e["extra_keys"]]
    return events


def split_stored(ev: dict) -> List[dict]:
    """A BlockStored of n blocks as n one-block events, each with its parent."""
    hashes = ev["block_hashes"]
    if len(hashes) == 1:
        return [ev]
    toks, bs, extra = ev.get("token_ids") or [], ev.get("block_size", 0), ev.get("extra_keys")
    out, parent = [], ev.get("parent_block_hash")
    for i, h in enumerate(hashes):
        one = dict(ev, block_hashes=[h], parent_block_hash=parent,
                   token_ids=list(toks[i * bs:(i + 1) * bs]) if toks else [])
        if extra is not None:
            one["extra_keys"] = [extra[i]]
        out.append(one)
        parent = h
    return out


def _style(ev: dict):
    return tuple(ev.get(k) for k in ("medium", "locality", "group_idx"))


def _joinable(a: dict, b: dict) -> bool:
    """b continues a's run: b's parent is a's last block, and everything but
    the blocks is alike."""
    if b.get("parent_block_hash") != a["block_hashes"][-1]:
        return False
    same = ("medium", "locality", "group_idx", "lora_id", "lora_name", "block_size")
    return (all(a.get(k) == b.get(k) for k in same) and bool(a.get("token_ids")) == bool(b.get("token_ids"))
            and (a.get("extra_keys") is None) == (b.get("extra_keys") is None))


class CommonBlocks:
    """See the module doc. Not thread-safe: one caller (vLLM's scheduler)."""

    def __init__(self, ranks: int, max_blocks: int = MAX_BLOCKS):
        if ranks < 1 or ranks > 64:
            raise ValueError(f"ranks = {ranks}, want 1..64")
        self.ranks, self.max_blocks = ranks, max_blocks
        self._full = (1 << ranks) - 1
        self._mask: Dict[object, int] = {}  # block hash -> ranks holding it
        self._pending: Dict[object, dict] = {}  # the one-block event of a block not every rank holds yet
        self._last_style: Dict[int, tuple] = {}  # a rank's medium, locality, group (for removals it did not send)
        self._out: List[dict] = []
        self.counters = Counter()

    def add(self, rank: int, events: List[dict]):
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} of {self.ranks}")
        bit = 1 << rank
        lost: Optional[Dict[object, bool]] = None  # published blocks this rank's listing has yet to show
        for ev in events:
            t = ev.get("type")
            if t == "AllBlocksCleared":
                lost = self._clear(bit, lost)
            elif t == "BlockStored":
                self._last_style[rank] = _style(ev)
                for one in split_stored(ev):
                    self._stored(bit, one, lost)
            elif t == "BlockRemoved":
                self._last_style[rank] = _style(ev)
                for h in ev["block_hashes"]:
                    self._removed(bit, h, _style(ev))
            else:
                raise ValueError(f"tutti KV events: unknown event type {t!r}")
        for h in reversed(list(lost or ())):  # children were tracked after their parents
            self._emit_removed(h, self._last_style.get(rank, (None, None, None)))

    def _clear(self, bit: int, lost):
        lost = {} if lost is None else lost
        for h, m in list(self._mask.items()):
            if not m & bit:
                continue
            if m == self._full:
                lost[h] = True
            m &= ~bit
            if m:
                self._mask[h] = m
            else:
                del self._mask[h]
                self._pending.pop(h, None)
        return lost

    def _stored(self, bit: int, one: dict, lost):
        h = one["block_hashes"][0]
        m = self._mask.get(h)
        if m is None:
            if len(self._mask) >= self.max_blocks:
                self.counters["untracked_blocks"] += 1
                return
            m = 0
        if m & bit:  # a store stores a block again only after removing it
            self.counters["duplicate_stores"] += 1
            return
        m |= bit
        self._mask[h] = m
        if m != self._full:
            kept = self._pending.get(h)
            if kept is None or (not kept.get("token_ids") and one.get("token_ids")):
                self._pending[h] = one  # a rank that kept the token ids wins
            return
        kept = self._pending.pop(h, None)
        if kept is not None and (kept.get("token_ids") or not one.get("token_ids")):
            one = kept
        if lost is not None and lost.pop(h, None):
            return  # published before this rank's listing, still whole
        self.counters["stored_blocks"] += 1
        if self._out and self._out[-1]["type"] == "BlockStored" and _joinable(self._out[-1], one):
            last = self._out[-1]
            last["block_hashes"] = last["block_hashes"] + one["block_hashes"]
            last["token_ids"] = last["token_ids"] + one["token_ids"]
            if last.get("extra_keys") is not None:
                last["extra_keys"] = last["extra_keys"] + one["extra_keys"]
        else:
            self._out.append(dict(one))

    def _removed(self, bit: int, h, style):
        m = self._mask.get(h)
        if m is None or not m & bit:
            self.counters["unknown_removes"] += 1
            return
        if m & ~bit:
            self._mask[h] = m & ~bit
        else:
            del self._mask[h]
            self._pending.pop(h, None)
        if m == self._full:
            self._emit_removed(h, style)

    def _emit_removed(self, h, style):
        self.counters["removed_blocks"] += 1
        last = self._out[-1] if self._out else None
        if last is not None and last["type"] == "BlockRemoved" and _style(last) == style:
            last["block_hashes"].append(h)
            return
        ev = {"type": "BlockRemoved", "block_hashes": [h], "medium": style[0]}
        if style[2] is not None:
            ev["group_idx"] = style[2]
        if style[1] is not None:
            ev["locality"] = style[1]
        self._out.append(ev)

    def take(self) -> List[dict]:
        out, self._out = self._out, []
        return out

    def blocks(self) -> int:
        """Blocks tracked (held by at least one rank)."""
        return len(self._mask)
