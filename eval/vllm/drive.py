"""Drive real vLLM (0.26, offline, dummy weights) through a fixed request
schedule, with or without tutti's connector, and write what happened as JSON.

One process is one vLLM engine. eval/vllm/run.sh starts one per phase:

  baseline  no connector; every request of the first and second phases, in
            their order, in one engine: the reference outputs
  first     tutti's connector: long documents prefilled in chunks several
            times the step's token budget, enough at once to preempt, two
            aborted requests (mid-prefill and after the first token), then
            more questions on the same documents once the GPU's own prefix
            cache has dropped them (tutti restores them)
  second    a new process after the first exited, no extra environment: more
            questions on the same documents, which only tutti still holds
  ttft      time to first token of a restored prefix: the documents are
            prefilled, the GPU's prefix cache is reset (a connector keeps
            its copy), then one question per document, one request at a
            time; run with no connector (recompute), tutti, and vLLM's
            OffloadingConnector (``--connector offloading``: its CPU tier);
            with no connector and ``--ttft-reset off`` the questions hit
            vLLM's own cache instead (the control of a restore)

The workload is seeded token ids (no tokenizer): ``--docs`` documents of
``--doc-tokens`` tokens, each asked ``--questions`` questions of
``--question-tokens`` tokens, greedy decoding of ``--max-tokens`` tokens with
the top logprobs kept, so two runs can be compared token by token and, where
they part, logit by logit.

Weights: vLLM's dummy loader draws every weight from U(-1e-3, 1e-3), which
makes the logits of every token nearly equal (greedy outputs would agree or
disagree by accident). ``--init normal`` redraws them in the engine, from a
seed per parameter name, as N(0, 0.02) with norms at 1: the same model in
every process, with logits that separate tokens. That needs the engine in
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set here); ``--init dummy``
keeps vLLM's default process layout and weights.

With VLLM_BATCH_INVARIANT=1 in the environment, vLLM's batch-invariant kernels
(attention backends that support them: FlashAttention, not the Mamba ones)
make a token's logits independent of its batch; the result records it
(``batch_invariant``), and compare.py and ttft_table.py then require runs that
both had them to agree bit for bit, against recompute too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="directory with a config.json (dummy weights)")
    p.add_argument("--phase", required=True, choices=("baseline", "first", "second", "ttft"))
    p.add_argument("--out", required=True, help="JSON file this run writes")
    p.add_argument("--connector", default="none", choices=("none", "tutti", "offloading"))
    p.add_argument("--offload-gib", type=float, default=8, help="--connector offloading: its CPU tier's size")
    p.add_argument("--settle-s", type=float, default=3, help="ttft: wait after the prefill wave (saves commit)")
    p.add_argument("--extra-config", default="{}", help="tutti's kv_connector_extra_config, JSON")
    p.add_argument("--init", default="normal", choices=("normal", "dummy"))
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--docs", type=int, default=4)
    p.add_argument("--doc-tokens", type=int, default=6144)
    p.add_argument("--questions", type=int, default=3, help="per document; the last one runs in the second phase")
    p.add_argument("--question-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--logprobs", type=int, default=5)
    p.add_argument("--budget-tokens", type=int, default=2048, help="max_num_batched_tokens: the step's token budget")
    p.add_argument("--gpu-blocks", type=int, default=1024, help="num_gpu_blocks_override: the GPU prefix cache")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--additional-config", default="{}",
                   help="vLLM's additional_config, JSON (a model's kernel choice, say)")
    p.add_argument("--max-steps", type=int, default=20000, help="bound on engine steps per wave")
    p.add_argument("--ttft-reset", default="on", choices=("on", "off"),
                   help="ttft: empty vLLM's prefix cache before the questions (on), or keep it (off, no connector: "
                        "the questions hit vLLM's own cache; with --gpu-blocks that keeps every document, the control "
                        "a restore is compared with)")
    p.add_argument("--state-probe", action="store_true",
                   help="ttft: digests of the KV pages and states around each forward (eval/vllm/state_probe.py; "
                        "a diagnostic, not a timing run; needs --init normal)")
    p.add_argument("--reserve-full-isl", default="on", choices=("on", "off"),
                   help="vLLM's scheduler_reserve_full_isl: on (vLLM 0.26's default) admits a request only when its "
                        "whole prompt fits, so only decode growth preempts; off admits on the first chunk, so "
                        "chunked prefills of long prompts preempt one another")
    a = p.parse_args(argv)
    if a.questions < 2:
        p.error("--questions must be at least 2 (one for each phase)")
    if a.ttft_reset == "off" and (a.phase != "ttft" or a.connector != "none"):
        p.error("--ttft-reset off: the ttft phase with no connector (vLLM's own cache is the control)")
    if a.state_probe and (a.phase != "ttft" or a.init != "normal"):
        p.error("--state-probe needs --phase ttft and --init normal (the engine in this process)")
    if a.doc_tokens + a.question_tokens + a.max_tokens > a.max_model_len:
        p.error("--doc-tokens + --question-tokens + --max-tokens exceed --max-model-len")
    return a


def workload(a, vocab: int):
    """The schedule: a list of waves, each a list of (request id, token ids,
    action); the same for every backend. Token ids avoid the first and last
    thousand ids (special tokens live there in real vocabularies)."""
    rng = random.Random(a.seed)
    lo, hi = 1000, vocab - 1000

    def toks(n):
        return [rng.randrange(lo, hi) for _ in range(n)]

    docs = [toks(a.doc_tokens) for _ in range(a.docs)]
    qs = [[toks(a.question_tokens) for _ in range(a.questions)] for _ in range(a.docs)]
    extra = toks(a.doc_tokens)  # a document only aborted requests and the second phase see
    first = [
        [(f"d{d}q0", docs[d] + qs[d][0], "run") for d in range(a.docs)],
        [("x-abort-prefill", extra + toks(a.question_tokens), "abort-after-step:2"),
         (f"d0q1-abort-first-token", docs[0] + toks(a.question_tokens), "abort-after-first-token")],
    ]
    for k in range(1, a.questions - 1):
        first.append([(f"d{d}q{k}", docs[d] + qs[d][k], "run") for d in range(a.docs)])
    second = [[(f"d{d}q{a.questions - 1}", docs[d] + qs[d][a.questions - 1], "run") for d in range(a.docs)]
              + [("x-after", extra + toks(a.question_tokens), "run")]]
    return first, second


def reinit_weights(model):
    """N(0, 0.02) for matrices, 1 for norms, 0 for biases, from a seed per
    parameter name: the same model in every process (see the module doc)."""
    import torch

    with torch.no_grad():
        for name, prm in model.named_parameters():
            if not torch.is_floating_point(prm):
                continue
            g = torch.Generator(device=prm.device)
            g.manual_seed(zlib.crc32(name.encode()))
            if "norm" in name and prm.dim() == 1:
                prm.fill_(1.0)
            elif name.endswith("bias"):
                prm.zero_()
            else:
                t = torch.empty(prm.shape, dtype=torch.float32, device=prm.device)
                t.normal_(0.0, 0.02, generator=g)
                prm.copy_(t.to(prm.dtype))
    return sum(p.numel() for p in model.parameters())


def metrics_of(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        v = getattr(m, "value", None)
        if v is None and hasattr(m, "count"):
            v = {"count": m.count, "sum": m.sum}
        if v is None:
            continue
        key = m.name + ("" if not m.labels else "{" + ",".join(f"{k}={x}" for k, x in sorted(m.labels.items())
                                                               if k not in ("model_name", "engine")) + "}")
        if isinstance(v, dict):
            out[key] = v
        else:
            out[key] = out.get(key, 0) + v
    return out


def abort_now(action: str, steps: int, started: bool) -> bool:
    """Whether a wave's request with this action (workload's third field) is
    aborted after step ``steps``; ``started``: it has its first token."""
    return action == f"abort-after-step:{steps}" or (action == "abort-after-first-token" and started)


def run_wave(engine, wave, sp, max_steps):
    """Adds the wave's requests, steps the engine until all finish or abort.
    Returns {request id: record}."""
    from vllm.inputs import TokensPrompt

    recs = {}
    t0 = time.monotonic()
    for rid, toks, action in wave:
        engine.add_request(rid, TokensPrompt(prompt_token_ids=toks), sp)
        recs[rid] = {"prompt_tokens": len(toks), "action": action, "added_s": time.monotonic() - t0}
    steps = 0
    live = set(recs)
    while live and steps < max_steps:
        outs = engine.step()
        steps += 1
        for o in outs:
            r = recs.get(o.request_id)
            if r is None:
                continue
            if "first_token_s" not in r and o.outputs and o.outputs[0].token_ids:
                r["first_token_s"] = time.monotonic() - t0
                r["num_cached_tokens"] = o.num_cached_tokens
            if o.finished:
                c = o.outputs[0]
                r["tokens"] = list(c.token_ids)
                r["finish_reason"] = c.finish_reason
                r["num_cached_tokens"] = o.num_cached_tokens
                if c.logprobs:
                    r["top"] = [sorted(((tid, lp.logprob) for tid, lp in pos.items()), key=lambda x: -x[1])
                                for pos in c.logprobs]
                live.discard(o.request_id)
        for rid in list(live):
            if abort_now(recs[rid]["action"], steps, "first_token_s" in recs[rid]):
                engine.abort_request([rid])
                recs[rid]["aborted_at_step"] = steps
                live.discard(rid)
    if live:
        raise RuntimeError(f"wave did not finish in {max_steps} steps: {sorted(live)}")
    return recs, steps, time.monotonic() - t0


def record_zero_output_steps(engine) -> bool:
    """vLLM 0.26's LLMEngine.step records a step's scheduler stats only when
    the step has request outputs (fixed later upstream, vllm#48668), so a step
    of prefill chunks alone loses them: its connector's counters and vLLM's
    own connector hits. Records those steps' stats too, on an engine that
    needs it; returns whether it did."""
    import inspect

    from vllm.v1.engine.llm_engine import LLMEngine

    if engine.logger_manager is None or "len(outputs.outputs) > 0" not in inspect.getsource(LLMEngine.step):
        return False
    core, get = engine.engine_core, engine.engine_core.get_output

    def get_output():
        out = get()
        if out.scheduler_stats is not None and not out.outputs:
            engine.logger_manager.record(scheduler_stats=out.scheduler_stats, iteration_stats=None,
                                         engine_idx=out.engine_index)
        return out

    core.get_output = get_output
    return True


def kv_groups_of(llm) -> list:
    """The engine's KV cache groups (the hybrid manager's), as names."""
    try:
        cfg = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config  # the engine in this process
    except AttributeError:
        return []
    return [{"spec": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names),
             "sliding_window": getattr(g.kv_cache_spec, "sliding_window", None),
             "block_size": g.kv_cache_spec.block_size} for g in cfg.kv_cache_groups]


RESET_MAX_STEPS = 200


def reset_prefix_cache(llm, engine) -> int:
    """Empties vLLM's GPU prefix cache, stepping the engine until it can: a
    reset fails while any block is held, and with a connector and async
    scheduling vLLM 0.26 frees a finished request's blocks only once the
    step in flight after its last one is processed (Scheduler.deferred_frees),
    which the wave's end leaves unprocessed. Returns the engine steps it
    took; raises when it never could (the TTFTs would then measure vLLM's own
    cache, not the restores)."""
    for i in range(RESET_MAX_STEPS):
        if llm.reset_prefix_cache():
            return i
        engine.step()
        time.sleep(0.01)
    raise RuntimeError(f"vLLM's prefix cache could not be reset in {RESET_MAX_STEPS} engine steps: blocks still held")


def metric_total(metrics: dict, name: str):
    """The sum of every series of ``name`` in metrics_of's dict, whatever
    its labels (histograms left out)."""
    return sum(v for k, v in metrics.items() if k.split("{")[0] == name and not isinstance(v, dict))


def hit_counts(llm) -> dict:
    """vLLM's own prefix-cache hits and a connector's (tokens), so far."""
    m = metrics_of(llm)
    return {k: metric_total(m, f"vllm:{k}") for k in ("prefix_cache_hits", "external_prefix_cache_hits")}


def ttft_phase(a, llm, vocab, res, probe=None) -> int:
    """See the module doc: TTFT of each document's question, one at a time,
    after the documents were prefilled and the GPU's prefix cache reset;
    ``probe``: a state_probe.Probe whose records the result carries."""
    from vllm import SamplingParams

    rng = random.Random(a.seed)
    lo, hi = 1000, vocab - 1000
    docs = [[rng.randrange(lo, hi) for _ in range(a.doc_tokens)] for _ in range(a.docs)]
    qs = [[rng.randrange(lo, hi) for _ in range(a.question_tokens)] for _ in range(2 * a.docs)]
    sp = SamplingParams(temperature=0.0, max_tokens=1, logprobs=a.logprobs, ignore_eos=True)
    engine = llm.llm_engine
    recs, steps, secs = run_wave(engine, [(f"d{d}-prefill", docs[d] + qs[d], "run") for d in range(a.docs)], sp,
                                 a.max_steps)
    res["requests"].update(recs)
    time.sleep(a.settle_s)
    # --ttft-reset off (no connector): the questions hit vLLM's own cache, where the prefill left the same KV a
    # connector restores: outputs a restore must give bit for bit (a cache large enough to keep every document)
    res["prefix_cache_reset_steps"] = reset_prefix_cache(llm, engine) if a.ttft_reset == "on" else None
    ttft = []
    for d in range(a.docs):
        before = hit_counts(llm)
        r, _, _ = run_wave(engine, [(f"d{d}-ttft", docs[d] + qs[a.docs + d], "run")], sp, a.max_steps)
        after = hit_counts(llm)
        res["requests"].update(r)
        rec = r[f"d{d}-ttft"]
        ttft.append({"request": f"d{d}-ttft", "ttft_s": rec.get("first_token_s"),
                     "cached": rec.get("num_cached_tokens"), "tokens": rec.get("tokens"), "top": rec.get("top"),
                     "hits": {k: after[k] - before.get(k, 0) for k in after}})
    res["ttft"] = ttft
    if probe is not None:
        res["state_probe"], res["state_probe_dropped"] = probe.records, probe.dropped
        res["state_probe_error"] = probe.error
    res["metrics"] = metrics_of(llm)
    with open(a.out, "w") as f:
        json.dump(res, f)
    vals = sorted(t["ttft_s"] for t in ttft if t["ttft_s"] is not None)
    print(f"[ttft] {a.connector}: TTFT per document {[round(v * 1000, 1) for v in vals]} ms, "
          f"cached tokens {[t['cached'] for t in ttft]}", flush=True)
    del llm
    return 0


def main(argv=None):
    a = parse_args(argv)
    if a.init == "normal":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # FlashInfer is not staged (it fetches kernels at run time): without this,
    # vLLM 0.26's sampler imports it to ask whether it may sample with it.
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t_import = time.monotonic()
    import vllm.envs as vllm_envs
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw = {}
    if a.connector == "tutti":
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm", kv_role="kv_both",
            kv_connector_extra_config=json.loads(a.extra_config))
    elif a.connector == "offloading":
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": int(a.offload_gib * (1 << 30))})
    t_start = time.monotonic()
    llm = LLM(model=a.model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              compilation_config={"mode": 0}, max_model_len=a.max_model_len,
              max_num_batched_tokens=a.budget_tokens, enable_chunked_prefill=True,
              num_gpu_blocks_override=a.gpu_blocks, block_size=a.block_size, seed=a.seed,
              disable_log_stats=False, gpu_memory_utilization=0.85,
              scheduler_reserve_full_isl=a.reserve_full_isl == "on", enable_prefix_caching=True,
              additional_config=json.loads(a.additional_config), **kw)
    res = {"phase": a.phase, "connector": a.connector, "model": os.path.basename(a.model.rstrip("/")),
           "args": vars(a), "import_s": t_start - t_import, "engine_start_s": time.monotonic() - t_start,
           "pythonhashseed": os.environ.get("PYTHONHASHSEED"), "requests": {}, "waves": []}
    if a.init == "normal":
        res["params"] = llm.apply_model(reinit_weights)[0]
    res["zero_output_stats_recorded"] = record_zero_output_steps(llm.llm_engine)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    res["block_size"] = llm.llm_engine.vllm_config.cache_config.block_size
    # vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1): a token's logits do not depend on its batch, so
    # runs that both had them must agree bit for bit (compare.py, ttft_table.py).
    res["batch_invariant"] = bool(vllm_envs.VLLM_BATCH_INVARIANT)
    res["kv_cache_groups"] = kv_groups_of(llm)
    if a.phase == "ttft":
        probe = None
        if a.state_probe:
            import state_probe

            probe = state_probe.install(llm)
        return ttft_phase(a, llm, vocab, res, probe)
    first, second = workload(a, vocab)
    waves = {"baseline": first + second, "first": first, "second": second}[a.phase]
    sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, logprobs=a.logprobs, ignore_eos=True)
    engine = llm.llm_engine
    for i, w in enumerate(waves):
        recs, steps, secs = run_wave(engine, w, sp, a.max_steps)
        res["requests"].update(recs)
        res["waves"].append({"requests": [r for r, _, _ in w], "steps": steps, "s": secs})
        print(f"[{a.phase}] wave {i}: {len(w)} requests, {steps} steps, {secs:.2f} s", flush=True)
    res["metrics"] = metrics_of(llm)
    with open(a.out, "w") as f:
        json.dump(res, f)
    print(f"[{a.phase}] engine start {res['engine_start_s']:.1f} s; metrics: "
          + ", ".join(f"{k}={v}" for k, v in res["metrics"].items()
                      if any(s in k for s in ("prefix_cache", "preemption", "tutti", "kv_offload"))), flush=True)
    del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
