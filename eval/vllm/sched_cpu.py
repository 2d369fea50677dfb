"""tutti's connector under vLLM's own scheduler, on a machine without a GPU.

vLLM's real Scheduler, KV cache manager and block hashing (vLLM 0.26 imported
from a virtual environment: eval/vllm/sched-cpu.sh makes it) run the
connector's scheduler role; this script plays the model runner on the CPU: it
binds the connector's metadata, starts loads, waits for each layer, "computes"
the KV of the scheduled tokens into vLLM's paged tensors, hands every layer to
save_kv_layer, waits for saves, collects get_finished and load errors, and
returns a ModelRunnerOutput to the scheduler, in vLLM's order
(kv_connector_model_runner_mixin).

The KV that the stand-in model writes for a token is a function of the whole
prefix up to it (a rolling hash) and of the layer, exact in float16. So every
block restored from tutti can be checked against what it must hold: before a
request computes, the tokens vLLM counts as computed (local hits and tutti's)
must hold their prefix's values in every layer.

Scenarios (each prints a line and counts into the verdict):
  chunked   a prompt several times the step's token budget, then a request
            sharing most of it after the GPU prefix cache is reset: it must
            match every full block the two share (not the first chunk only)
  preempt   several long prompts at once into too few blocks: preemptions,
            and every request completes with verified KV
  abort     a request aborted mid-prefill and one after its first token
  restart   a second process (a new NONE_HASH: PYTHONHASHSEED unset) asks
            for the same prefixes and restores them from tutti

Run by python/tests/test_vllm_real.py (make python-test), in the environment
of scripts/vllm-venv.sh: the first phase, then the restart in a new process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections import Counter

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import vllm.platforms as _platforms  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

_platforms._current_platform = CpuPlatform()  # no GPU here: vLLM's CPU platform drives the config

from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig,  # noqa: E402
                         VllmConfig, set_current_vllm_config)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import get_forward_context, set_forward_context  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from sched_common import HEAD, HEADS, check_mode, expect_kv, finish, init_one_worker, prefix_hashes  # noqa: E402

LAYERS = 4


class Runner:
    """The stand-in model runner: vLLM's paged KV tensors on the CPU, a block
    table per request, the connector's worker role driven in vLLM's order."""

    def __init__(self, a, extra):
        self.a = a
        mc = ModelConfig(model=a.model, skip_tokenizer_init=True, max_model_len=a.max_model_len, dtype="float16")
        sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=a.budget_tokens, max_model_len=a.max_model_len,
                             enable_chunked_prefill=True, is_encoder_decoder=False, async_scheduling=False)
        cc = CacheConfig(block_size=a.block_size, enable_prefix_caching=True)
        kt = KVTransferConfig(kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm",
                              kv_role="kv_both", kv_connector_extra_config=extra)
        self.vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc, kv_transfer_config=kt)
        names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        self.names = names
        self.kcc = KVCacheConfig(num_blocks=a.blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(names, FullAttentionSpec(block_size=a.block_size, num_kv_heads=HEADS, head_size=HEAD,
                                                      dtype=torch.float16))])
        cc.num_gpu_blocks = a.blocks
        # FlashAttention's layout: (2, num_blocks, block_size, heads, head_size) per layer.
        self.kv = {n: torch.zeros((2, a.blocks, a.block_size, HEADS, HEAD), dtype=torch.float16) for n in names}
        with set_current_vllm_config(self.vc):
            init_one_worker()
            # The worker role is built and registers its caches first (as in vLLM).
            self.worker = KVConnectorFactory.create_connector(self.vc, KVConnectorRole.WORKER, self.kcc)
            self.worker.register_kv_caches(self.kv)
            self.sched = Scheduler(vllm_config=self.vc, kv_cache_config=self.kcc,
                                   structured_output_manager=StructuredOutputManager(self.vc),
                                   block_size=a.block_size, log_stats=True)
        hash_fn = get_hash_fn_by_name(cc.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(a.block_size, hash_fn)
        self.tables: dict[str, list[int]] = {}
        self.first_computed: dict[str, int] = {}
        self.verified_tokens = 0
        self.bad: list[str] = []
        self.preempted: dict[str, int] = {}
        self.finished: dict[str, str] = {}
        self.waited_remote: set[str] = set()  # requests vLLM held in WAITING_FOR_REMOTE_KVS (async_loads)
        self.stats: Counter = Counter()  # the worker role's connector stats, summed over steps

    def slots(self, rid, p0, p1):
        bs = self.a.block_size
        t = self.tables[rid]
        pos = torch.arange(p0, p1)
        return torch.tensor([t[p // bs] for p in range(p0, p1)]), pos % bs

    def verify(self, rid, tokens, upto):
        if upto == 0:
            return
        hs = prefix_hashes(tokens[:upto])
        blk, off = self.slots(rid, 0, upto)
        for li, n in enumerate(self.names):
            k, v = expect_kv(hs, li, 0, upto)
            got_k, got_v = self.kv[n][0, blk, off], self.kv[n][1, blk, off]
            if not (torch.equal(got_k, k) and torch.equal(got_v, v)):
                bad = (got_k != k).flatten(1).any(1) | (got_v != v).flatten(1).any(1)
                p = int(bad.nonzero()[0])
                self.bad.append(f"{rid}: layer {li} token {p} of {upto} computed/restored holds the wrong KV")
                return
        self.verified_tokens += upto

    # -- one engine step, in vLLM's order
    def step(self):
        so = self.sched.schedule()
        w = self.worker
        reqs = self.sched.requests
        for rid, r in reqs.items():  # preemptions are counted on the request when schedule() preempts
            self.preempted[rid] = max(self.preempted.get(rid, 0), r.num_preemptions)
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.waited_remote.add(rid)
        work = []
        for nr in so.scheduled_new_reqs:
            self.tables[nr.req_id] = list(nr.block_ids[0])
            work.append((nr.req_id, nr.num_computed_tokens, True))
        cr = so.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            nb = cr.new_block_ids[i]
            resumed = rid in cr.resumed_req_ids
            if resumed:
                self.tables[rid] = list(nb[0]) if nb is not None else []
            elif nb is not None:
                self.tables[rid].extend(nb[0])
            work.append((rid, cr.num_computed_tokens[i], resumed))
        hashes = {rid: prefix_hashes(reqs[rid].all_token_ids[:nc + so.num_scheduled_tokens[rid]])
                  for rid, nc, _ in work}
        with set_current_vllm_config(self.vc), set_forward_context(None, self.vc):
            w.bind_connector_metadata(so.kv_connector_metadata)
            w.start_load_kv(get_forward_context())
            for li, n in enumerate(self.names):
                w.wait_for_layer_load(n)
                if li == 0:  # every layer of the restored prefix is there once the loads are done: check it
                    for rid, nc, first in work:
                        if first:
                            self.first_computed.setdefault(rid, nc)
                            self.verify(rid, reqs[rid].all_token_ids, nc)
                for rid, nc, _ in work:
                    n_new = so.num_scheduled_tokens[rid]
                    hs = hashes[rid]
                    k, v = expect_kv(hs, li, nc, nc + n_new)
                    blk, off = self.slots(rid, nc, nc + n_new)
                    self.kv[n][0, blk, off] = k
                    self.kv[n][1, blk, off] = v
                w.save_kv_layer(n, self.kv[n], None)
            w.wait_for_save()
            sending, recving = w.get_finished(so.finished_req_ids)
            invalid = w.get_block_ids_with_load_errors()
            st = w.get_kv_connector_stats()
            self.stats.update(st.data if st is not None else {})
            w.clear_connector_metadata()
        sampled, ids = [], []
        for rid, nc, _ in work:
            r = reqs[rid]
            ids.append(rid)
            done = nc + so.num_scheduled_tokens[rid]
            if done >= r.num_tokens:  # the last prompt token (or a decode token) was computed: sample
                sampled.append([hashes[rid][-1] % 30000 + 1000])
            else:
                sampled.append([])
        out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled,
                                kv_connector_output=KVConnectorOutput(finished_sending=sending,
                                                                      finished_recving=recving,
                                                                      invalid_block_ids=invalid))
        eco = self.sched.update_from_output(so, out)
        for o in (eco.get(0).outputs if eco.get(0) is not None else []):
            if o.finish_reason is not None:
                self.finished[o.request_id] = str(o.finish_reason)
        return so

    @property
    def preemptions(self):
        return sum(self.preempted.values())

    def add(self, rid, tokens, max_tokens=4):
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.sched.add_request(Request(rid, tokens, sp, None, block_hasher=self.hasher))

    def run(self, max_steps=5000, abort=None):
        """Steps until no request is left; ``abort``: {rid: callable(step, req) -> bool}."""
        for s in range(max_steps):
            if not self.sched.has_requests():
                return s
            self.step()
            for rid, when in list((abort or {}).items()):
                r = self.sched.requests.get(rid)
                if r is not None and when(s, r):
                    self.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
                    abort.pop(rid)
        raise RuntimeError(f"requests left after {max_steps} steps")

    def settle(self):
        """Waits until every save handed to the store is durable: the next
        request then sees them, as one arriving a little later would (this
        runner's steps follow one another with no gap)."""
        self.worker._worker.store.wait_saves()

    def external_tokens(self, rid):
        """Tokens of rid that came from tutti: computed at its first schedule
        beyond the GPU prefix cache's hit (vLLM's own count)."""
        return self.first_computed.get(rid, 0)


def toks(rng, n, vocab=120000):
    return [rng.randrange(1000, vocab) for _ in range(n)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--dir", required=True, help="the store's directory")
    p.add_argument("--phase", choices=("first", "restart"), required=True)
    p.add_argument("--json", default="")
    p.add_argument("--budget-tokens", type=int, default=256)
    p.add_argument("--blocks", type=int, default=160)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=4096)
    a = p.parse_args(argv)
    extra = {"dirs": [a.dir], "capacity_bytes": 1 << 30, "path": "cpu", "check": {"dir": a.dir + "-check"}}
    if os.environ.get("TUTTI_EXTRA"):
        extra.update(json.loads(os.environ["TUTTI_EXTRA"]))
    rng = random.Random(11)
    doc = toks(rng, 600)         # chunked: 600 tokens, 256 a step
    q1, q2 = toks(rng, 40), toks(rng, 40)
    longs = [toks(rng, 600) for _ in range(3)]  # preempt: 3 x (38 + 44) blocks into 160
    ab1, ab2 = toks(rng, 900), toks(rng, 300)
    R = Runner(a, extra)
    res = {"phase": a.phase, "checks": {}}
    ok = True
    if a.phase == "first":
        R.add("doc", doc + q1)
        R.run()
        R.settle()
        ok &= R.sched.reset_prefix_cache()  # else the hits below would be vLLM's own
        R.add("doc-again", doc[:480] + q2)
        R.run()
        got = R.external_tokens("doc-again")
        res["checks"]["chunked"] = {"matched": got, "want": 480}
        ok &= got == 480
        print(f"chunked: a 640-token prompt computed 256 tokens a step; a request sharing 480 of them "
              f"matched {got} from tutti (want 480)")
        for i, t in enumerate(longs):
            R.add(f"long{i}", t, max_tokens=700)
        R.run()
        res["checks"]["preempt"] = {"preemptions": R.preemptions,
                                    "finished": sum(f"long{i}" in R.finished for i in range(3))}
        print(f"preempt: {R.preemptions} preemptions, {res['checks']['preempt']['finished']} of 3 long requests finished")
        ok &= R.preemptions > 0 and res["checks"]["preempt"]["finished"] == 3
        R.add("abort-prefill", ab1)
        R.add("abort-first-token", ab2, max_tokens=20)
        R.run(abort={"abort-prefill": lambda s, r: r.num_computed_tokens > 0,
                     "abort-first-token": lambda s, r: r.num_output_tokens > 0})
        res["checks"]["abort"] = {"aborted": 2}
        print("abort: one request aborted mid-prefill, one after its first token")
    else:
        R.add("doc-restart", doc + q2)
        for i, t in enumerate(longs):
            R.add(f"long{i}-restart", t[:560] + toks(rng, 30))
        R.run()
        got = {r: R.external_tokens(r) for r in ["doc-restart"] + [f"long{i}-restart" for i in range(3)]}
        res["checks"]["restart"] = got
        print(f"restart: a new process (PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED')}) matched {got} tokens from tutti")
        ok &= got["doc-restart"] == 592 and all(v > 0 for v in got.values())
    R.worker.shutdown()  # the check mode's summary is written at close
    ok &= check_mode(a, res, need_match=a.phase != "first")
    res["verified_tokens"] = R.verified_tokens
    res["waited_remote"] = sorted(R.waited_remote)
    res["stats"] = {k: R.stats[k] for k in ("save_ends_deferred", "save_end_reuses", "save_end_waits", "save_end_wait_s")}
    res["bad"] = R.bad
    ok &= not R.bad
    print(f"{a.phase}: {R.verified_tokens} computed-or-restored tokens verified in every layer, {len(R.bad)} wrong")
    return finish(a, res, ok, R.bad)

if __name__ == "__main__":
    sys.exit(main())
