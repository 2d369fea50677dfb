"""The scheduler side of a KV connector, engine-neutral: what runs where the
engine decides, per step, what each request computes (vLLM's EngineCore).

API:

``SchedulerSide(matcher, block_tokens, chunk_pages=1, rules=None, async_loads=False)``
    ``rules``: the KV cache groups' :class:`tutti.groups.GroupRule` (a
    hybrid model: block ids then come per group, a tuple of lists, and each
    load and save is per group and run, ``LoadSpec.group``; the matcher is
    a :class:`tutti.groups.HybridStore`'s). None: one group.
    ``async_loads`` (one group only): True: hits load in the background,
    beside the engine's steps; "auto": only while the engine has other live
    requests (alone, a load inside its step overlaps the request's own
    compute layer by layer, which a background load cannot);
    ``background(req_id)`` says so of a lookup's hit, and
    ``recv_ended(req_ids)`` takes the worker's reports of their ends.
    * ``get_num_new_matched_tokens(req_id, chain, num_tokens, num_computed_tokens) -> int | None``:
      tokens beyond the engine's local hits (``num_computed_tokens``, whole
      blocks) that tutti promises to restore; ``chain`` keys the prompt's
      full blocks only (:mod:`tutti.keys`), so a hit never covers more than
      the prompt; a hit reaching ``num_tokens`` leaves the last token to
      compute. ``None``: the answer is not in yet (a matcher that asks other
      processes), ask again later. The matcher holds what it promised
      (pinned, with a lease) so it is still there when the worker loads it; a
      second call for the same request replaces the first.
    * ``update_state_after_alloc(req_id, block_ids, num_external_tokens)``:
      ``block_ids`` are ALL of the request's blocks, local hits first; the load
      goes into the blocks after the local hits.
    * ``build_meta(step) -> StepMeta``: the loads queued since the last call,
      the saves decided from the step, and which requests ended (``step`` is
      scheduler-output shaped: ``scheduled_new_reqs`` with ``req_id``,
      ``block_ids``, ``num_computed_tokens``; ``scheduled_cached_reqs`` with
      ``req_ids``, ``new_block_ids``, ``num_computed_tokens`` and
      ``resumed_req_ids`` or ``resumed_from_preemption``;
      ``num_scheduled_tokens``; ``finished_req_ids``; ``preempted_req_ids``
      where the engine has them). A request's prompt blocks are saved as they
      are computed: each step that completes full prompt blocks saves the
      chain up to the last of them (a long prompt computed in chunks is
      durable chunk by chunk; decode tokens are not saved).
    * ``track(req_id, chain, request=, tokens_of=, hashes_of=)``: a request
      to save for (from its lookup).
    * ``untrack(req_id)``: saves no more of the request.
    * ``request_finished(req_id) -> bool``: always False: the blocks of a
      finished request are freed at once; its saves go on reading them on
      the workers until a step writes one of them afresh
      (``StepMeta.finished``, ``StepMeta.reused``), or are ended at the next
      step's start for a hybrid model (``StepMeta.ended``).
    * ``counters``: lookups (answered), lookups_deferred, hit tokens,
      promised blocks, save blocks, fallbacks by reason.

Matchers: ``match(req_id, chain, skip) -> blocks`` (blocking) or
``query(req_id, chain, skip) -> blocks | None`` (not blocking: None until
answered), ``release(req_id)``. :class:`LocalMatcher` over a store of this
process (the worker's, when the engine runs both roles in one process), and
:class:`tutti.lookup_service.RemoteMatcher` over the ranks' worker processes.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from . import _args
from .groups import NULL_BLOCK, GroupRule
from .store import Hold, Store
from .worker_side import LoadSpec, SaveSpec

MAX_ASYNC_LOADS = 64  # background loads the scheduler has in flight; beyond, a hit loads inside its step


@dataclass
class StepMeta:
    """What the scheduler hands every worker for one step (plain data: it is
    pickled across processes)."""

    loads: List[LoadSpec] = field(default_factory=list)
    saves: List[SaveSpec] = field(default_factory=list)
    # Requests whose blocks may be reused from this step on: finished or
    # preempted (their queued saves are handed over first), or resumed after
    # a preemption the engine did not report (their queued saves are dropped).
    ended: List[str] = field(default_factory=list)
    dropped: List[str] = field(default_factory=list)
    # A model of one KV group: its finished requests, whose blocks keep their
    # KV until allocated again, and the blocks this step writes afresh (its
    # allocations beyond local hits, and its loads'): a finished request's
    # saves end once a block they read is among them (WorkerSide.end_requests).
    finished: List[str] = field(default_factory=list)
    reused: List[int] = field(default_factory=list)


class LocalMatcher:
    """Matches against a store open in this process; one hold per request."""

    def __init__(self, store: Store, ttl_ms: int = 30000):
        self.store, self.ttl_ms = store, ttl_ms
        self._lock = threading.Lock()
        self._holds: Dict[str, Hold] = {}

    def match(self, req_id: str, chain: Sequence[int], skip: int) -> int:
        h = self.store.match(chain, skip, self.ttl_ms)
        with self._lock:
            old = self._holds.pop(req_id, None)
            if h.blocks:
                self._holds[req_id] = h
        if old is not None:
            old.release()
        if not h.blocks:
            h.release()
        return h.blocks

    def release(self, req_id: str):
        with self._lock:
            h = self._holds.pop(req_id, None)
        if h is not None:
            h.release()

    def close(self):
        with self._lock:
            holds, self._holds = list(self._holds.values()), {}
        for h in holds:
            h.release()


@dataclass
class _Tracker:
    """One request the scheduler saves for."""

    chain: List[int]  # keys of the prompt's full blocks
    request: object = None  # the engine's request (for tokens_of / hashes_of)
    tokens_of: object = None  # callable(request) -> token ids, for KV events (None: not published)
    hashes_of: object = None  # callable(request) -> the engine's hash bytes per block, or None
    block_ids: List[int] = field(default_factory=list)  # per group (a list of lists) with rules
    computed: int = 0  # tokens computed once the step runs
    saved: int = 0  # chain blocks handed to a save so far
    local: Optional[int] = None  # the engine's own hit (tokens) at its last lookup; None: not looked up


@dataclass
class _Pending:
    chain: List[int]
    skip: int
    blocks: int
    background: bool = False  # the load runs beside the engine's steps (LoadSpec.background)


class SchedulerSide:
    def __init__(self, matcher, block_tokens: int, chunk_pages: int = 1, rules: Optional[Sequence[GroupRule]] = None,
                 async_loads=False, loads: bool = True, saves: bool = True):
        """``async_loads`` (False, True or "auto"): a hit of a model of one KV
        group is loaded in the background (:meth:`background`; "auto": while
        another request is live), at most MAX_ASYNC_LOADS at once (beyond:
        inside its step, counted ``loads_async_cap``). ``loads``, ``saves``:
        False makes every lookup a miss (vLLM's kv_role "kv_producer"), or
        builds no save (kv_role "kv_consumer")."""
        if not callable(getattr(matcher, "release", None)) or not (callable(getattr(matcher, "match", None))
                                                                   or callable(getattr(matcher, "query", None))):
            raise TypeError(f"matcher = {matcher!r}: want an object with match (or query) and release")
        self.matcher = matcher
        self.block_tokens = _args.integer("block_tokens", block_tokens, 1)
        self.chunk_pages = _args.integer("chunk_pages", chunk_pages, 1)
        self.rules = list(rules) if rules is not None and len(rules) > 1 else None
        if self.rules is not None and (self.chunk_pages != 1 or any(r.block_tokens != self.block_tokens for r in self.rules)):
            raise ValueError(f"KV cache groups {self.rules}: every group must have {self.block_tokens} tokens per block, "
                             f"one page per chain block")
        self._pending: Dict[str, _Pending] = {}
        self._loads: List[LoadSpec] = []
        self._trackers: Dict[str, _Tracker] = {}
        if not (isinstance(async_loads, bool) or async_loads == "auto"):
            raise ValueError(f"async_loads = {async_loads!r}: want False, True or 'auto'")
        self._async = async_loads if self.rules is None else False
        self._recving: set = set()  # requests whose background load has not been reported ended
        self._loads_on = _args.boolean("loads", loads)
        self._saves_on = _args.boolean("saves", saves)
        self.counters = Counter()

    # -- lookup
    def get_num_new_matched_tokens(self, req_id: str, chain: Sequence[int], num_tokens: int,
                                   num_computed_tokens: int) -> Optional[int]:
        bt = self.block_tokens
        tr = self._trackers.get(req_id)
        if tr is not None:
            tr.local = num_computed_tokens
        skip = num_computed_tokens // bt
        if self.rules is not None:
            # Whole blocks short of the last token, as vLLM's own hits of
            # hybrid models: a recurrent state is kept at block ends only, so
            # a hit that left part of its last block to compute would resume
            # from the state after the whole block; the groups' parts are
            # matched at the hit's end.
            chain = chain[:max(0, num_tokens - 1) // bt]
        if num_computed_tokens % bt or skip >= len(chain) or not self._loads_on:
            self._forget(req_id)
            self._count_lookup(num_tokens, num_computed_tokens)
            return 0
        try:
            query = getattr(self.matcher, "query", None)
            blocks = query(req_id, list(chain), skip) if query is not None else self.matcher.match(req_id, list(chain), skip)
        except Exception as e:  # an unreachable or slow worker is a miss, counted, never a failed request
            self.counters[f"fallback:{type(e).__name__}"] += 1
            blocks = 0
        if blocks is None:
            self.counters["lookups_deferred"] += 1
            return None
        self._count_lookup(num_tokens, num_computed_tokens)
        blocks = min(int(blocks), len(chain) - skip)  # chain is the prompt's: never past it
        if blocks <= 0:
            self._forget(req_id)
            return 0
        tokens = blocks * bt
        if num_computed_tokens + tokens >= num_tokens:
            tokens = num_tokens - 1 - num_computed_tokens  # the engine computes the last token (its logits)
            if tokens <= 0:
                self._forget(req_id)
                return 0
        want = self._async is True or (self._async == "auto" and len(self._trackers) > (req_id in self._trackers))
        background = want and len(self._recving) < MAX_ASYNC_LOADS
        if want and not background:
            self.counters["loads_async_cap"] += 1
        self._pending[req_id] = _Pending(list(chain[:skip + blocks]), skip, blocks, background)
        return tokens

    def background(self, req_id: str) -> bool:
        """Whether the hit the last lookup of req_id found is loaded in the
        background: the engine then waits for the load's end, reported by
        the worker (StepResult.recving, given to :meth:`recv_ended`), before
        it computes the request."""
        p = self._pending.get(req_id)
        return p is not None and p.background

    def recv_ended(self, req_ids):
        """The worker reported these background loads ended."""
        self._recving.difference_update(req_ids)

    def _count_lookup(self, num_tokens: int, num_computed_tokens: int):
        self.counters["lookups"] += 1
        self.counters["lookup_tokens"] += max(0, num_tokens - num_computed_tokens)

    def _forget(self, req_id: str):
        """No hit now: drop what an earlier lookup of the request promised."""
        if self._pending.pop(req_id, None) is not None:
            self.matcher.release(req_id)

    def update_state_after_alloc(self, req_id: str, block_ids: Sequence[int], num_external_tokens: int):
        p = self._pending.pop(req_id, None)
        if num_external_tokens <= 0 or p is None:
            if p is not None:
                self.matcher.release(req_id)
            return
        # Counted here, once: vLLM asks a waiting request's lookup again each step until it is allocated.
        self.counters["hit_tokens"] += num_external_tokens
        if self.rules is not None:
            self._loads.extend(self._group_loads(req_id, p, block_ids))
            self.counters["promised_blocks"] += p.blocks
            return
        cp = self.chunk_pages
        ids = [int(b) for b in block_ids[p.skip * cp:(p.skip + p.blocks) * cp]]
        if len(ids) != p.blocks * cp:
            raise ValueError(f"request {req_id!r}: {len(block_ids)} blocks allocated, the load needs blocks "
                             f"[{p.skip * cp}, {(p.skip + p.blocks) * cp})")
        self._loads.append(LoadSpec(req_id, p.chain, p.skip, ids, background=p.background))
        if p.background:
            self._recving.add(req_id)
        self.counters["promised_blocks"] += p.blocks

    def _group_loads(self, req_id: str, p: "_Pending", block_ids) -> List[LoadSpec]:
        """A hybrid request's load: per group, the runs its rule reads for a
        hit at skip + blocks (tutti.groups)."""
        groups = _groups(block_ids, len(self.rules))
        n, out = p.skip + p.blocks, []
        for g, rule in enumerate(self.rules):
            ids = groups[g]
            for root, first, end in rule.hit_ranges(n, p.skip):
                b = [int(x) for x in ids[first:end]]
                if len(b) != end - first or NULL_BLOCK in b:
                    raise ValueError(f"request {req_id!r}: KV cache group {g} ({rule.kind}) has block ids {b} for "
                                     f"chain blocks [{first}, {end}): the load needs a page for each")
                out.append(LoadSpec(_run_id(req_id, rule, g, root), list(p.chain[root:end]), first - root, b, group=g,
                                    copy_to=_state_runs_in(rule, ids, end)))
        return out

    # -- saves
    def track(self, req_id: str, chain: Sequence[int], request=None, tokens_of=None, hashes_of=None):
        """Starts tracking a request for saves (call from the lookup):
        ``chain`` keys its prompt's full blocks (a longer chain, a streaming
        session's grown prompt, replaces it). ``tokens_of`` and ``hashes_of``
        (callables of ``request``) give what a store publishing KV events
        publishes with the saved blocks."""
        tr = self._trackers.get(req_id)
        if tr is None:
            self._trackers[req_id] = _Tracker(list(chain), request, tokens_of, hashes_of)
        elif len(chain) > len(tr.chain):
            tr.chain = list(chain)

    def untrack(self, req_id: str):
        """Stops saving for a request (what it computes from now on is not
        to be kept) and drops what its lookup promised."""
        self._trackers.pop(req_id, None)
        self._forget(req_id)

    def build_meta(self, step) -> StepMeta:
        meta = StepMeta(loads=self._loads)
        self._loads = []
        sched = getattr(step, "num_scheduled_tokens", {}) or {}
        fresh: List[int] = []  # blocks the step allocated (models of one group)
        for nr in getattr(step, "scheduled_new_reqs", ()) or ():
            tr = self._trackers.get(nr.req_id)
            if tr is not None:
                tr.block_ids, tr.saved = self._ids(nr.block_ids), 0
                tr.computed = nr.num_computed_tokens + sched.get(nr.req_id, 0)
            if self.rules is None and nr.block_ids is not None:
                # the engine's own hit is read, never written: the rest is fresh (all, for a request not looked up)
                local = tr.local if tr is not None and tr.local is not None else 0
                fresh.extend(_group0(nr.block_ids)[local // self.block_tokens * self.chunk_pages:])
        cached = getattr(step, "scheduled_cached_reqs", None)
        if cached is not None:
            resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
            flags = getattr(cached, "resumed_from_preemption", None)
            for i, rid in enumerate(cached.req_ids):
                new = cached.new_block_ids[i]
                if self.rules is None and new is not None:
                    fresh.extend(_group0(new))
                if rid in resumed or (flags is not None and flags[i]):
                    meta.dropped.append(rid)  # anything queued from its pages before the preemption is stale
                    tr = self._trackers.get(rid)
                    if tr is not None:
                        tr.block_ids, tr.saved = self._ids(new), 0
                else:
                    tr = self._trackers.get(rid)
                    if tr is not None and new is not None:
                        if self.rules is None:
                            tr.block_ids.extend(_group0(new))
                        else:
                            for have, more in zip(tr.block_ids, _groups(new, len(self.rules))):
                                have.extend(more)
                if tr is not None:
                    tr.computed = cached.num_computed_tokens[i] + sched.get(rid, 0)
        finished = set(getattr(step, "finished_req_ids", ()) or ())
        preempted = set(getattr(step, "preempted_req_ids", None) or ())
        if self.rules is None:
            meta.ended, meta.finished = sorted(preempted), sorted(finished - preempted)
            meta.reused = [int(b) for b in fresh] + [int(b) for ld in meta.loads for b in ld.block_ids]
        else:  # other groups' blocks are freed while their request runs: their saves end in the step
            meta.ended = sorted(finished | preempted)
        for rid in sched if self._saves_on else ():
            tr = self._trackers.get(rid)
            if tr is not None:
                if self.rules is not None:
                    meta.saves.extend(self._group_saves(rid, tr))
                    continue
                spec = self._save_of(rid, tr)
                if spec is not None:
                    meta.saves.append(spec)
        for rid in finished:
            self._trackers.pop(rid, None)
            self._pending.pop(rid, None)
        return meta

    def _save_of(self, rid: str, tr: _Tracker) -> Optional[SaveSpec]:
        """The chain up to the request's last computed full prompt block, if
        the step completes any block after the last save (a save in a later
        step waits on the worker for this one: tutti.save_queue)."""
        bt, cp = self.block_tokens, self.chunk_pages
        full = min(len(tr.chain), tr.computed // bt, len(tr.block_ids) // cp)
        if full <= tr.saved:
            return None
        start, tr.saved = tr.saved, full
        self.counters["save_blocks"] += full - start
        tokens = [int(t) for t in tr.tokens_of(tr.request)[:full * bt]] if tr.tokens_of else None
        hashes = tr.hashes_of(tr.request) if tr.hashes_of else None
        return SaveSpec(rid, list(tr.chain[:full]), [int(b) for b in tr.block_ids[:full * cp]],
                        tokens=tokens if tokens is not None and len(tokens) == full * bt else None,
                        hashes=list(hashes[:full]) if hashes is not None and len(hashes) >= full else None,
                        start=start)

    def _ids(self, block_ids):
        if self.rules is None:
            return list(_group0(block_ids)) if block_ids is not None else []
        if block_ids is None:
            return [[] for _ in self.rules]
        return [list(g) for g in _groups(block_ids, len(self.rules))]

    def _group_saves(self, rid: str, tr: _Tracker) -> List[SaveSpec]:
        """A hybrid request's saves of the step: per group, what its rule
        saves of the blocks the step completed (tutti.groups); full groups'
        as one request's growing chain (tutti.save_queue), the others' in the
        step (their pages may be freed while the request runs)."""
        bt = self.block_tokens
        full = min([len(tr.chain), tr.computed // bt] + [len(ids) for ids in tr.block_ids])
        if full <= tr.saved:
            return []
        start, tr.saved = tr.saved, full
        self.counters["save_blocks"] += full - start
        out, first_full = [], True
        for g, rule in enumerate(self.rules):
            for root, end in rule.save_ranges(start, full, len(tr.chain), tr.computed):
                tokens = hashes = None
                if rule.kind == "full" and first_full:  # KV events: the first full group's store publishes
                    tokens = [int(t) for t in tr.tokens_of(tr.request)[:end * bt]] if tr.tokens_of else None
                    h = tr.hashes_of(tr.request) if tr.hashes_of else None
                    hashes = list(h[:end]) if h is not None and len(h) >= end else None
                    tokens = tokens if tokens is not None and len(tokens) == end * bt else None
                out.append(SaveSpec(_run_id(rid, rule, g, root), list(tr.chain[root:end]),
                                    [int(b) for b in tr.block_ids[g][root:end]], tokens=tokens, hashes=hashes,
                                    start=start if rule.kind == "full" else 0, group=g))
            first_full = first_full and rule.kind != "full"
        return out

    def request_finished(self, req_id: str) -> bool:
        self._trackers.pop(req_id, None)
        self._pending.pop(req_id, None)
        self.matcher.release(req_id)
        return False


def _run_id(req_id: str, rule: GroupRule, group: int, root: int) -> str:
    """The id of one group's run of a request in the worker (a full group's
    is the request's: its saves queue per request)."""
    return req_id if rule.kind == "full" and root == 0 else f"{req_id}\x00g{group}.{root}"


def _state_runs_in(rule: GroupRule, ids: Sequence[int], end: int) -> List[int]:
    """A state group's block the engine runs the request's state in this
    step, when it is not the restored one (block ``end - 1``): vLLM 0.26's
    align mode runs it in the last block it allocated for the group
    (MambaManager.allocate_new_blocks: block ceil((c + n) / B) - 1 for c
    computed and n scheduled tokens) and copies the state there from block
    ceil(c / B) - 1 before the connector's load starts (gpu_model_runner.py:
    preprocess_mamba runs before maybe_get_kv_connector_output), so the
    worker copies the restored page there again once it is loaded."""
    if rule.kind != "state" or len(ids) <= end or int(ids[-1]) == NULL_BLOCK:
        return []
    return [int(ids[-1])]


def base_request(run_id: str) -> str:
    """The request of a run id (:func:`_run_id`)."""
    return run_id.split("\x00", 1)[0]


def _groups(block_ids, n: int):
    """vLLM's block ids per KV cache group: a tuple of ``n`` lists."""
    if not (isinstance(block_ids, (list, tuple)) and len(block_ids) == n
            and all(isinstance(g, (list, tuple)) for g in block_ids)):
        raise ValueError(f"block ids {str(block_ids)[:80]}: want one list per KV cache group ({n})")
    return block_ids


def _group0(block_ids):
    """vLLM passes block ids per KV cache group (a tuple of lists); tutti
    serves one group."""
    if block_ids and isinstance(block_ids[0], (list, tuple)):
        if len(block_ids) != 1:
            raise ValueError(f"{len(block_ids)} KV cache groups and no group rules: a hybrid model's SchedulerSide "
                             f"needs rules (tutti.groups)")
        return block_ids[0]
    return block_ids
