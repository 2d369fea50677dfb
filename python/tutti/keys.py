"""What a stored block is keyed by: its content, never a process's random seed.

A block's key is a 64-bit chain id computed from the tokens it holds and every
block before it, so the same prompt gets the same keys in every process and
after every restart, and every engine serving the same model shares them (as
LMCache's token-keyed chunks are). The rule (one home: this module):

    seed      = LE64(BLAKE2b-64("tutti-chain-v1\\0" ‖ UTF-8(identity)))
    key[i]    = ChainFromTokens over the words w, chunks of block_tokens, seed
    w[i*B+j]  = token[i*B+j]                       (a block without extras)
    w[i*B+j]  = token[i*B+j] XOR m_i[j]            (a block with extras)
    m_i[j]    = LE32(SHAKE-128("tutti-extras\\0" ‖ E_i)[4j:4j+4]) OR 0x80000000

ChainFromTokens is the Go prefix package's (XXH64 of the parent's id and the
block's words under the seed, the parent of block 0 being 0:
:func:`tutti.chain_from_tokens`). ``identity`` names what the KV depends on
beyond the tokens (an engine's model and block size); ``E_i`` is the
canonical encoding (:func:`encode_extras`) of what else the engine folds into
block i's own hash (vLLM: LoRA name, multimodal input identifiers and their
offsets, cache salt, prompt-embedding digests). Token ids must be below 2^31:
a masked word has its top bit set, so a block with extras never shares a key
with a block of plain token ids.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Dict, List, Optional, Sequence

from .store import chain_from_tokens

KEY_VERSION = "tutti-chain-v1"
TOKEN_LIMIT = 1 << 31  # token ids at or above this cannot be keyed (the mask's bit)
_EXTRAS_TAG = b"tutti-extras\0"
MAX_EXTRAS_DEPTH = 8  # nesting of an extras value the encoding accepts
MAX_MASKS_CACHED = 4096  # distinct block extras whose masks are kept


class Unkeyable(ValueError):
    """A request whose blocks cannot be keyed (a token id out of range, an
    extra key of a type with no canonical encoding): it must be a miss, never
    a hit on another request's blocks, and is never saved."""


def seed_of(identity: str) -> int:
    """The chain seed of ``identity`` (see the module doc)."""
    if not isinstance(identity, str):
        raise TypeError(f"identity: {type(identity).__name__}, want str")
    d = hashlib.blake2b(KEY_VERSION.encode() + b"\0" + identity.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(d, "little")


def _encode(v, out: List[bytes], depth: int):
    if depth > MAX_EXTRAS_DEPTH:
        raise Unkeyable(f"extra keys nested deeper than {MAX_EXTRAS_DEPTH}")
    if v is None:
        out.append(b"n")
    elif isinstance(v, bool):
        out.append(b"t" if v else b"f")
    elif isinstance(v, int):
        s = str(v).encode()
        out.append(b"i" + struct.pack("<I", len(s)) + s)
    elif isinstance(v, str):
        s = v.encode("utf-8")
        out.append(b"s" + struct.pack("<I", len(s)) + s)
    elif isinstance(v, (bytes, bytearray, memoryview)):
        s = bytes(v)
        out.append(b"b" + struct.pack("<I", len(s)) + s)
    elif isinstance(v, (tuple, list)):
        out.append(b"l" + struct.pack("<I", len(v)))
        for x in v:
            _encode(x, out, depth + 1)
    else:
        raise Unkeyable(f"an extra key of type {type(v).__name__} has no canonical encoding")


def encode_extras(extras) -> bytes:
    """The canonical bytes of one block's extra keys: None, bool, int, str,
    bytes and tuples/lists of them, each tagged and length-prefixed. Raises
    :class:`Unkeyable` for anything else."""
    out: List[bytes] = []
    _encode(extras, out, 0)
    return b"".join(out)


_masks: Dict[tuple, List[int]] = {}


def extras_mask(extras: bytes, block_tokens: int) -> List[int]:
    """The block_tokens mask words of a block whose extras encode to ``extras``."""
    key = (bytes(extras), block_tokens)
    m = _masks.get(key)
    if m is None:
        raw = hashlib.shake_128(_EXTRAS_TAG + key[0]).digest(4 * block_tokens)
        m = [w | 0x80000000 for w in struct.unpack(f"<{block_tokens}I", raw)]
        if len(_masks) >= MAX_MASKS_CACHED:
            _masks.clear()
        _masks[key] = m
    return m


def chain_keys(tokens: Sequence[int], block_tokens: int, seed: int,
               block_extras: Optional[Sequence[Optional[bytes]]] = None) -> List[int]:
    """The keys of the full blocks of ``tokens`` (a trailing partial block has
    none). ``block_extras[i]``: block i's encoded extras (None or empty: the
    block has none); entries past the full blocks are ignored. Raises
    :class:`Unkeyable` for a token id outside [0, 2^31)."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens = {block_tokens}, want > 0")
    n = len(tokens) // block_tokens
    words = [int(t) for t in tokens[:n * block_tokens]]
    for i, t in enumerate(words):
        if not 0 <= t < TOKEN_LIMIT:
            raise Unkeyable(f"token {i} = {t}: outside [0, 2^31)")
    if block_extras:
        for i, e in enumerate(block_extras[:n]):
            if e:
                base = i * block_tokens
                for j, w in enumerate(extras_mask(e, block_tokens)):
                    words[base + j] ^= w
    return chain_from_tokens(words, block_tokens, seed) if n else []
