"""vLLM 0.26's block hashes: a sha256 chain over (parent, block tokens, extra
keys) from NONE_HASH, which is random per process unless PYTHONHASHSEED is
set; the extra keys of a block are vLLM's (generate_block_hash_extra_keys):
the LoRA name, (identifier, offset in the block) of each multimodal input
the block overlaps, the cache salt on the first block, and a sha256 of the
block's prompt embeddings."""
import hashlib
import os
import pickle

_seed = os.environ.get("PYTHONHASHSEED")
NONE_HASH = os.urandom(32) if _seed is None else hashlib.sha256(_seed.encode()).digest()


def hash_block_tokens(parent: bytes, tokens, extra_keys=None) -> bytes:
    return hashlib.sha256(pickle.dumps((parent or NONE_HASH, tuple(tokens), extra_keys))).digest()


def _mm_keys(request, start, end, mm_idx):
    feats = request.mm_features
    keys = []
    if not feats or feats[-1].mm_position.offset + feats[-1].mm_position.length <= start:
        return keys, mm_idx
    if mm_idx < 0:
        mm_idx += len(feats)
    while mm_idx < len(feats):
        pos = feats[mm_idx].mm_position
        if end <= pos.offset:
            break  # not reached yet
        if start >= pos.offset + pos.length:
            mm_idx += 1  # passed
            continue
        keys.append((feats[mm_idx].identifier, pos.offset - start))
        if end < pos.offset + pos.length:
            break  # the input goes on into the next block
        mm_idx += 1
    return keys, mm_idx


def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    mm, next_mm = _mm_keys(request, start_token_idx, end_token_idx, start_mm_idx)
    lora = [request.lora_request.lora_name] if request.lora_request else []
    salt = [request.cache_salt] if start_token_idx == 0 and request.cache_salt else []
    embeds = []
    if request.prompt_embeds is not None:
        rng = (start_token_idx, end_token_idx)
        h = request._prompt_embeds_per_block_hashes.get(rng)
        if h is None:
            block = request.prompt_embeds[start_token_idx:end_token_idx].contiguous()
            h = hashlib.sha256(block.numpy().tobytes()).digest()
            request._prompt_embeds_per_block_hashes[rng] = h
        embeds = [h]
    keys = lora + mm + salt + embeds
    return (tuple(keys) if keys else None), next_mm


def get_request_block_hasher(block_size):
    def hasher(request):
        start = len(request.block_hashes) * block_size
        mm = -1 if start > 0 else 0
        parent = request.block_hashes[-1] if request.block_hashes else None
        out = []
        while start + block_size <= request.num_tokens:
            extra, mm = generate_block_hash_extra_keys(request, start, start + block_size, mm)
            parent = hash_block_tokens(parent, request.all_token_ids[start:start + block_size], extra)
            out.append(parent)
            start += block_size
        return out
    return hasher


def block_hashes(tokens, block_size):
    """The hashes of a plain prompt's full blocks."""
    out, parent = [], None
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
