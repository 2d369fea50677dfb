"""Regenerates kvevents/testdata/vllm-0.26.golden: the bytes vLLM 0.26's own
msgspec structs encode for the batches of golden_test.go (goldenV026).

The structs are not copied: they are read from a vLLM source tree
(vllm/distributed/kv_events.py), their class definitions executed as they are,
so the vectors are what that vLLM writes. msgspec is needed only here (it is
not a dependency of tutti, and Debian does not package it):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install msgspec
    /tmp/venv/bin/python kvevents/testdata/vllm_golden.py /path/to/site-packages/vllm \
        > kvevents/testdata/vllm-0.26.golden

The argument is the vllm package directory (from the wheel, or a checkout's
vllm/); the script refuses a tree whose version is not 0.26.x.
"""

import ast
import os
import re
import sys
from typing import Any

import msgspec

STRUCTS = ("EventBatch", "KVCacheEvent", "BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch")


def load(vllm_dir):
    with open(os.path.join(vllm_dir, "_version.py")) as f:
        m = re.search(r"__version__ = version = '([^']+)'", f.read())
    version = m.group(1) if m else "unknown"
    if not version.startswith("0.26."):
        sys.exit(f"{vllm_dir}: vLLM {version}, want 0.26.x")
    path = os.path.join(vllm_dir, "distributed", "kv_events.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    keep = [n for n in tree.body
            if (isinstance(n, ast.ClassDef) and n.name in STRUCTS)
            or (isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) and t.id.startswith("MEDIUM_") for t in n.targets))]
    found = {n.name for n in keep if isinstance(n, ast.ClassDef)}
    if found != set(STRUCTS):
        sys.exit(f"{path}: missing {sorted(set(STRUCTS) - found)}")
    ns = {"msgspec": msgspec, "Any": Any, "ExternalBlockHash": bytes | int}
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), ns)
    return version, ns


def cases(ns):
    """The batches golden_test.go builds; keep the two in step."""
    BlockStored, BlockRemoved, AllBlocksCleared = ns["BlockStored"], ns["BlockRemoved"], ns["AllBlocksCleared"]
    FS = ns["MEDIUM_FS"]
    raw = bytes(range(32))
    tutti = [
        AllBlocksCleared(),
        BlockStored(block_hashes=[1, 300], parent_block_hash=None, token_ids=[1, 2, 3, 70000], block_size=2,
                    lora_id=None, medium=FS, lora_name=None, group_idx=0, locality="LOCAL"),
        BlockStored(block_hashes=[raw], parent_block_hash=300, token_ids=[], block_size=16, lora_id=None,
                    medium=FS, lora_name="adapter-a", extra_keys=[("adapter-a", ("mm-0", 3))], group_idx=0,
                    locality="LOCAL"),
        BlockRemoved(block_hashes=[2**64 - 1, 70000], medium=FS, group_idx=0, locality="LOCAL"),
    ]
    nones = [
        BlockStored(block_hashes=[5, 6], parent_block_hash=raw, token_ids=[9] * 4, block_size=2, lora_id=None,
                    medium=None, lora_name=None, extra_keys=[None, (b"\x01\x02", -7, "salt")]),
        BlockRemoved(block_hashes=[5], medium=None),
    ]
    return [
        ("batch", ns["KVEventBatch"](ts=1700000000.25, events=tutti, data_parallel_rank=0)),
        ("batch_nones", ns["KVEventBatch"](ts=0.5, events=nones, data_parallel_rank=3)),
        ("events", tutti),
    ]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    version, ns = load(sys.argv[1])
    enc = msgspec.msgpack.Encoder()
    print(f"# vLLM {version} vllm/distributed/kv_events.py, msgspec {msgspec.__version__}: kvevents/testdata/vllm_golden.py")
    for name, v in cases(ns):
        print(name, enc.encode(v).hex())


if __name__ == "__main__":
    main()
