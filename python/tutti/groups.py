"""Several KV cache groups per chain block: the rules (one home) and the store
over them (hybrid models, as vLLM's hybrid KV cache manager hands them).

A hybrid model's layers fall into groups, each with its own block table and
page shape: full attention, sliding-window attention (a window of W tokens),
and recurrent state (Mamba, linear attention: vLLM's ``MambaSpec``). Every
group shares the request's chain keys (:mod:`tutti.keys`, one key per chain
block of B tokens). Each group lives in a store of its own (its own
geometry: layers, heads, page bytes, a state's size) under ``g<i>`` of the
hybrid store's directory, so one I/O per (layer or state, run) and device
holds in each; ``groups.json`` there names the format (:data:`FORMAT`) and the
groups, and a directory holding other groups or another format is refused.
A model of one group needs none of this: its store is a plain store, as
before (a store of one group keeps working).

What each group keeps, and what a hit at chain block ``n`` (the first
``n`` blocks computed, the engine's own first ``skip`` of them) needs:

``full``      every block, keyed as one chain from block 0 (a plain store);
              a hit needs blocks ``[0, n)``, loads ``[skip, n)``.
``sliding``   k = max(1, ceil((W - 1) / B)) blocks (vLLM's
              ``SlidingWindowManager`` rule) in *segments*: segment s holds
              blocks ``[s*k, (s+1)*k)`` keyed as a chain rooted at block s*k,
              so a window never depends on blocks far before it (the engine
              frees those) and spans at most two segments (two runs). A hit
              needs ``[max(0, n-k), n)`` (with the segment's blocks before
              it, which the segment's root keys); it loads
              ``[max(skip, n-k), n)``: only the window of the tokens computed
              next. A segment is saved whole in the step it completes (its
              first block is still allocated then: the engine frees a block
              only once the window of the next token has passed it), or, the
              tail segment, once the prompt's last full block is computed; a
              partial segment is never saved mid-prompt, so no save waits on
              another of the same segment.
``state``     the recurrent state after block j (the state of tokens
              ``[0, (j+1)*B)``), one page per layer, keyed by block j's key
              alone: saved where the engine holds it, at the block boundary a
              step ends on (vLLM's ``mamba_cache_mode="align"`` puts it in
              block j of the group's table); a hit needs it at ``n-1`` and
              loads that one page per layer.

A block is a hit only when every group's part of it is there:
:meth:`HybridStore.match` takes the full groups' hit, then the largest
``n`` within it where every sliding group's window and every state group's
state are stored.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from . import _args

FORMAT = "tutti-groups-v1"
MANIFEST = "groups.json"
KINDS = ("full", "sliding", "state")
NULL_BLOCK = 0  # vLLM's null block (BlockPool.null_block): no page behind it
MAX_GROUPS = 64


@dataclass(frozen=True)
class GroupRule:
    """One KV cache group's rule (see the module doc). ``window_tokens``:
    the sliding window (kind "sliding" only); ``block_tokens``: B."""

    kind: str
    block_tokens: int
    window_tokens: int = 0

    def __post_init__(self):
        _args.choice("GroupRule.kind", self.kind, KINDS)
        _args.integer("GroupRule.block_tokens", self.block_tokens, 1)
        if self.kind == "sliding":
            _args.integer("GroupRule.window_tokens", self.window_tokens, 1)
        elif self.window_tokens:
            raise ValueError(f"GroupRule.window_tokens = {self.window_tokens}: only a sliding group has a window")

    @property
    def k(self) -> int:
        """Blocks a sliding window needs before a hit (vLLM's rule), the
        segment length; 0 for other kinds."""
        if self.kind != "sliding":
            return 0
        return max(1, -(-(self.window_tokens - 1) // self.block_tokens))

    def hit_ranges(self, n: int, skip: int) -> List[Tuple[int, int, int]]:
        """What a hit at ``n`` (the engine holding ``[0, skip)``) reads of this
        group: ``(root, first, end)`` per run: the keys ``chain[root:end]``
        (a chain of the group's store), of which ``[first, end)`` are loaded
        (``first - root`` skipped). Every block of ``chain[root:end]`` must
        be stored for the hit."""
        if not 0 <= skip < n:
            return []
        if self.kind == "full":
            return [(0, skip, n)]
        if self.kind == "state":
            return [(n - 1, n - 1, n)]
        k = self.k
        a = max(skip, n - k)
        out = []
        for s in range(a // k, (n - 1) // k + 1):
            root = s * k
            out.append((root, max(a, root), min(n, root + k)))
        return out

    def staging_tokens(self, tokens: int) -> int:
        """The tokens of a request of ``tokens`` tokens this group's blocks
        move at most in one load or save (host staging's pool is sized by
        it): every block (full), two segments of k blocks (sliding), one
        block (state)."""
        if self.kind == "full":
            return tokens
        if self.kind == "state":
            return self.block_tokens
        return min(tokens, 2 * self.k * self.block_tokens)

    def needed(self, n: int, skip: int = 0) -> List[Tuple[int, int]]:
        """``(root, end)`` per run that must be stored for a hit at ``n``
        over the engine's own ``[0, skip)``."""
        return [(r, e) for r, _, e in self.hit_ranges(n, skip)]

    def save_ranges(self, saved: int, full: int, prompt_blocks: int, computed_tokens: int) -> List[Tuple[int, int]]:
        """What a step that brought a request's computed full prompt blocks
        from ``saved`` to ``full`` (of ``prompt_blocks``; ``computed_tokens``
        after the step) saves of this group: ``(root, end)`` per save, the
        keys ``chain[root:end]`` from the same entries of the group's block
        table."""
        if full <= saved:
            return []
        if self.kind == "full":
            return [(0, full)]
        if self.kind == "state":
            b = self.block_tokens
            return [(full - 1, full)] if computed_tokens == full * b else []
        k, out = self.k, []
        for s in range(saved // k, -(-full // k)):
            root, end = s * k, min((s + 1) * k, full)
            if end == root + k and end > saved:
                out.append((root, end))  # completed in this step
            elif end == full == prompt_blocks and end > saved:
                out.append((root, end))  # the prompt's tail segment
        return out


def capacity_shares(capacity_bytes: int, block_bytes: Sequence[int]) -> List[int]:
    """One rank's ``capacity_bytes`` (the hybrid store's, as a plain store's
    is: every group's store preallocates its own share) split over the
    groups in proportion to ``block_bytes[i]``, group i's bytes of one chain
    block (its layers' pages), so every group holds about as many blocks.
    Raises ValueError when a share would be empty."""
    capacity_bytes = _args.integer("capacity_bytes", capacity_bytes, 1)
    w = [_args.integer(f"block_bytes[{i}]", b, 1) for i, b in enumerate(block_bytes)]
    if not 1 <= len(w) <= MAX_GROUPS:
        raise ValueError(f"{len(w)} KV cache groups: want 1..{MAX_GROUPS}")
    total = sum(w)
    out = [capacity_bytes * b // total for b in w]
    if min(out) < 1:
        raise ValueError(f"capacity_bytes = {capacity_bytes}: too small for {len(w)} KV cache groups of {w} bytes a "
                         f"block")
    return out


def rules_of(kinds: Sequence[dict], block_tokens: int) -> List[GroupRule]:
    """GroupRules from ``[{"kind": ..., "window_tokens": ...}, ...]``."""
    if not 1 <= len(kinds) <= MAX_GROUPS:
        raise ValueError(f"{len(kinds)} KV cache groups: want 1..{MAX_GROUPS}")
    return [GroupRule(d["kind"], block_tokens, int(d.get("window_tokens", 0))) for d in kinds]


# ---------------------------------------------------------------- the format


def manifest(rules: Sequence[GroupRule], tags: Sequence[str]) -> dict:
    """The ``groups.json`` of a store of these groups (``tags[i]``: group i's
    physical page shape, e.g. a KVLayout tag and geometry)."""
    if len(tags) != len(rules):
        raise ValueError(f"{len(tags)} tags for {len(rules)} groups")
    return {"format": FORMAT, "groups": [dict(asdict(r), tag=t) for r, t in zip(rules, tags)]}


def group_dir(d: str, i: int) -> str:
    return os.path.join(d, f"g{i}")


def ensure_manifest(d: str, want: dict) -> List[str]:
    """Writes ``want`` as ``d``/groups.json, or checks the one there is the
    same; returns the groups' directories (made). Raises ValueError naming
    what differs: another format (a newer tutti's, or not tutti's), other
    groups."""
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, MANIFEST)
    try:
        with open(p) as f:
            have = json.load(f)
    except FileNotFoundError:
        have = None
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: unreadable ({e}); a hybrid store's groups.json is refused, never rewritten") from e
    if have is None:
        ours = {MANIFEST} | {os.path.basename(group_dir(d, i)) for i in range(len(want["groups"]))}
        other = sorted(x for x in os.listdir(d) if x not in ours and not x.startswith(MANIFEST + ".tmp"))
        if other:  # the groups' own directories may be there (made before the first write, or a crash between)
            raise ValueError(f"{d}: holds {other[:4]} but no {MANIFEST}: not a hybrid store of format {FORMAT}")
        tmp = p + f".tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(want, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    elif not isinstance(have, dict) or have.get("format") != FORMAT:
        raise ValueError(f"{p}: format {have.get('format') if isinstance(have, dict) else have!r}, this tutti reads "
                         f"{FORMAT}")
    elif have.get("groups") != want["groups"]:
        raise ValueError(f"{p}: holds groups {have.get('groups')}, the engine's are {want['groups']}")
    out = []
    for i in range(len(want["groups"])):
        g = group_dir(d, i)
        os.makedirs(g, exist_ok=True)
        out.append(g)
    return out


# ------------------------------------------------------------------ the store


class HybridHold:
    """What :meth:`HybridStore.match` promised: ``blocks`` after ``skip``,
    every group's part pinned until :meth:`release`."""

    def __init__(self, blocks: int, holds):
        self.blocks = blocks
        self._holds = list(holds)

    def release(self):
        holds, self._holds = self._holds, []
        for h in holds:
            h.release()


class HybridStore:
    """One store per group (``stores[i]``, opened by the caller, each a
    :class:`tutti.Store` of its group's geometry), matched as one: a block is
    a hit only when every group's part of it is there. Attach each group's
    store with :meth:`attach` (the worker opens them as it learns each
    group's tensors); :meth:`match` needs them all."""

    def __init__(self, rules: Sequence[GroupRule]):
        self.rules = list(rules)
        bt = {r.block_tokens for r in self.rules}
        if len(bt) != 1:
            raise ValueError(f"groups of {sorted(bt)} tokens per block: tutti keys every group by one chain")
        self.block_tokens = bt.pop()
        self.stores: List[Optional[object]] = [None] * len(self.rules)
        self._lock = threading.Lock()
        self.counters: Dict[str, int] = {}

    def attach(self, i: int, store):
        if self.stores[i] is not None:
            raise RuntimeError(f"group {i}: a store is attached already")
        self.stores[i] = store

    @property
    def closed(self) -> bool:
        return any(s is None or s.closed for s in self.stores)

    def _need(self):
        if any(s is None for s in self.stores):
            missing = [i for i, s in enumerate(self.stores) if s is None]
            raise RuntimeError(f"hybrid store: groups {missing} have no store attached yet")
        return self.stores

    def _stored(self, i: int, chain: Sequence[int], n: int, skip: int) -> bool:
        st = self.stores[i]
        return all(st.lookup(chain[r:e]) >= e - r for r, e in self.rules[i].needed(n, skip))

    def hit(self, chain: Sequence[int], skip: int, upto: int) -> int:
        """The largest n in (skip, upto] at which every non-full group's part
        is stored, else ``skip`` (the full groups' part up to ``upto`` is the
        caller's to know)."""
        others = [i for i, r in enumerate(self.rules) if r.kind != "full"]
        for n in range(upto, skip, -1):
            if all(self._stored(i, chain, n, skip) for i in others):
                return n
        return skip

    def lookup(self, chain: Sequence[int]) -> int:
        """Leading blocks of ``chain`` that are a hit in every group."""
        stores = self._need()
        upto = min([s.lookup(chain) for s, r in zip(stores, self.rules) if r.kind == "full"] or [len(chain)])
        return self.hit(chain, 0, upto)

    def match(self, chain: Sequence[int], skip: int = 0, ttl_ms: int = 30000) -> HybridHold:
        """:meth:`tutti.Store.match` over every group: the full groups' hit
        (their planner's say included), cut to where every other group's
        part is stored; each group's part of it is pinned."""
        stores = self._need()
        holds, upto = [], len(chain)
        try:
            for st, r in zip(stores, self.rules):
                if r.kind == "full":
                    h = st.match(chain, skip, ttl_ms)
                    holds.append(h)
                    upto = min(upto, skip + h.blocks)
            n = self.hit(chain, skip, upto)
            if n > skip:
                for i, r in enumerate(self.rules):
                    if r.kind == "full":
                        continue
                    for root, end in r.needed(n, skip):
                        # The pin only (a sliding window's or a state's blocks
                        # are loaded as promised: the planner's split is the
                        # full groups', which hold the bulk of the bytes).
                        holds.append(stores[i].match(chain[root:end], 0, ttl_ms))
                if not all(self._stored(i, chain, n, skip) for i, r in enumerate(self.rules) if r.kind != "full"):
                    n = skip  # evicted between the lookup and the pin: a miss now, never a promise not kept
                    self._count("match_raced")
            return HybridHold(n - skip, holds)
        except BaseException:
            for h in holds:
                h.release()
            raise

    def _count(self, k: str):
        with self._lock:
            self.counters[k] = self.counters.get(k, 0) + 1

    def wait_saves(self):
        for s in self._need():
            s.wait_saves()

    def close(self):
        for s in self.stores:
            if s is not None:
                s.close()
