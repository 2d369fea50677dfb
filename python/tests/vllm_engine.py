"""vLLM 0.26's engine loop in miniature, over the contract double (tests only).

One process, TP = 1 (vLLM's default: the scheduler and the worker in one
process), real torch tensors on the CPU. What it reproduces of 0.26
(vllm/v1/core/sched/scheduler.py, vllm/v1/worker/gpu_model_runner.py and
kv_connector_model_runner_mixin.py):

- scheduling: running requests first (a prefill chunk or one decode token
  each, within ``max_num_batched_tokens``), preempting the last running
  request when blocks run out (its blocks freed, ``num_computed_tokens`` 0,
  back to the front of the queue, in ``preempted_req_ids``); then waiting
  ones, only in a step without preemption: the connector's lookup (``None``:
  skipped this step), ``allocate_slots`` for the tokens computed so far plus
  this step's (blocks are allocated chunk by chunk), ``update_state_after_alloc``
  with all the request's blocks; new requests in ``scheduled_new_reqs`` with
  their blocks so far, running ones in ``scheduled_cached_reqs`` with the
  blocks allocated in the step, resumed ones with all their new blocks;
  ``build_connector_meta`` before ``num_computed_tokens`` advances;
- the worker: ``handle_preemptions(metadata)`` first; a step without tokens
  goes through the no-forward path (bind, ``start_load_kv``, ``get_finished``,
  no ``wait_for_save``); otherwise bind, ``start_load_kv``, per layer
  ``wait_for_layer_load``, the attention's KV write of the scheduled tokens,
  ``save_kv_layer``; ``wait_for_save``, ``get_finished``, load errors, stats,
  clear;
- finishing: ``request_finished`` once per finished or aborted request
  (blocks freed unless it returns True, then when ``get_finished`` reports
  the request sending), the id in the next step's ``finished_req_ids``.

Not reproduced: the local prefix cache (lookups see 0 local tokens), async
scheduling, speculative decoding, asynchronous loads.

The "attention" writes, for the token at position p of a request, KV that
depends on every token up to p, the multimodal input or prompt embedding at
each of those positions, and the request's LoRA (a stable hash: equal across
processes), so a block restored from another request with the same prefix
must equal what this request would compute; every restored block is
compared after the forward that loaded it (``self.bad``).
"""

import collections
import hashlib
import os

import torch

from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

BS, L, H, D = 16, 2, 2, 32
MAX_STEPS = 10000


def config(root, extra=None, engine_id="e1", model="test/model"):
    ex = {"dirs": [os.path.join(root, "d0")], "capacity_bytes": 64 << 20, "path": "cpu", "lookup_socket_dir": root,
          # Prefill priced far above these tiny reads: the planner never trades
          # a stored block for recompute here, so hits are deterministic.
          "store_options": {"compute": {"fixed_ns": 1e7, "per_token_ns": 1e5, "per_pair_ns": 0}}}
    ex.update(extra or {})
    return VllmConfig(kv_transfer_config=KVTransferConfig("TuttiConnector", "tutti.vllm", "kv_both", ex, engine_id),
                      cache_config=CacheConfig(BS), parallel_config=ParallelConfig(1), model_config=ModelConfig(model))


def _position_extras(req):
    """What besides its token the KV at each prompt position depends on: the
    multimodal input covering it, or its prompt embedding (a cache salt
    changes no KV; a LoRA changes all of it: the chain's seed)."""
    out = {}
    for f in req.mm_features:
        for p in range(f.mm_position.offset, f.mm_position.offset + f.mm_position.length):
            out[p] = repr(f.identifier).encode()
    if req.prompt_embeds is not None:
        for p in range(req.num_prompt_tokens):
            out[p] = req.prompt_embeds[p].contiguous().numpy().tobytes()
    return out


class Engine:
    def __init__(self, root, *, num_blocks=64, max_num_batched_tokens=256, extra=None, engine_id="e1",
                 model="test/model"):
        cfg = config(root, extra, engine_id, model)
        self.worker = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, None)
        self.kv = {f"model.layers.{i}.self_attn.attn": torch.zeros(2, num_blocks, BS, H, D, dtype=torch.bfloat16)
                   for i in range(L)}
        self.worker.register_kv_caches(self.kv)
        self.sched = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, None)
        self.budget = max_num_batched_tokens
        self.free = collections.deque(range(1, num_blocks))  # block 0 is vLLM's null block
        self.blocks = {}  # req id -> block ids
        self.waiting = collections.deque()
        self.running = []
        self.requests = {}
        self.finished_ids = set()
        self.held = set()  # finished requests whose blocks the connector holds
        self.bad = []  # (req id, block index, layer) restored unlike what the request computes
        self.errors = set()
        self.stats = collections.Counter()
        self.steps = 0
        self.preempted = 0  # preemptions so far
        self._prefix = {}  # req id -> prefix hashes (entry p + 1: through position p)
        self._extras = {}  # req id -> position -> what else its KV depends on

    # -- requests
    def add(self, req):
        self.requests[req.request_id] = req
        self.blocks[req.request_id] = []
        self.waiting.append(req)

    def abort(self, req_id):
        req = self.requests[req_id]
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        self._finish(req, "FINISHED_ABORTED")

    def _finish(self, req, status):
        req.status = status
        delay, _ = self.sched.request_finished(req, list(self.blocks[req.request_id]))
        self.finished_ids.add(req.request_id)
        if delay:
            self.held.add(req.request_id)
        else:
            self._free(req.request_id)

    def _free(self, req_id):
        self.free.extend(self.blocks.pop(req_id, []))

    def _allocate(self, req, num_tokens):
        """allocate_slots: the blocks for num_tokens tokens; the new ones, or None."""
        have = self.blocks[req.request_id]
        need = -(-num_tokens // BS) - len(have)
        if need > len(self.free):
            return None
        new = [self.free.popleft() for _ in range(max(0, need))]
        have.extend(new)
        return new

    def _preempt(self, req):
        self._free(req.request_id)
        self.blocks[req.request_id] = []
        req.status, req.num_computed_tokens = "PREEMPTED", 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)

    # -- one step
    def _schedule(self):
        budget, sched, new_reqs, preempted = self.budget, {}, [], set()
        cached = CachedRequestData.make_empty()
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            new = self._allocate(req, req.num_computed_tokens + n)
            while new is None:
                victim = self.running.pop()
                self._preempt(victim)
                preempted.add(victim.request_id)
                if victim is req:
                    break
                new = self._allocate(req, req.num_computed_tokens + n)
            if new is None:
                break
            sched[req.request_id] = n
            budget -= n
            self._cached(cached, req, (new,) if new else None, resumed=False)
            i += 1
        skipped = []
        while self.waiting and budget > 0 and not preempted:
            req = self.waiting[0]
            ext, is_async = self.sched.get_num_new_matched_tokens(req, 0)
            if ext is None:  # the connector asks to be asked again
                skipped.append(self.waiting.popleft())
                self.stats["lookup_deferred"] += 1
                continue
            assert is_async is False and 0 <= ext < req.num_tokens, (ext, is_async, req.num_tokens)
            n = min(req.num_tokens - ext, budget)
            if self._allocate(req, ext + n) is None:
                break
            self.sched.update_state_after_alloc(req, KVCacheBlocks([self.blocks[req.request_id]]), ext)
            self.waiting.popleft()
            resumed = req.status == "PREEMPTED"
            req.status, req.num_computed_tokens = "RUNNING", ext
            self.running.append(req)
            if resumed:
                self._cached(cached, req, (list(self.blocks[req.request_id]),), resumed=True)
            else:
                new_reqs.append(NewRequestData.from_request(req, (list(self.blocks[req.request_id]),)))
            sched[req.request_id] = n
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        self.preempted += len(preempted)
        so = SchedulerOutput(new_reqs, cached, sched, sum(sched.values()), self.finished_ids,
                             preempted_req_ids=preempted)
        so.kv_connector_metadata = self.sched.build_connector_meta(so)
        self.finished_ids = set()
        return so

    @staticmethod
    def _cached(cached, req, new_blocks, resumed):
        cached.req_ids.append(req.request_id)
        cached.new_block_ids.append(new_blocks)
        cached.num_computed_tokens.append(req.num_computed_tokens)
        cached.num_output_tokens.append(req.num_output_tokens)
        if resumed:
            cached.resumed_req_ids.add(req.request_id)

    def step(self):
        """One engine step; returns its scheduler output."""
        self.steps += 1
        so = self._schedule()
        for rid, n in so.num_scheduled_tokens.items():
            self.requests[rid].num_computed_tokens += n  # _update_after_schedule
        self._execute(so)
        for rid, n in so.num_scheduled_tokens.items():  # update_from_output
            req = self.requests[rid]
            if req.num_computed_tokens >= req.num_tokens and req.status == "RUNNING":
                req.append_output_token_ids((req.all_token_ids[-1] * 31 + 7) % 50000)
                if req.num_output_tokens >= req.max_tokens:
                    self.running.remove(req)
                    self._finish(req, "FINISHED_LENGTH_CAPPED")
        st = self.sched.get_kv_connector_stats()  # the scheduler's side of the stats
        if st is not None:
            self.stats.update(st.data)
        return so

    def run(self, until=None, max_steps=MAX_STEPS):
        """Steps until ``until()`` (default: nothing left to run)."""
        until = until or (lambda: not (self.waiting or self.running or self.held or self.finished_ids))
        for _ in range(max_steps):
            if until():
                return
            self.step()
        raise AssertionError(f"not done after {max_steps} steps")

    # -- the worker (one rank)
    def _execute(self, so):
        w, meta = self.worker, so.kv_connector_metadata
        w.handle_preemptions(meta)
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        if so.total_num_scheduled_tokens:
            for li, name in enumerate(self.kv):
                w.wait_for_layer_load(name)
                for rid, n in so.num_scheduled_tokens.items():
                    self._attend(self.requests[rid], n, li, name)
                w.save_kv_layer(name, self.kv[name], object())
            w.wait_for_save()
        sending, recving = w.get_finished(so.finished_req_ids)
        assert recving is None, recving
        for rid in sending or ():
            self.held.discard(rid)
            self._free(rid)
        self.errors |= w.get_block_ids_with_load_errors()
        st = w.get_kv_connector_stats()
        if st is not None:
            self.stats.update(st.data)
        self._check_loads(meta)
        w.clear_connector_metadata()

    def _prefix_hashes(self, req):
        hs = self._prefix.setdefault(req.request_id, [])
        if not hs:
            lora = getattr(req.lora_request, "lora_name", "")
            hs.append(hashlib.blake2b(f"lora={lora}".encode(), digest_size=8).digest())  # before position 0
            self._extras[req.request_id] = _position_extras(req)
        extras = self._extras[req.request_id]
        for p in range(len(hs) - 1, req.num_tokens):
            t = int(req.all_token_ids[p]).to_bytes(4, "little")
            hs.append(hashlib.blake2b(hs[-1] + t + extras.get(p, b""), digest_size=8).digest())
        return hs

    def content(self, req, pos, layer):
        """The KV the attention writes for the token at pos of req."""
        seed = int.from_bytes(self._prefix_hashes(req)[pos + 1], "little") ^ (layer * 0x9E3779B97F4A7C15)
        g = torch.Generator().manual_seed(seed & 0x7FFFFFFFFFFFFFFF)
        return torch.randn(2, H, D, generator=g).to(torch.bfloat16)

    def _attend(self, req, n, li, name):
        start = req.num_computed_tokens - n
        blocks = self.blocks[req.request_id]
        for pos in range(start, start + n):
            self.kv[name][:, blocks[pos // BS], pos % BS] = self.content(req, pos, li)

    def _check_loads(self, meta):
        for ld in getattr(meta, "loads", ()):
            req = self.requests[ld.req_id]
            for j, page in enumerate(ld.block_ids):
                b = ld.skip + j
                if page in self.errors:
                    continue
                for li, name in enumerate(self.kv):
                    want = torch.stack([self.content(req, b * BS + s, li) for s in range(BS)], dim=1)
                    if not torch.equal(self.kv[name][:, page], want):
                        self.bad.append((ld.req_id, b, name))

    def wait_saves(self):
        self.worker._worker.store.wait_saves()

    def close(self):
        self.sched.shutdown()
        self.worker.shutdown()
