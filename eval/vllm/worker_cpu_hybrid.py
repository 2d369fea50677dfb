"""tutti's worker role on the KV tensors vLLM 0.26 hands a connector for a
hybrid model (several KV cache groups), built on a machine without a GPU by
vLLM's own code: the model's layer specs as its layers make them (a Qwen3-Next
model's block size and padded Mamba page from the platform's alignment), the
groups and shared tensors from ``get_kv_cache_groups`` and
``get_kv_cache_config_from_groups``, the raw tensors and their views from
``GPUModelRunner._allocate_kv_cache_tensors`` / ``_reshape_kv_cache_tensors``
(FlashAttention's layout, the H100's first choice; Mamba states as views of
one page per block; attention next to Mamba blocks-first), then
``TuttiConnector.register_kv_caches``.

Each group's blocks then go through a store and back: random bytes in some
pages of every layer of a group (every group its own block ids, as vLLM's one
pool hands them), saved, the pages zeroed, loaded into other pages, and
compared bit for bit with what was saved, while every other byte of the raw
tensors (the other groups' views of them share their memory) is checked
unchanged. Prints and (``--json``) writes each group's layout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from types import MethodType, SimpleNamespace

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import vllm.platforms as _platforms  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

_platforms._current_platform = CpuPlatform()
# The GPU machine's pages on any CPU: vLLM's CPU platform makes Mamba states
# float32 where the CPU has AMX tiles (its own GDN kernels' need), which would
# double a Qwen3-Next state page and the attention block aligned to it.
# Nothing here runs those kernels.
torch.cpu._is_amx_tile_supported = lambda: False

from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.model_executor.models.config import HybridAttentionMambaModelConfig  # noqa: E402
from vllm.platforms.interface import Platform  # noqa: E402
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402
from vllm.v1.worker.utils import prepare_kernel_block_sizes  # noqa: E402

from sched_common import init_one_worker  # noqa: E402
from tutti.worker_side import LoadSpec, SaveSpec  # noqa: E402

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


def layer_specs(vc):
    """The layers' KV cache specs, as vLLM 0.26's layers of the model make
    them (Attention.get_kv_cache_spec, MambaBase.get_kv_cache_spec)."""
    hf, cc, mc = vc.model_config.hf_text_config, vc.cache_config, vc.model_config
    dtype, heads, head = mc.dtype, mc.get_num_kv_heads(vc.parallel_config), mc.get_head_size()
    out = {}
    if mc.is_hybrid:  # Qwen3-Next: the platform aligns the attention block to the Mamba page, then pads that
        from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM as M
        HybridAttentionMambaModelConfig.verify_and_update_config(vc)
        Platform._align_hybrid_block_size(vc, FlashAttentionBackend)
        for i, t in enumerate(hf.layer_types):
            if t == "full_attention":
                out[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(
                    block_size=cc.block_size, num_kv_heads=heads, head_size=head, dtype=dtype)
            else:
                out[f"model.layers.{i}.linear_attn"] = MambaSpec(
                    shapes=tuple(M.get_mamba_state_shape_from_config(vc)), dtypes=M.get_mamba_state_dtype_from_config(vc),
                    block_size=cc.mamba_block_size, page_size_padded=cc.mamba_page_size_padded,
                    mamba_cache_mode=cc.mamba_cache_mode)
        return out
    for i, t in enumerate(hf.layer_types):  # Gemma 3
        kw = dict(block_size=cc.block_size, num_kv_heads=heads, head_size=head, dtype=dtype)
        out[f"model.layers.{i}.self_attn.attn"] = (SlidingWindowSpec(sliding_window=hf.sliding_window, **kw)
                                                   if t == "sliding_attention" else FullAttentionSpec(**kw))
    return out


def vllm_kv_caches(vc, kcc):
    """The model runner's KV tensors for kcc, by its own methods on the CPU."""
    groups = [[SimpleNamespace(kv_cache_spec=g.kv_cache_spec, kv_cache_group_id=i, layer_names=list(g.layer_names),
                               backend=FlashAttentionBackend)] for i, g in enumerate(kcc.kv_cache_groups)]
    r = SimpleNamespace(device=torch.device("cpu"), runner_only_attn_layers=set(), kv_cache_config=kcc,
                        attn_groups=groups, cache_config=vc.cache_config)
    for m in ("_allocate_kv_cache_tensors", "_reshape_kv_cache_tensors", "_kv_cache_spec_attn_group_iterator",
              "_update_hybrid_attention_mamba_layout", "_has_mixed_attention_kv_layout"):
        setattr(r, m, MethodType(getattr(GPUModelRunner, m), r))
    kernel_block_sizes = prepare_kernel_block_sizes(kcc, groups)
    raw = r._allocate_kv_cache_tensors(kcc)
    return r._reshape_kv_cache_tensors(raw, kernel_block_sizes), raw


def round_trip(conn, kcc, raw, seed):
    """Every group: pages saved from blocks 1.., loaded into other blocks,
    compared; the raw tensors' other bytes unchanged. Returns the wrongs."""
    w, gen, bad = conn._worker, torch.Generator().manual_seed(seed), []
    ng = len(kcc.kv_cache_groups)
    backings = {t.data_ptr(): t for t in raw.values()}
    for t in backings.values():
        t.copy_(torch.randint(-128, 128, t.shape, dtype=torch.int8, generator=gen))
    for g in range(ng):
        src, dst = [1 + g, 1 + ng + g], [1 + 2 * ng + g, 1 + 3 * ng + g]  # blocks of this group only
        lay = w.kv_layouts[g]
        chain = [1000 * (seed + 1) + 10 * g + j for j in range(2)]
        pages = {name: w.workers[g]._kv_refs[name] for name in lay.layer_names}  # what tutti registered
        before = {p: t.clone() for p, t in backings.items()}
        w.bind([], [SaveSpec(f"s{g}", chain, src, group=g)])
        for name in lay.layer_names:
            w.save_layer(name)
        w.wait_for_save()
        w.finish_step(())
        w.unbind()
        conn._hybrid.wait_saves()
        want = {}
        for name in lay.layer_names:
            v = _bytes(pages[name])
            want[name] = [v[b].clone() for b in src]
        w.bind([LoadSpec(f"l{g}", chain, 0, dst, group=g)], [])
        w.start_load()
        for name in lay.layer_names:
            w.wait_for_layer(name)
        res = w.finish_step(())
        w.unbind()
        if res.error_block_ids:
            bad.append(f"group {g}: load errors {sorted(res.error_block_ids)}")
        for name in lay.layer_names:
            v = _bytes(pages[name])
            for j, b in enumerate(dst):
                if not torch.equal(v[b], want[name][j]):
                    bad.append(f"group {g} layer {name}: block {b} differs from the saved block {src[j]}")
        # Nothing else of the shared raw tensors moved: only the loaded pages of this group's layers.
        for p, t in backings.items():
            stray = t != before[p]
            for name in lay.layer_names:
                v = _bytes(pages[name])
                for b in dst:
                    lo = v[b].data_ptr() - p
                    if 0 <= lo < t.numel():
                        stray[lo:lo + v[b].numel()] = False
            if stray.any():
                first = int(stray.nonzero()[0])
                bad.append(f"group {g}: {int(stray.sum())} bytes outside its loaded pages changed (first at {first})")
    return bad


def _bytes(t):
    """A layer's registered tensor as (blocks, page bytes) uint8: block b's
    page is the bytes [b * block stride, + page) from its start (blocks
    outermost, a dense page: what tutti's layout check accepted)."""
    es, off = t.element_size(), t.storage_offset() * t.element_size()
    u8 = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage(), off, (t.untyped_storage().nbytes() - off,), (1,))
    return torch.as_strided(u8, (t.shape[0], t[0].numel() * es), (t.stride(0) * es, 1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="gemma3-1b,qwen3-next-tiny")
    p.add_argument("--dir", default="")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    # Without --dir, a directory of its own, removed when main returns (its stores preallocate a GiB a model).
    tmp = None if a.dir else tempfile.TemporaryDirectory(prefix="tutti-worker-hybrid-")
    root = a.dir or tmp.name
    res, ok, first = {}, True, True
    for model in a.models.split(","):
        d = os.path.join(MODELS, model)
        blocks = 64 if "qwen3-next" in model else 256
        mc = ModelConfig(model=d, skip_tokenizer_init=True, max_model_len=8192, dtype="bfloat16")
        cc = CacheConfig(block_size=16, enable_prefix_caching=True, num_gpu_blocks_override=blocks)
        extra = {"dirs": [os.path.join(root, model)], "capacity_bytes": 1 << 30, "path": "cpu"}
        kt = KVTransferConfig(kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm", kv_role="kv_both",
                              kv_connector_extra_config=extra)
        vc = VllmConfig(model_config=mc, cache_config=cc, kv_transfer_config=kt)
        with set_current_vllm_config(vc):
            if first:
                init_one_worker()
                first = False
            kcc = get_kv_cache_config_from_groups(vc, get_kv_cache_groups(vc, layer_specs(vc)), 1 << 30)
            kv, raw = vllm_kv_caches(vc, kcc)
            conn = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kcc)
            conn.register_kv_caches(kv)
            lays = conn._worker.kv_layouts
            out = {"block_size": cc.block_size, "shared_tensors": len(kcc.kv_cache_tensors), "groups": []}
            for g, (grp, lay) in enumerate(zip(kcc.kv_cache_groups, lays)):
                t0 = kv[grp.layer_names[0]]
                t0 = t0[0] if isinstance(t0, list) else t0
                row = {"spec": type(grp.kv_cache_spec).__name__, "layers": len(grp.layer_names),
                       "vllm_shape": list(t0.shape), "vllm_stride": list(t0.stride()), "layout": lay.layout,
                       "tag": lay.tag, "page_bytes": lay.geometry.page_bytes_per_layer,
                       "vllm_page_bytes": grp.kv_cache_spec.page_size_bytes}
                out["groups"].append(row)
                if row["page_bytes"] != row["vllm_page_bytes"]:
                    ok = False
                print(f"{model} group {g}: {row}")
            bad = round_trip(conn, kcc, raw, 1)
            out["bad"] = bad
            ok &= not bad
            for b in bad:
                print(f"{model}: {b}")
            conn.shutdown()
            res[model] = out
    res["ok"] = bool(ok)
    print("PASS" if ok else "FAIL")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
