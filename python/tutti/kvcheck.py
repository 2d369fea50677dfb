"""Check mode (a test mode, correctness over speed): is every block tutti
restores, bit for bit, KV the engine computed for it?

For every block a worker saves, :meth:`KVCheck.saving` records, per layer, a
digest (BLAKE2b-128) of the block's bytes as the engine computed them: read
from the engine's paged KV tensor at save time, in the engine's layout (the
tensor's slice along its block dimension; CUDA tensors are copied to the
host). Records are appended to ``<dir>/digests-<pid>-<ns>.tsv`` (one line per
block and layer: chain id, layer index, digest, hex; a digest already
recorded for the chain id and layer is not repeated) under the same
``<model>-<layout hash>/tp<N>-rank<r>`` subdirectory the store uses, so
another process checking what this one saved reads them at start.

For every block a worker restores, :meth:`layer_loaded` digests the block in
the engine's tensor once the layer's load is complete (before the layer's
attention writes anything), and :meth:`restored` compares the blocks the
load really restored with the digests recorded for their chain id: a match
(one of the digests recorded: the same tokens' KV computed in two batches may
differ in its last bits, and a save of a block already stored is skipped, so
any recorded version is the truth), a mismatch (logged loudly with the
request id, block index and layer; counted, never raised), or unknown (no
digest recorded: saved before check mode or past ``max_records``). Counts per
layer go to ``summary-<pid>-<ns>.json`` at :meth:`close` (and at exit), and the
totals to the connector's stats (:meth:`take_counts`).
"""

from __future__ import annotations

import atexit
import ctypes
import glob
import hashlib
import json
import logging
import os
import threading
import time
from collections import Counter
from typing import Callable, Dict, List, Optional, Set, Tuple

log = logging.getLogger("tutti.kvcheck")

MAX_RECORDS = 4_000_000  # block-layer digests kept (and read at start); beyond: not recorded, counted
MAX_MISMATCHES_LISTED = 100  # mismatches the summary lists one by one
DIGEST_BYTES = 16


def _block_dim(name: str, t, block_size: int) -> int:
    from .kv_layout import _dim_names
    return list(_dim_names(name, tuple(t.shape), block_size)).index("block")


class KVCheck:
    def __init__(self, root: str, subdir_of: Callable[[object], str], max_records: int = MAX_RECORDS):
        """``subdir_of(layout)``: the store's subdirectory for a KVLayout."""
        if not isinstance(root, str) or not root:
            raise ValueError(f"check dir = {root!r}: want a directory")
        if not isinstance(max_records, int) or max_records <= 0:
            raise ValueError(f"check max_records = {max_records!r}: want an int > 0")
        self.root, self._subdir_of, self.max_records = root, subdir_of, max_records
        self.dir: Optional[str] = None
        self._lock = threading.Lock()
        self._known: Dict[Tuple[int, int], Set[bytes]] = {}
        self._records = 0
        self._file = None
        self._layers: List[Tuple[str, object, int]] = []  # (name, tensor, block dimension)
        self._index: Dict[str, int] = {}
        self._pending: Dict[str, Dict[int, List[bytes]]] = {}  # req id -> layer -> digests of its promised blocks
        self.per_layer: Dict[str, Counter] = {}
        self.counts = Counter()
        self._taken = Counter()
        self.mismatches: List[dict] = []
        self._closed = False
        atexit.register(self.close)

    # -- setup
    def register(self, kv_caches: Dict[str, object], layout, block_size: int):
        for name, t in kv_caches.items():
            if not all(hasattr(t, a) for a in ("index_select", "cpu", "data_ptr")):
                raise ValueError(f"kv_connector_extra_config.check: layer {name!r} is not a torch tensor "
                                 f"({type(t).__name__}); check mode reads the KV with torch")
        self._layers = [(n, kv_caches[n], _block_dim(n, kv_caches[n], block_size)) for n in layout.layer_names]
        self._index = {n: i for i, (n, _, _) in enumerate(self._layers)}
        self.per_layer = {n: Counter() for n, _, _ in self._layers}
        self.dir = os.path.join(self.root, self._subdir_of(layout))
        os.makedirs(self.dir, exist_ok=True)
        for path in sorted(glob.glob(os.path.join(self.dir, "digests-*.tsv"))):
            self._read(path)
        self._stamp = f"{os.getpid()}-{time.time_ns()}"
        self._file = open(os.path.join(self.dir, f"digests-{self._stamp}.tsv"), "a")
        log.warning("tutti check mode: digests of every saved and restored block under %s (%d read)", self.dir,
                    self._records)

    def _read(self, path: str):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 3 or self._records >= self.max_records:
                    continue  # a torn last line of a killed process, or past the limit
                try:
                    key, digest = (int(parts[0], 16), int(parts[1])), bytes.fromhex(parts[2])
                except ValueError:
                    continue
                self._add(key, digest)

    def _add(self, key, digest) -> bool:
        s = self._known.setdefault(key, set())
        if digest in s:
            return False
        s.add(digest)
        self._records += 1
        return True

    # -- digests
    def _digests(self, layer: int, block_ids: List[int]) -> List[bytes]:
        import torch
        _, t, dim = self._layers[layer]
        idx = torch.tensor([int(b) for b in block_ids], dtype=torch.long, device=t.device)
        host = t.index_select(dim, idx).cpu()
        out = []
        for i in range(len(block_ids)):
            blk = host.select(dim, i).contiguous()
            raw = ctypes.string_at(blk.data_ptr(), blk.numel() * blk.element_size())
            out.append(hashlib.blake2b(raw, digest_size=DIGEST_BYTES).digest())
        return out

    def saving(self, req_id: str, chain: List[int], block_ids: List[int], committed: int):
        """Before a save of chain's blocks from block_ids; the first
        ``committed`` are stored already (the store skips them)."""
        todo = list(range(committed, len(chain)))
        if not todo:
            return
        lines = []
        with self._lock:
            for li in range(len(self._layers)):
                for b, d in zip(todo, self._digests(li, [block_ids[b] for b in todo])):
                    if self._records >= self.max_records:
                        self.counts["unrecorded"] += 1
                    elif self._add((chain[b], li), d):
                        lines.append(f"{chain[b]:016x} {li} {d.hex()}\n")
            self.counts["recorded"] += len(lines)
            if lines and self._file is not None:
                self._file.write("".join(lines))
                self._file.flush()

    def layer_loaded(self, layer_name: str, specs):
        """After ``layer_name``'s loads completed: digests every promised block."""
        li = self._index[layer_name]
        with self._lock:
            for spec in specs:
                self._pending.setdefault(spec.req_id, {})[li] = self._digests(li, spec.block_ids)

    def restored(self, spec, blocks: int):
        """The load of spec ended with its first ``blocks`` blocks restored."""
        with self._lock:
            per = self._pending.pop(spec.req_id, {})
            for li, digests in sorted(per.items()):
                name = self._layers[li][0]
                for j, d in enumerate(digests[:blocks]):
                    b = spec.skip + j
                    known = self._known.get((spec.chain[b], li))
                    what = "unknown" if not known else ("match" if d in known else "mismatch")
                    self.per_layer[name][what] += 1
                    self.counts[what] += 1
                    if what == "mismatch":
                        log.error("tutti check: MISMATCH request %s block %d layer %s (chain id %016x): the restored "
                                  "KV is not what the engine computed", spec.req_id, b, name, spec.chain[b])
                        if len(self.mismatches) < MAX_MISMATCHES_LISTED:
                            self.mismatches.append({"request": spec.req_id, "block": b, "layer": name,
                                                    "chain_id": f"{spec.chain[b]:016x}"})

    def take_counts(self) -> Dict[str, int]:
        """The totals since the last call: check_match, check_mismatch,
        check_unknown (block-layers restored), check_recorded (digests of
        saved block-layers recorded), check_unrecorded (past max_records)."""
        with self._lock:
            now = Counter(self.counts)
            delta = now - self._taken
            self._taken = now
        return {f"check_{k}": v for k, v in delta.items() if v}

    def summary(self) -> dict:
        with self._lock:
            return {"dir": self.dir, "pid": os.getpid(), "records": self._records, "totals": dict(self.counts),
                    "per_layer": {n: dict(c) for n, c in self.per_layer.items()},
                    "mismatches": list(self.mismatches),
                    "ok": self.counts["mismatch"] == 0 and self.counts["unknown"] == 0}

    def close(self):
        if self._closed or self.dir is None:
            return
        self._closed = True
        if self._file is not None:
            self._file.close()
        path = os.path.join(self.dir, f"summary-{self._stamp}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.summary(), f, indent=1, sort_keys=True)
        os.replace(path + ".tmp", path)
        log.warning("tutti check mode: %s (%s)", path, dict(self.counts))


def read_summaries(root: str) -> dict:
    """Adds up the check-mode summaries under ``root`` (those :meth:`close`
    writes, one per process and rank, in per-store folders below it): the
    totals of ``match``, ``mismatch``, ``unknown`` and ``recorded``, the
    number of ``files`` read and the first mismatches of each file."""
    tot = {"match": 0, "mismatch": 0, "unknown": 0, "recorded": 0, "files": 0, "mismatches": []}
    for path in sorted(glob.glob(os.path.join(root, "**", "summary-*.json"), recursive=True)):
        with open(path) as f:
            s = json.load(f)
        tot["files"] += 1
        for k in ("match", "mismatch", "unknown", "recorded"):
            tot[k] += int(s.get("totals", {}).get(k, 0))
        tot["mismatches"] += s.get("mismatches", [])[:8]
    return tot
