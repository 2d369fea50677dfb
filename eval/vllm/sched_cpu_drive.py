"""eval/vllm/drive.py's workload through tutti's connector as real vLLM 0.26
runs it on the GPU machine, on a machine without a GPU: one process per
phase (``first`` saves, ``second`` is a new process on the same store that
must restore), a hybrid eval model's real KV cache groups and tensors
(eval/vllm/worker_cpu_hybrid.py: vLLM's own grouping and model runner
allocation), vLLM's AsyncScheduler driven as EngineCore.step_with_batch_queue
drives it with async scheduling (a batch queue of 2: step N+1 is scheduled
and executed before step N's output is applied; an exception of step N's
sample_tokens waits in its future while step N+1's execute_model raises at
once), the V2 model runner's connector calls (pre_forward: handle_preemptions,
bind_connector_metadata, start_load_kv; per layer in model order
wait_for_layer_load, the layer's KV written, save_kv_layer; post_forward in
sample_tokens: wait_for_save, get_finished, get_block_ids_with_load_errors,
stats, events, clear_connector_metadata; no_forward for a step of no
tokens), TuttiConnector's scheduler and worker roles in one process on the
CPU path, check mode on.

The stand-in model writes, at each position of each attention layer, values
that are a function of the token prefix up to it and of the layer. Before a
request first computes, every position it attends to (all of them in a full
layer, the window of the next token in a sliding one) is checked to hold its
prefix's values, layer by layer right after the layer's wait_for_layer_load,
so every restored block is checked besides the check mode's digests.

Prints and (--json) writes per phase: the waves' steps, the most loads one
group's worker got in one step, the connector's counters, the check mode's
counts, the wrong values, PASS or FAIL. Arguments after ``--`` go to
drive.py's parser (after the model's drive.args), e.g. ``-- --doc-tokens
1024`` for a smaller run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections import deque
from concurrent.futures import Future

import worker_cpu_hybrid as W  # noqa: E402 (sets vLLM's CPU platform first)

import torch  # noqa: E402

import drive  # noqa: E402
from sched_common import init_one_worker, prefix_hashes, step_tables  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig,  # noqa: E402
                         VllmConfig, set_current_vllm_config)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import get_forward_context, set_forward_context  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import (get_kv_cache_config_from_groups, get_kv_cache_groups,  # noqa: E402
                                         get_request_block_hasher, init_none_hash)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.kv_cache_interface import SlidingWindowSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

MOD = 251  # values < 256 are exact in bfloat16
BATCH_QUEUE = 2  # vLLM 0.26's max_concurrent_batches with async scheduling (pipeline parallel 1)


class Engine:
    """vLLM's scheduler, the connector's two roles and the stand-in model."""

    def __init__(self, a, model_dir, extra):
        self.a = a
        mc = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=a.max_model_len, dtype="bfloat16")
        sc = SchedulerConfig(max_num_batched_tokens=a.budget_tokens, max_model_len=a.max_model_len,
                             enable_chunked_prefill=True, is_encoder_decoder=False, async_scheduling=True,
                             scheduler_reserve_full_isl=a.reserve_full_isl == "on")
        cc = CacheConfig(block_size=a.block_size, enable_prefix_caching=True, num_gpu_blocks_override=a.gpu_blocks)
        kt = KVTransferConfig(kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm", kv_role="kv_both",
                              kv_connector_extra_config=extra)
        self.vc = vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc, kv_transfer_config=kt)
        with set_current_vllm_config(vc):
            init_one_worker()
            self.kcc = kcc = get_kv_cache_config_from_groups(vc, get_kv_cache_groups(vc, W.layer_specs(vc)), 1 << 30)
            cc.num_gpu_blocks = kcc.num_blocks
            self.kv, _ = W.vllm_kv_caches(vc, kcc)
            self.worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kcc)
            self.worker.register_kv_caches(self.kv)
            self.sched = AsyncScheduler(vllm_config=vc, kv_cache_config=kcc,
                                        structured_output_manager=StructuredOutputManager(vc),
                                        block_size=cc.block_size, log_stats=True)
        # The GPU machine's engine runs the V2 model runner (this CPU has no Triton for it): the scheduler
        # then sends resumed requests as new ones and paces decodes by step.
        self.sched.use_v2_model_runner = True
        hf = get_hash_fn_by_name(cc.prefix_caching_hash_algo)
        init_none_hash(hf)
        self.hasher = get_request_block_hasher(cc.block_size, hf)
        # (layer index, name, group, window tokens or 0), in the model's layer order
        self.layers = []
        for g, grp in enumerate(kcc.kv_cache_groups):
            win = grp.kv_cache_spec.sliding_window if isinstance(grp.kv_cache_spec, SlidingWindowSpec) else 0
            for n in grp.layer_names:
                self.layers.append((int(re.search(r"layers\.(\d+)\.", n).group(1)), n, g, win))
        self.layers.sort()
        t0 = self.kv[self.layers[0][1]]
        if t0.dim() != 4 or t0.shape[2] != cc.block_size:
            raise SystemExit(f"KV tensor {list(t0.shape)}: this stand-in writes (blocks, heads, block_size, C) views")
        self.tables, self.queue = {}, deque()
        self.verified, self.bad, self.first_computed = 0, [], {}
        self.max_group_loads, self.steps_with_loads = 0, 0
        self.counters = {}  # the worker role's
        self.sched_counters = {}  # the scheduler role's
        self.vllm_external_hit_tokens = 0
        self.invalid = 0

    # -- the stand-in model
    def _values(self, hashes, li, p0, p1):
        t0 = self.kv[self.layers[0][1]]
        heads, c = t0.shape[1], t0.shape[3]
        h = torch.tensor(hashes[p0:p1], dtype=torch.int64).view(-1, 1, 1)
        j = torch.arange(heads * c, dtype=torch.int64).view(1, heads, c)
        return ((h + 7 * li + j) % MOD).to(t0.dtype)

    def _positions(self, rid, g, p0, p1):
        bs = self.a.block_size
        t = self.tables[rid][g]
        pos = torch.arange(p0, p1)
        return torch.tensor([t[p // bs] for p in range(p0, p1)], dtype=torch.long), pos % bs

    def _check_first(self, rid, hashes, nc, li, name, g, win):
        """Before rid first computes: what it attends to in this layer."""
        lo = max(0, nc - win + 1) if win else 0
        if any(self.tables[rid][g][p // self.a.block_size] == 0 for p in range(lo, nc)):
            self._bad(f"{rid}: layer {name}: a null block inside what it attends to at {nc}")
            return
        blk, off = self._positions(rid, g, lo, nc)
        got = self.kv[name][blk, :, off]
        if not torch.equal(got, self._values(hashes, li, lo, nc)):
            self._bad(f"{rid}: layer {name}: tokens [{lo}, {nc}) hold the wrong KV")
            return
        self.verified += nc - lo

    def _bad(self, msg):
        if len(self.bad) < 64:
            self.bad.append(msg)

    # -- the model runner (the V2 runner's connector calls)
    def execute(self, so):
        w, reqs = self.worker, self.sched.requests
        work = step_tables(so, self.tables, len(self.kcc.kv_cache_groups))
        meta = so.kv_connector_metadata
        per_group = {}
        for ld in meta.loads:
            per_group[ld.group] = per_group.get(ld.group, 0) + 1
        if per_group:
            self.steps_with_loads += 1
            self.max_group_loads = max(self.max_group_loads, max(per_group.values()))
        with set_current_vllm_config(self.vc), set_forward_context(None, self.vc):
            w.handle_preemptions(meta)
            w.bind_connector_metadata(meta)
            w.start_load_kv(get_forward_context())
            if so.total_num_scheduled_tokens == 0:  # no_forward
                return self._post_forward(so, wait_for_save=False)
            hashes = {}
            for rid, nc, _ in work:
                toks = list(reqs[rid].all_token_ids)
                n = nc + so.num_scheduled_tokens[rid]
                toks += [7] * (n - len(toks))  # async: a token sampled by a step not applied yet
                hashes[rid] = prefix_hashes(toks[:n])
            for li, name, g, win in self.layers:
                w.wait_for_layer_load(name)
                for rid, nc, first in work:
                    if first and nc > 0:
                        self.first_computed.setdefault(rid, nc)
                        self._check_first(rid, hashes[rid], nc, li, name, g, win)
                    elif first:
                        self.first_computed.setdefault(rid, 0)
                    n = so.num_scheduled_tokens[rid]
                    blk, off = self._positions(rid, g, nc, nc + n)
                    self.kv[name][blk, :, off] = self._values(hashes[rid], li, nc, nc + n)
                w.save_kv_layer(name, self.kv[name], None)
        return work

    def _post_forward(self, so, wait_for_save=True):
        w = self.worker
        if wait_for_save:
            w.wait_for_save()
        sending, recving = w.get_finished(so.finished_req_ids)
        invalid = w.get_block_ids_with_load_errors()
        st = w.get_kv_connector_stats()
        for k, v in (st.data if st is not None else {}).items():
            self.counters[k] = self.counters.get(k, 0) + v
        w.get_kv_connector_kv_cache_events()
        w.clear_connector_metadata()
        if invalid:
            self.invalid += len(invalid)
            self._bad(f"load errors: blocks {sorted(invalid)[:8]}")
        return KVConnectorOutput(finished_sending=sending, finished_recving=recving, invalid_block_ids=invalid)

    def sample_tokens(self, so, work):
        kco = self._post_forward(so)
        ids, sampled = [], []
        for rid, nc, _ in work:
            r = self.sched.requests.get(rid)
            ids.append(rid)
            done = r is not None and nc + so.num_scheduled_tokens[rid] >= r.num_prompt_tokens
            sampled.append([5000 + (nc % 1000)] if done else [])
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled, kv_connector_output=kco)

    # -- EngineCore.step_with_batch_queue
    def step(self):
        """One engine step; returns the EngineCoreOutputs' outputs applied."""
        if self.sched.has_requests():
            so = self.sched.schedule()
            res = self.execute(so)  # the uniproc executor raises execute_model's exception at once
            fut = Future()
            if so.total_num_scheduled_tokens > 0:
                try:
                    fut.set_result(self.sample_tokens(so, res))
                except Exception as e:  # sample_tokens' exception waits in its future
                    fut.set_exception(e)
            else:
                fut.set_result(ModelRunnerOutput.with_kv_conn_output_only(res))
            self.queue.appendleft((fut, so))
            if len(self.queue) < BATCH_QUEUE and (so.total_num_scheduled_tokens > 0 or self.sched.has_requests()):
                return []
        elif not self.queue:
            return []
        fut, so = self.queue.pop()
        eco = self.sched.update_from_output(so, fut.result())
        for o in eco.values():  # the scheduler role's counters and vLLM's own, as its metrics get them
            st = o.scheduler_stats
            if st is None:
                continue
            for k, v in (st.kv_connector_stats or {}).items():
                self.sched_counters[k] = self.sched_counters.get(k, 0) + v
            if st.connector_prefix_cache_stats is not None:
                self.vllm_external_hit_tokens += st.connector_prefix_cache_stats.hits
        return eco[0].outputs if eco.get(0) is not None else []

    def run_wave(self, wave, sp, max_steps):
        """drive.py's run_wave over this engine."""
        recs, live, steps = {}, set(), 0
        for rid, toks, action in wave:
            self.sched.add_request(Request(rid, toks, sp, None, block_hasher=self.hasher))
            recs[rid] = {"action": action}
            live.add(rid)
        while live and steps < max_steps:
            outs = self.step()
            steps += 1
            for o in outs:
                r = recs.get(o.request_id)
                if r is None:
                    continue
                if o.new_token_ids and "first_token_step" not in r:
                    r["first_token_step"] = steps
                if o.finish_reason is not None:
                    r["finish_reason"] = str(o.finish_reason)
                    live.discard(o.request_id)
            for rid in list(live):
                if drive.abort_now(recs[rid]["action"], steps, "first_token_step" in recs[rid]):
                    self.sched.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
                    recs[rid]["aborted_at_step"] = steps
                    live.discard(rid)
        if live:
            raise RuntimeError(f"wave did not finish in {max_steps} steps: {sorted(live)}")
        return recs, steps

    def drain(self):
        while self.queue or self.sched.has_requests():
            self.step()


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    drive_extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gemma3-1b", help="a model of eval/vllm/models")
    p.add_argument("--dir", required=True, help="the store's directory (the check mode's: DIR-check)")
    p.add_argument("--phase", choices=("first", "second"), required=True)
    p.add_argument("--json", default="")
    p.add_argument("--capacity-mib", type=int, default=2048, help="the store's capacity_bytes (preallocated), MiB")
    o = p.parse_args(argv)
    d = os.path.join(W.MODELS, o.model)
    args_path = os.path.join(d, "drive.args")
    extra_args = shlex.split(open(args_path).read()) if os.path.exists(args_path) else []
    a = drive.parse_args(["--model", d, "--phase", o.phase, "--out", os.devnull, *extra_args, *drive_extra])
    extra = {"dirs": [o.dir], "capacity_bytes": o.capacity_mib << 20, "path": "cpu", "check": {"dir": o.dir + "-check"}}
    e = Engine(a, d, extra)
    first, second = drive.workload(a, e.vc.model_config.get_vocab_size())
    sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
    res = {"phase": o.phase, "model": o.model, "drive_args": extra_args + drive_extra, "waves": []}
    err = None
    try:
        for i, w in enumerate(first if o.phase == "first" else second):
            recs, steps = e.run_wave(w, sp, a.max_steps)
            res["waves"].append({"requests": [r for r, _, _ in w], "steps": steps})
            print(f"[{o.phase}] wave {i}: {len(w)} requests, {steps} steps", flush=True)
        e.drain()
    except Exception as ex:  # the failure is the result: reported, the check mode's summaries still written
        import traceback
        traceback.print_exc()
        err = f"{type(ex).__name__}: {ex}"
    e.worker._worker.store.wait_saves()
    e.worker.shutdown()  # the check mode's summaries are written at close
    from tutti.kvcheck import read_summaries
    chk = read_summaries(o.dir + "-check")
    per_group = {}
    for root, _, files in os.walk(o.dir + "-check"):
        for f in files:
            if f.startswith("summary-"):
                with open(os.path.join(root, f)) as fh:
                    per_group.setdefault(os.path.basename(root), []).append(json.load(fh)["totals"])
    res.update(error=err, check=chk, check_per_group=per_group, counters=e.counters, verified_tokens=e.verified,
               bad=e.bad, first_computed=e.first_computed, max_group_loads=e.max_group_loads,
               steps_with_loads=e.steps_with_loads, load_error_blocks=e.invalid)
    ok = err is None and not e.bad and chk["mismatch"] == 0 and chk["unknown"] == 0
    if o.phase == "second":
        ok = ok and chk["match"] > 0 and e.verified > 0
    res["ok"] = ok
    print(f"[{o.phase}] error {err}; connector {e.counters}; scheduler role {e.sched_counters}; vLLM counted "
          f"{e.vllm_external_hit_tokens} external hit tokens")
    print(f"[{o.phase}] most loads of one group in one step {e.max_group_loads}; first computed at "
          f"{e.first_computed}; {e.verified} restored token-layers checked; check mode {chk['match']} match, "
          f"{chk['mismatch']} mismatch, {chk['unknown']} unknown; per group {per_group}")
    for b in e.bad[:8]:
        print("  " + b)
    print(f"[{o.phase}] {'PASS' if ok else 'FAIL'}")
    if o.json:
        with open(o.json, "w") as f:
            json.dump(res, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
