"""Does eval/vllm/drive.py's workload finish under vLLM 0.26's own scheduler
for a hybrid eval model, with the model's drive.args (its GPU block count)?
On a machine without a GPU: the model's KV cache groups as vLLM makes them
(eval/vllm/worker_cpu_hybrid.py's layer specs, vLLM's grouping), vLLM's
Scheduler with its hybrid manager, no connector (the baseline phase: every
wave of the first and second phases in one engine), a token sampled at each
prompt's end. A wave that never finishes means vLLM never admits a request
(the blocks of all the groups it needs at once do not fit), and the GPU run
would spin until drive.py's --max-steps. Prints, per wave, its steps and the
prompt tokens vLLM's own prefix cache served (what tutti then need not);
--json writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

import worker_cpu_hybrid as W  # noqa: E402 (sets vLLM's CPU platform first)

import drive  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import (get_kv_cache_config_from_groups, get_kv_cache_groups,  # noqa: E402
                                         get_request_block_hasher, init_none_hash)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402


def fit(model: str, max_steps: int = 5000) -> dict:
    d = os.path.join(W.MODELS, model)
    args_path = os.path.join(d, "drive.args")
    extra = shlex.split(open(args_path).read()) if os.path.exists(args_path) else []
    a = drive.parse_args(["--model", d, "--phase", "baseline", "--out", os.devnull, *extra])
    mc = ModelConfig(model=d, skip_tokenizer_init=True, max_model_len=a.max_model_len, dtype="bfloat16")
    sc = SchedulerConfig(max_num_batched_tokens=a.budget_tokens, max_model_len=a.max_model_len,
                         enable_chunked_prefill=True, is_encoder_decoder=False, async_scheduling=False,
                         scheduler_reserve_full_isl=a.reserve_full_isl == "on")
    cc = CacheConfig(block_size=a.block_size, enable_prefix_caching=True, num_gpu_blocks_override=a.gpu_blocks)
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc)
    with set_current_vllm_config(vc):
        kcc = get_kv_cache_config_from_groups(vc, get_kv_cache_groups(vc, W.layer_specs(vc)), 1 << 30)
        cc.num_gpu_blocks = kcc.num_blocks
        bs = cc.block_size
        s = Scheduler(vllm_config=vc, kv_cache_config=kcc, structured_output_manager=StructuredOutputManager(vc),
                      block_size=bs, log_stats=True)
    hf = get_hash_fn_by_name(cc.prefix_caching_hash_algo)
    init_none_hash(hf)
    hasher = get_request_block_hasher(bs, hf)
    first, second = drive.workload(a, mc.get_vocab_size())
    sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
    out = {"model": model, "drive_args": extra, "block_size": bs, "num_blocks": kcc.num_blocks,
           "groups": [type(g.kv_cache_spec).__name__ for g in kcc.kv_cache_groups], "waves": []}
    for w in first + second:
        for rid, toks, _ in w:
            s.add_request(Request(rid, toks, sp, None, block_hasher=hasher))
        steps, local = 0, 0
        while s.has_requests() and steps < max_steps:
            so = s.schedule()
            steps += 1
            for nr in so.scheduled_new_reqs:
                local += nr.num_computed_tokens
            ids = list(so.num_scheduled_tokens)
            done = [s.requests[r].num_computed_tokens + so.num_scheduled_tokens[r] >= s.requests[r].num_tokens for r in ids]
            s.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                       sampled_token_ids=[[5000] if x else [] for x in done]))
        out["waves"].append({"requests": len(w), "steps": steps, "finished": not s.has_requests(),
                             "local_hit_tokens": local})
        print(f"{model}: wave of {len(w)}: {steps} steps, {'finished' if not s.has_requests() else 'NOT finished'}, "
              f"{local} prompt tokens from vLLM's prefix cache")
        if s.has_requests():
            break
    out["ok"] = all(w["finished"] for w in out["waves"]) and len(out["waves"]) == len(first + second)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="gemma3-1b,qwen3-next-tiny")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    res = {m: fit(m) for m in a.models.split(",")}
    res["ok"] = all(r["ok"] for r in res.values())
    print("PASS" if res["ok"] else "FAIL")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
