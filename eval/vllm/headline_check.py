"""Checks eval/vllm/headline.py's backends against real vLLM 0.26 without a
GPU (in .venv-vllm; python/tests/test_headline.py runs it): for each backend,
vLLM builds the whole engine config from headline.engine_kwargs (its CPU
platform standing in for CUDA), then the connector's scheduler role is
created by vLLM's KVConnectorFactory on the Llama-3-8B KV cache shape, which
parses the backend's kv_connector_extra_config for real (the offloading spec
and its file tier, tutti's settings; LMCache's config file, read by LMCache
itself). LMCache is checked only where it is importable: its Python tree
needs no build for this, e.g. PYTHONPATH with the unpacked sdist of
.vllm-stage/lmcache/ and the wheels of requirements-lmcache.txt installed
into a directory (pip install --no-deps --target DIR). Prints one line per
backend and exits non-zero on any failure.

  PYTHONPATH=python .venv-vllm/bin/python eval/vllm/headline_check.py [--dirs JSON]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import headline  # noqa: E402


def check(backend: str, a) -> str:
    cfg = headline.backend_config(backend, a)
    for path, text in cfg["files"].items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    for d in cfg["dirs"]:
        os.makedirs(d, exist_ok=True)
    saved = {k: os.environ.get(k) for k in cfg["env"]}
    os.environ.update(cfg["env"])  # LMCache reads its config file's name from the environment
    try:
        return _check(backend, a, cfg)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _check(backend: str, a, cfg: dict) -> str:
    import torch
    from vllm.config import KVTransferConfig, set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

    ktc = KVTransferConfig(**cfg["kv_transfer_config"]) if cfg["kv_transfer_config"] else None
    vc = AsyncEngineArgs(**headline.engine_kwargs(a, ktc)).create_engine_config()
    got = (f"max_model_len {vc.model_config.max_model_len}, {vc.cache_config.num_gpu_blocks_override} GPU blocks "
           f"of {vc.cache_config.block_size}, {vc.scheduler_config.max_num_batched_tokens} tokens a step")
    # What vLLM's own defaults may turn off or shrink for a model class: the GPU run would measure another engine.
    cc, mc = vc.cache_config, vc.model_config
    if not cc.enable_prefix_caching:
        raise ValueError("vLLM turned prefix caching off")
    if not mc.enforce_eager and not a.cuda_graphs:
        raise ValueError("vLLM turned enforce_eager off")
    if cc.num_gpu_blocks_override * cc.block_size < mc.max_model_len:
        raise ValueError(f"{cc.num_gpu_blocks_override} blocks of {cc.block_size} tokens hold less than "
                         f"max_model_len {mc.max_model_len}: vLLM would not start")
    if ktc is None:
        return got
    with open(os.path.join(a.model, "config.json")) as f:
        mc = json.load(f)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(mc["num_hidden_layers"])]
    spec = FullAttentionSpec(block_size=a.block_size, num_kv_heads=mc["num_key_value_heads"],
                             head_size=mc["head_dim"], dtype=torch.bfloat16)
    # One tensor per layer, as vLLM lays out a dense model's KV cache (sizes only: nothing is allocated).
    kcc = KVCacheConfig(num_blocks=a.gpu_blocks, kv_cache_groups=[KVCacheGroupSpec(names, spec)],
                        kv_cache_tensors=[KVCacheTensor(size=a.gpu_blocks * spec.page_size_bytes, shared_by=[n])
                                          for n in names])
    vc.cache_config.num_gpu_blocks = a.gpu_blocks
    if backend.startswith("lmcache"):
        import lmcache.integration.vllm.utils as lmc_utils

        lmc_utils._config_instance = None  # a per-process singleton: each backend here reads its own file
    with set_current_vllm_config(vc):
        conn = KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER, kcc)
    what = type(conn).__name__
    if backend.startswith("lmcache"):
        c = lmc_utils.lmcache_get_or_create_config()
        what += (f" (LMCache config: chunk {c.chunk_size}, local_cpu {c.local_cpu}, local_disk {c.local_disk}, "
                 f"gds_path {c.gds_path})")
    mgr = getattr(getattr(conn, "connector_scheduler", None), "manager", None)
    if mgr is not None:
        what += f" ({type(mgr).__name__}" + "".join(
            f", tier {type(t).__name__}" for t in getattr(mgr, "secondary_tiers", [])) + ")"
    if hasattr(conn, "shutdown"):
        conn.shutdown()
    return f"{got}; scheduler role: {what}"


def main(argv=None) -> int:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()  # no GPU here: vLLM's CPU platform builds the config
    work = tempfile.mkdtemp(prefix="headline-check-")
    argv = list(argv if argv is not None else sys.argv[1:])
    if "--dirs" not in argv:
        argv += ["--dirs", json.dumps([os.path.join(work, f"d{i}") for i in range(2)])]
    # Host tiers of 1 GiB: the shared region is mapped, not touched, but keep it small on a shared machine.
    a = headline.parse_args(["configs", "--work-dir", work, "--cpu-gib", "1", "--fs-cpu-gib", "1", *argv])
    bad = 0
    try:
        bad = check_all(a)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


def check_all(a) -> int:
    bad = 0
    for b in headline.BACKENDS:
        if b.startswith("lmcache"):
            try:
                import lmcache  # noqa: F401
            except ImportError:
                print(f"{b}: skipped (no lmcache package here)")
                continue
        try:
            print(f"{b}: ok: {check(b, a)}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every backend
            bad += 1
            print(f"{b}: FAIL: {type(e).__name__}: {e}", flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(main())
