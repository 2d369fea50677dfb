"""The docqa workload of `tutti replay`, as token-id prompts for a real engine.

The replay generates docqa in Go (eval/workload: DocQA.Plan, then Generate's
chain ids); eval/workload/testdata/docqa-headline.json holds its plan for the
headline parameters (BENCHMARKS.md's run A: 12 documents of 4K-8K tokens, 17
questions after each, seed 1, arrivals at 1 request/s), pinned to the
generator by a Go test. This module reads that plan and makes the prompts: a
request is its document's tokens followed by its question's, token ids drawn
from a seed per (salt, document) and per (salt, document, question). So two
requests share a leading block of tokens exactly when the replay gives them
the same chain id there (``check_blocks``), and a different salt gives the
same requests with none of their tokens cached by an earlier run.

Arrival times scale with the rate (Plan draws nothing else from the rate, a
Go test checks it): ``arrivals_s(plan, rate)``.

Pure Python, no vLLM: the tests run it with any Python 3.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from array import array
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PLAN_PATH = os.path.join(HERE, "..", "workload", "testdata", "docqa-headline.json")

# Token ids avoid the first and last thousand of the vocabulary, where real
# vocabularies keep their special tokens (as eval/vllm/drive.py does).
TOKEN_MARGIN = 1000
MAX_REQUESTS = 1 << 16


@dataclass(frozen=True)
class QA:
    """One request of the plan (eval/workload.QA)."""

    index: int  # position in arrival order, 0-based
    doc: int
    question: int
    doc_tokens: int
    question_tokens: int
    arrival_ms: float  # at 1 request/s (the plan's rate)
    hash_ids: Tuple[str, ...]  # the replay's chain ids (hex), one per block_tokens

    @property
    def prompt_tokens(self) -> int:
        return self.doc_tokens + self.question_tokens


@dataclass(frozen=True)
class Plan:
    workload: str  # the generator's own description
    params: Dict[str, object]
    requests: Tuple[QA, ...]

    @property
    def rate_per_s(self) -> float:
        return float(self.params["RatePerS"])

    @property
    def block_tokens(self) -> int:
        return int(self.params["BlockTokens"])


def load_plan(path: str = PLAN_PATH, first: int = 0) -> Plan:
    """The plan in ``path`` (its first ``first`` requests when > 0, as
    `tutti replay --requests` cuts docqa). Raises ValueError naming the file
    and what is wrong with it."""
    with open(path) as f:
        raw = json.load(f)
    try:
        params = dict(raw["params"])
        reqs = raw["requests"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a docqa plan (want params and requests): {e}") from e
    if not isinstance(reqs, list) or not 0 < len(reqs) <= MAX_REQUESTS:
        raise ValueError(f"{path}: {len(reqs) if isinstance(reqs, list) else '?'} requests, want 1..{MAX_REQUESTS}")
    if first < 0:
        raise ValueError(f"first = {first}: want >= 0")
    out, prev = [], 0.0
    for i, r in enumerate(reqs[:first] if first else reqs):
        try:
            q = QA(i, int(r["doc"]), int(r["question"]), int(r["doc_tokens"]), int(r["question_tokens"]),
                   float(r["arrival_ms"]), tuple(str(h) for h in r["hash_ids"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: request {i}: {e}") from e
        if q.doc < 0 or q.question < 0 or q.doc_tokens < 1 or q.question_tokens < 1 or q.arrival_ms < prev:
            raise ValueError(f"{path}: request {i} out of range or out of order: {r}")
        prev = q.arrival_ms
        out.append(q)
    for k in ("RatePerS", "BlockTokens", "Seed"):
        if k not in params:
            raise ValueError(f"{path}: params lack {k}")
    return Plan(str(raw.get("workload", "")), params, tuple(out))


def arrivals_s(plan: Plan, rate_per_s: float) -> List[float]:
    """Each request's arrival in seconds from the first, at rate_per_s."""
    if not rate_per_s > 0:
        raise ValueError(f"rate {rate_per_s!r}: want > 0 requests/s")
    scale = plan.rate_per_s / rate_per_s / 1000.0
    return [q.arrival_ms * scale for q in plan.requests]


def _tokens(seed: str, n: int, vocab: int) -> List[int]:
    # random.Random(str) hashes the string with SHA-512: the same ids in
    # every process, whatever PYTHONHASHSEED is.
    rng = random.Random(seed)
    lo, hi = TOKEN_MARGIN, vocab - TOKEN_MARGIN
    return [rng.randrange(lo, hi) for _ in range(n)]


def prompts(plan: Plan, vocab: int, salt: str) -> List[List[int]]:
    """Token ids of every request, in plan order. Questions of one document
    share exactly its tokens; ``salt`` changes every token (one salt per
    run, the same for every backend)."""
    if vocab <= 2 * TOKEN_MARGIN + 1:
        raise ValueError(f"vocab {vocab}: want more than {2 * TOKEN_MARGIN + 1} ids")
    docs: Dict[int, List[int]] = {}
    out = []
    for q in plan.requests:
        d = docs.get(q.doc)
        if d is None:
            d = docs[q.doc] = _tokens(f"docqa/{salt}/doc{q.doc}", q.doc_tokens, vocab)
        if len(d) != q.doc_tokens:
            raise ValueError(f"request {q.index}: document {q.doc} has {q.doc_tokens} tokens here, {len(d)} before")
        out.append(d + _tokens(f"docqa/{salt}/doc{q.doc}/q{q.question}", q.question_tokens, vocab))
    return out


def check_blocks(plan: Plan, toks: Sequence[Sequence[int]]) -> int:
    """Checks the prompts against the replay's chains: for every two
    requests and every block of plan.block_tokens tokens, their chain ids
    there are equal exactly when their token prefixes through that block
    are. Returns the number of (request, block) pairs checked; raises
    ValueError at the first disagreement."""
    B = plan.block_tokens
    if len(toks) != len(plan.requests):
        raise ValueError(f"{len(toks)} prompts for {len(plan.requests)} requests")
    seen: Dict[Tuple[int, str], bytes] = {}  # (block, chain id) -> digest of the token prefix
    by_prefix: Dict[Tuple[int, bytes], str] = {}
    n = 0
    for q, t in zip(plan.requests, toks):
        if len(t) != q.prompt_tokens or len(q.hash_ids) != (len(t) + B - 1) // B:
            raise ValueError(f"request {q.index}: {len(t)} tokens and {len(q.hash_ids)} chain ids for "
                             f"{q.prompt_tokens} tokens in blocks of {B}")
        h_prefix = hashlib.sha256()
        for b, h in enumerate(q.hash_ids):
            h_prefix.update(array("q", t[b * B:(b + 1) * B]).tobytes())
            prefix = h_prefix.copy().digest()  # the tokens through block b
            if seen.setdefault((b, h), prefix) != prefix:
                raise ValueError(f"request {q.index} block {b}: chain id {h} is another request's, tokens differ")
            if by_prefix.setdefault((b, prefix), h) != h:
                raise ValueError(f"request {q.index} block {b}: tokens equal another request's, chain ids differ")
            n += 1
    return n
