"""vLLM's block hashes: a sha256 chain over (parent, block tokens, extra
keys) from NONE_HASH, which is random per process unless PYTHONHASHSEED is set."""
import hashlib
import os
import pickle

_seed = os.environ.get("PYTHONHASHSEED")
NONE_HASH = os.urandom(32) if not _seed else hashlib.sha256(_seed.encode()).digest()


def hash_block_tokens(parent: bytes, tokens, extra_keys=None) -> bytes:
    return hashlib.sha256(pickle.dumps((parent, tuple(tokens), extra_keys))).digest()


def block_hashes(tokens, block_size):
    out, parent = [], NONE_HASH
    for i in range(len(tokens) // block_size):
        parent = hash_block_tokens(parent, tokens[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


# VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (default on): events carry the last 8
# bytes of a block hash as an int.
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") != "0"


def maybe_convert_block_hash(hash_bytes: bytes):
    if not VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES:
        return hash_bytes
    return int.from_bytes(hash_bytes, byteorder="big") & ((1 << 64) - 1)
