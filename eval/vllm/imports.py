"""Imports every module of vLLM's offline LLM path that eval/vllm uses (the
dense and MLA models, FlashAttention/Triton/MLA backends, the KV connector
factory), and what eval/vllm/headline.py adds (AsyncLLM, the metrics reader,
the offloading connector's CPU and tiering specs with the file tier): exits
non-zero naming the first that fails (scripts/vllm-venv.sh)."""
import importlib, sys
mods = """vllm
vllm.entrypoints.llm
vllm.inputs
vllm.v1.engine.core
vllm.v1.engine.llm_engine
vllm.v1.engine.core_client
vllm.v1.executor.uniproc_executor
vllm.v1.worker.gpu_worker
vllm.v1.worker.gpu_model_runner
vllm.model_executor.models.llama
vllm.model_executor.models.deepseek_v2
vllm.model_executor.model_loader.dummy_loader
vllm.v1.attention.backends.flash_attn
vllm.v1.attention.backends.triton_attn
vllm.v1.attention.backends.mla.triton_mla
vllm.v1.attention.backends.mla.flashmla
vllm.distributed.kv_transfer.kv_connector.factory
vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector
vllm.distributed.kv_transfer.kv_connector.v1.multi_connector
vllm.v1.structured_output
vllm.v1.sample.sampler
vllm.v1.metrics.loggers
vllm.v1.engine.async_llm
vllm.engine.arg_utils
vllm.v1.metrics.reader
vllm.v1.kv_offload.cpu.spec
vllm.v1.kv_offload.tiering.spec
vllm.v1.kv_offload.tiering.fs.manager""".split()
for m in mods:
    try:
        importlib.import_module(m)
    except ModuleNotFoundError as e:
        print("MISSING", e.name, "from", m); sys.exit(3)
    except Exception as e:
        print("ERR", m, type(e).__name__, str(e)[:300]); sys.exit(4)
print("ALL OK")
