"""tutti's connector under vLLM's own scheduler with its hybrid KV cache
manager on (several KV cache groups), on a machine without a GPU.

As eval/vllm/sched_cpu.py does for one group: vLLM 0.26's real Scheduler,
hybrid KV cache coordinator (full attention, sliding window, Mamba in
"align" mode) and block hashing run the connector's scheduler role; this
script plays the model runner on the CPU in vLLM's order, with vLLM's hybrid
layouts (attention blocks-first, a Mamba layer's states as views of one page
per block).

The stand-in model: an attention layer's K and V at a position are a
function of the prefix up to it and of the layer (exact in float16); a Mamba
layer's state after c tokens is a function of the prefix of c tokens. Each
step first copies a request's state as vLLM's align mode does, before the
connector's load starts: from the block it was in (block ceil(c/B) - 1 of
the group's table for a request starting at c computed tokens, a restored
state's block) into the block the step runs it in, block ceil((c+n)/B) - 1;
it reads and checks the state there, then writes the state after the step
there. Before a request first
computes, every full-attention token and every sliding-window token inside
the window of the next token must hold its prefix's values. So every block
and state restored from tutti is checked.

Scenarios: chunked (a prompt computed over several steps, then one sharing
most of it after the GPU prefix cache is reset), preempt, restart (a new
process), evict-state, ttft (drive.py's), mixed (a hit in vLLM's own cache
extended by tutti's). ``--groups`` picks the groups, e.g. ``full,sliding:48,state``
(every kind) or ``full,sliding:48`` (a gpt-oss/Gemma-3-shaped model).
"""

from __future__ import annotations

import argparse
import os
import random
import sys

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import vllm.platforms as _platforms  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

_platforms._current_platform = CpuPlatform()

from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig,  # noqa: E402
                         VllmConfig, set_current_vllm_config)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import get_forward_context, set_forward_context  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,  # noqa: E402
                                        MambaSpec, SlidingWindowSpec)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from sched_common import HEAD, HEADS, MOD, check_mode, expect_kv, finish, init_one_worker, prefix_hashes, step_tables  # noqa: E402

PER_GROUP = 2
CONV, SSM = (4, 128), (2, 32, 16)  # a Mamba layer's states: float16 conv, float32 ssm (5120 bytes, padded)


def cdiv(a, b):
    return -(-a // b)


class Runner:
    def __init__(self, a, extra, kinds):
        self.a, self.kinds = a, kinds
        bs = a.block_size
        mc = ModelConfig(model=a.model, skip_tokenizer_init=True, max_model_len=a.max_model_len, dtype="float16")
        sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=a.budget_tokens, max_model_len=a.max_model_len,
                             enable_chunked_prefill=True, is_encoder_decoder=False, async_scheduling=False)
        has_state = any(k == "state" for k, _ in kinds)
        cc = CacheConfig(block_size=bs, enable_prefix_caching=True,
                         mamba_cache_mode="align" if has_state else "none")
        kt = KVTransferConfig(kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm",
                              kv_role="kv_both", kv_connector_extra_config=extra)
        self.vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc, kv_transfer_config=kt)
        page = bs * HEADS * HEAD * 2 * 2
        groups, self.layers = [], []  # layers: (name, group, kind, index in kind)
        for g, (kind, w) in enumerate(kinds):
            names = [f"model.layers.{g * PER_GROUP + i}.{kind}" for i in range(PER_GROUP)]
            if kind == "full":
                spec = FullAttentionSpec(block_size=bs, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16)
            elif kind == "sliding":
                spec = SlidingWindowSpec(block_size=bs, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16,
                                         sliding_window=w)
            else:
                spec = MambaSpec(block_size=bs, shapes=(CONV, SSM), dtypes=(torch.float16, torch.float32),
                                 page_size_padded=page, mamba_cache_mode="align")
            groups.append(KVCacheGroupSpec(names, spec))
            self.layers += [(n, g, kind, i) for i, n in enumerate(names)]
        self.kcc = KVCacheConfig(num_blocks=a.blocks, kv_cache_tensors=[], kv_cache_groups=groups)
        cc.num_gpu_blocks = a.blocks
        self.kv, self.raw = {}, {}
        for n, g, kind, _ in self.layers:
            raw = torch.zeros(a.blocks * page, dtype=torch.uint8)
            self.raw[n] = raw
            if kind == "state":  # vLLM's MambaSpec views: state i after the ones before it, one page per block
                conv = torch.as_strided(raw.view(torch.float16), (a.blocks, *CONV), (page // 2, CONV[1], 1), 0)
                ssm = torch.as_strided(raw.view(torch.float32), (a.blocks, *SSM), (page // 4, SSM[1] * SSM[2], SSM[2], 1),
                                       CONV[0] * CONV[1] * 2 // 4)
                self.kv[n] = [conv, ssm]
            else:  # blocks-first, as vLLM lays attention out next to Mamba layers
                self.kv[n] = raw.view(torch.float16).view(a.blocks, 2, bs, HEADS, HEAD)
        with set_current_vllm_config(self.vc):
            init_one_worker()
            self.worker = KVConnectorFactory.create_connector(self.vc, KVConnectorRole.WORKER, self.kcc)
            self.worker.register_kv_caches(self.kv)
            self.sched = Scheduler(vllm_config=self.vc, kv_cache_config=self.kcc,
                                   structured_output_manager=StructuredOutputManager(self.vc),
                                   block_size=bs, log_stats=True)
        hash_fn = get_hash_fn_by_name(cc.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(bs, hash_fn)
        self.tables: dict[str, list[list[int]]] = {}
        self.first_computed: dict[str, int] = {}
        self.state_idx: dict[str, int] = {}  # the block index each request's state runs in (vLLM's mamba_state_idx)
        self.verified = {"full": 0, "sliding": 0, "state": 0}
        self.bad: list[str] = []
        self.preempted: dict[str, int] = {}
        self.finished: dict[str, str] = {}

    @staticmethod
    def expect_state(h, layer):
        conv = ((h + 13 * layer + torch.arange(CONV[0] * CONV[1])) % MOD).to(torch.float16).view(CONV)
        ssm = ((h * 3 + layer + torch.arange(SSM[0] * SSM[1] * SSM[2])) % 1000003).to(torch.float32).view(SSM)
        return conv, ssm

    def _bad(self, msg):
        if len(self.bad) < 64:
            self.bad.append(msg)

    def verify_first(self, rid, hashes, nc):
        """Before rid first computes: its computed prefix (vLLM's and tutti's)
        in every full layer, the window of the next token in every sliding
        layer (the state is checked by every step)."""
        if nc == 0:
            return
        bs = self.a.block_size
        for n, g, kind, i in self.layers:
            if kind == "state":
                continue
            lo = 0 if kind == "full" else max(0, nc - self.kinds[g][1] + 1)
            t = self.tables[rid][g]
            pos = list(range(lo, nc))
            if any(t[p // bs] == 0 for p in pos):
                self._bad(f"{rid}: {kind} layer {n}: a null block inside what it attends to at {nc}")
                continue
            blk, off = torch.tensor([t[p // bs] for p in pos]), torch.tensor(pos) % bs
            k, v = expect_kv(hashes, g * PER_GROUP + i, lo, nc)
            if not (torch.equal(self.kv[n][blk, 0, off], k) and torch.equal(self.kv[n][blk, 1, off], v)):
                self._bad(f"{rid}: {kind} layer {n}: tokens [{lo}, {nc}) hold the wrong KV")
                continue
            self.verified[kind] += nc - lo

    def preprocess_states(self, work, sched):
        """vLLM's align mode before the step's forward, and before the
        connector's start_load_kv (gpu_model_runner.py: preprocess_mamba):
        each request's state is copied from the block it was in (a new or
        resumed request's: block ceil(c/B) - 1 of its c computed tokens, a
        connector's restored state among them) into the block this step
        runs it in, block ceil((c+n)/B) - 1."""
        bs = self.a.block_size
        for rid, nc, first in work:
            prev = (nc - 1) // bs if first else self.state_idx.get(rid, (nc - 1) // bs)
            curr = cdiv(nc + sched[rid], bs) - 1
            self.state_idx[rid] = curr
            if prev < 0 or prev == curr:
                continue
            for n, g, kind, _ in self.layers:
                if kind == "state":
                    t = self.tables[rid][g]
                    for x in self.kv[n]:
                        x[t[curr]] = x[t[prev]]

    def compute(self, rid, hashes, nc, n_new):
        bs = self.a.block_size
        for n, g, kind, i in self.layers:
            t = self.tables[rid][g]
            li = g * PER_GROUP + i
            if kind == "state":
                conv, ssm = self.kv[n]
                b = t[self.state_idx[rid]]  # the state runs in its block of this step (preprocess_states)
                if nc > 0:
                    ec, es = self.expect_state(hashes[nc - 1], li)
                    if b == 0 or not (torch.equal(conv[b], ec) and torch.equal(ssm[b], es)):
                        self._bad(f"{rid}: state layer {n}: the state after {nc} tokens (block {b}) is wrong")
                    else:
                        self.verified["state"] += 1
                conv[b], ssm[b] = self.expect_state(hashes[nc + n_new - 1], li)
                continue
            k, v = expect_kv(hashes, li, nc, nc + n_new)
            pos = torch.arange(nc, nc + n_new)
            blk = torch.tensor([t[p // bs] for p in range(nc, nc + n_new)])
            self.kv[n][blk, 0, pos % bs] = k
            self.kv[n][blk, 1, pos % bs] = v

    def step(self):
        so = self.sched.schedule()
        w, reqs = self.worker, self.sched.requests
        for rid, r in reqs.items():
            self.preempted[rid] = max(self.preempted.get(rid, 0), r.num_preemptions)
        work = step_tables(so, self.tables, len(self.kinds))
        hashes = {rid: prefix_hashes(reqs[rid].all_token_ids[:nc + so.num_scheduled_tokens[rid]])
                  for rid, nc, _ in work}
        self.preprocess_states(work, so.num_scheduled_tokens)
        with set_current_vllm_config(self.vc), set_forward_context(None, self.vc):
            w.bind_connector_metadata(so.kv_connector_metadata)
            w.start_load_kv(get_forward_context())
            for n, _, kind, _ in self.layers:
                if kind != "state":
                    w.wait_for_layer_load(n)
            for rid, nc, first in work:
                if first:
                    self.first_computed.setdefault(rid, nc)
                    self.verify_first(rid, hashes[rid], nc)
                self.compute(rid, hashes[rid], nc, so.num_scheduled_tokens[rid])
            for n, _, kind, _ in self.layers:
                if kind != "state":
                    w.save_kv_layer(n, self.kv[n], None)
            w.wait_for_save()
            sending, recving = w.get_finished(so.finished_req_ids)
            invalid = w.get_block_ids_with_load_errors()
            w.clear_connector_metadata()
        if invalid:
            self._bad(f"load errors: blocks {sorted(invalid)[:8]}")
        sampled, ids = [], []
        for rid, nc, _ in work:
            r = reqs[rid]
            ids.append(rid)
            sampled.append([hashes[rid][-1] % 30000 + 1000] if nc + so.num_scheduled_tokens[rid] >= r.num_tokens else [])
        out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
                                kv_connector_output=KVConnectorOutput(finished_sending=sending, finished_recving=recving,
                                                                      invalid_block_ids=invalid))
        eco = self.sched.update_from_output(so, out)
        for o in (eco.get(0).outputs if eco.get(0) is not None else []):
            if o.finish_reason is not None:
                self.finished[o.request_id] = str(o.finish_reason)

    def add(self, rid, tokens, max_tokens=4):
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.sched.add_request(Request(rid, tokens, sp, None, block_hasher=self.hasher))

    def run(self, max_steps=5000):
        for s in range(max_steps):
            if not self.sched.has_requests():
                return s
            self.step()
        raise RuntimeError(f"requests left after {max_steps} steps")

    def settle(self):
        self.worker._worker.store.wait_saves()


def toks(rng, n, vocab=120000):
    return [rng.randrange(1000, vocab) for _ in range(n)]


def parse_groups(s):
    out = []
    for part in s.split(","):
        kind, _, w = part.partition(":")
        if kind not in ("full", "sliding", "state") or (kind == "sliding") != bool(w):
            raise SystemExit(f"--groups {s!r}: want full, sliding:WINDOW or state, comma-separated")
        out.append((kind, int(w) if w else 0))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--phase", choices=("first", "restart", "evict-state", "ttft", "mixed"), required=True)
    p.add_argument("--doc-tokens", type=int, default=384, help="ttft: tokens of each of 4 documents")
    p.add_argument("--question-tokens", type=int, default=8, help="ttft: tokens of each question")
    p.add_argument("--groups", default="full,sliding:48,state")
    p.add_argument("--json", default="")
    p.add_argument("--budget-tokens", type=int, default=256)
    p.add_argument("--blocks", type=int, default=200)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=4096)
    a = p.parse_args(argv)
    kinds = parse_groups(a.groups)
    extra = {"dirs": [a.dir], "capacity_bytes": 1 << 30, "path": "cpu", "check": {"dir": a.dir + "-check"}}
    rng = random.Random(11)
    doc, q1, q2 = toks(rng, 600), toks(rng, 40), toks(rng, 40)
    longs = [toks(rng, 600) for _ in range(3)]
    R = Runner(a, extra, kinds)
    has_state = any(k == "state" for k, _ in kinds)
    res, ok = {"phase": a.phase, "groups": a.groups, "checks": {}}, True
    # vLLM 0.26 with a connector takes its own hit group by group (docs/vllm.md): a request it resumes with a
    # group's part gone (a preempted one, its states evicted first when the state groups come first, as
    # Qwen3-Next's do) reads its null block's state. tutti counts such requests (engine_hit_incomplete); their
    # wrong states are vLLM's, told apart below.
    conn, seen, flagged = R.sched.connector, {}, set()
    take, ask = conn.get_kv_connector_stats, conn.get_num_new_matched_tokens

    def stats():
        st = take()
        for k, v in (st.data if st is not None else {}).items():
            seen[k] = seen.get(k, 0) + v
        return st

    asked = {}  # request -> (vLLM's own hit, tutti's) at its last lookup

    def lookup(request, num_computed_tokens):
        out = ask(request, num_computed_tokens)
        asked[request.request_id] = (num_computed_tokens, out[0])
        if request.request_id in conn._incomplete:
            flagged.add(request.request_id)
        return out
    conn.get_kv_connector_stats, conn.get_num_new_matched_tokens = stats, lookup
    # vLLM keeps its hybrid manager on (on a GPU platform) only for a connector it says supports it.
    res["supports_hma"] = bool(KVConnectorFactory.supports_hma_config(R.vc.kv_transfer_config))
    ok &= res["supports_hma"]
    if a.phase == "first":
        R.add("doc", doc + q1)
        R.run()
        R.settle()
        ok &= R.sched.reset_prefix_cache()  # else the hits below would be vLLM's own
        R.add("doc-again", doc[:480] + q2)
        R.run()
        got = R.external_tokens = R.first_computed.get("doc-again", 0)
        # 256 tokens a step: the states kept are at 256, 512 and 640 tokens; of the 480 shared, a hit can end at 256
        want = 256 if has_state else 480
        res["checks"]["chunked"] = {"matched": got, "want": want}
        ok &= got == want
        print(f"chunked: a request sharing 480 tokens of a prompt computed 256 a step matched {got} from tutti (want {want})")
        for i, t in enumerate(longs):
            R.add(f"long{i}", t, max_tokens=700)
        R.run()
        pre = sum(R.preempted.values())
        fin = sum(f"long{i}" in R.finished for i in range(3))
        res["checks"]["preempt"] = {"preemptions": pre, "finished": fin}
        print(f"preempt: {pre} preemptions, {fin} of 3 long requests finished")
        ok &= pre > 0 and fin == 3
    elif a.phase == "evict-state":
        # vLLM 0.26 with a connector takes its own hit group by group (docs/vllm.md): the attention blocks of
        # "doc" still there, its states evicted, tutti holding no state past the hit: vLLM resumes "doc-again"
        # from its null block's bytes (the states read are wrong: vLLM's), and tutti counts it.
        from vllm.v1.core.kv_cache_utils import get_group_id
        R.add("doc", doc + q1)
        R.run()
        R.settle()
        bp = R.sched.kv_cache_manager.block_pool
        bp.evict_blocks({b.block_id for b in bp.blocks
                         if b.block_hash is not None and kinds[get_group_id(b.block_hash)][0] == "state"})
        R.add("doc-again", doc[:480] + q2)
        R.run()
        n = seen.get("engine_hit_incomplete", 0)
        vllms = [b for b in R.bad if b.startswith("doc-again: state layer")]
        res["checks"]["evict-state"] = {"engine_hit_incomplete": n, "vllm_wrong_states": len(vllms),
                                        "resumed_at": R.first_computed.get("doc-again")}
        print(f"evict-state: vLLM resumed doc-again at {R.first_computed.get('doc-again')} tokens with its states "
              f"evicted: {len(vllms)} wrong states read (vLLM's), tutti counted {n}")
        ok &= n == 1 and len(vllms) > 0 and flagged == {"doc-again"}
    elif a.phase == "mixed":
        # A question that finds its document's first blocks in vLLM's own cache and the rest in tutti's: the
        # document prefilled in steps, vLLM's blocks of it from chain block 14 on evicted, then the question.
        from vllm.v1.core.kv_cache_utils import get_block_hash
        d = toks(rng, a.doc_tokens)
        R.add("doc", d + toks(rng, a.question_tokens), max_tokens=1)
        tail = set(R.sched.requests["doc"].block_hashes[14:])
        R.run()
        R.settle()
        bp = R.sched.kv_cache_manager.block_pool
        bp.evict_blocks({b.block_id for b in bp.blocks if b.block_hash is not None and get_block_hash(b.block_hash) in tail})
        R.add("doc-again", d + toks(rng, a.question_tokens), max_tokens=1)
        R.run()
        local, ext = asked.get("doc-again", (0, 0))
        res["checks"]["mixed"] = {"vllm_hit": local, "tutti_hit": ext}
        print(f"mixed: the question found {local} tokens in vLLM's cache and {ext} more in tutti's")
        ok &= 0 < local and ext > 0
    elif a.phase == "ttft":
        # eval/vllm/drive.py's ttft phase: 4 documents (with a question each) that do not all fit the GPU
        # cache prefilled together, the prefix cache reset, then one question per document, one at a time.
        docs = [toks(rng, a.doc_tokens) for _ in range(4)]
        qs = [toks(rng, a.question_tokens) for _ in range(8)]
        for d in range(4):
            R.add(f"d{d}-prefill", docs[d] + qs[d], max_tokens=1)
        R.run()
        R.settle()
        ok &= R.sched.reset_prefix_cache()  # else the hits below would be vLLM's own
        for d in range(4):
            R.add(f"d{d}-ttft", docs[d] + qs[4 + d], max_tokens=1)
            R.run()
        got = {f"d{d}": R.first_computed.get(f"d{d}-ttft", 0) for d in range(4)}
        res["checks"]["ttft"] = {"matched": got, "preemptions": sum(R.preempted.values())}
        print(f"ttft: {sum(R.preempted.values())} preemptions in the prefill; each question matched {got}")
    else:
        R.add("doc-restart", doc + q2)
        for i, t in enumerate(longs):
            R.add(f"long{i}-restart", t[:560] + toks(rng, 30))
        R.run()
        got = {r: R.first_computed.get(r, 0) for r in ["doc-restart"] + [f"long{i}-restart" for i in range(3)]}
        res["checks"]["restart"] = got
        want = 512 if has_state else 592
        print(f"restart: a new process matched {got} tokens from tutti (doc-restart: want {want})")
        ok &= got["doc-restart"] == want and all(v > 0 for v in got.values())
    R.worker.shutdown()  # the check mode's summary is written at close
    # capacity_bytes is the rank's: every group's store preallocates its share of it, not the whole.
    res["store_bytes"] = sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(a.dir) for f in fs)
    print(f"the groups' stores take {res['store_bytes']} bytes of a capacity of {extra['capacity_bytes']}")
    ok &= res["store_bytes"] <= extra["capacity_bytes"] + (16 << 20)  # + the stores' metadata
    ok &= check_mode(a, res, need_match=a.phase != "evict-state")  # evict-state restores nothing
    vllms = [b for b in R.bad if b.split(":", 1)[0] in flagged and ": state layer " in b]
    res["engine_hit_incomplete"], res["vllm_wrong_states"] = seen.get("engine_hit_incomplete", 0), len(vllms)
    if vllms:
        print(f"{a.phase}: {len(vllms)} wrong states read by requests vLLM resumed without them ({sorted(flagged)}): "
              f"vLLM's, not tutti's")
    ok &= res["engine_hit_incomplete"] == len(flagged)
    R.bad = [b for b in R.bad if b not in vllms]
    res["verified"], res["bad"] = R.verified, R.bad
    ok &= not R.bad
    print(f"{a.phase}: verified {R.verified} (full/sliding tokens before first compute, states read), {len(R.bad)} wrong")
    return finish(a, res, ok, R.bad)

if __name__ == "__main__":
    sys.exit(main())
