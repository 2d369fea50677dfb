"""What :meth:`tutti.Store.stats` returns: runtime.Stats as nested objects.

The library hands the stats over as one JSON object (``tutti_get_stats_json``)
whose keys are the json tags of runtime.Stats (runtime/stats.go), so a
counter added in Go arrives here with no change on this side. Each object
becomes a :class:`StatsGroup` whose attributes are its keys, at every depth::

    st = store.stats()
    st.loads.restored_blocks      # runtime Stats.Loads.RestoredBlocks
    st.loads.miss_blocks.crc      # counts by cause: one attribute per cause
    st.prewrite.state             # an enum: its Go name ("running", "done", ...)
    st.prewrite.reason            # ... and why, beside it
    st.devices.probes[0].state    # lists stay lists

The groups are path, lookups, holds, loads, saves, index, map, sched,
events, gpu, devices, prewrite; docs/integration.md says what each holds.
"""

from __future__ import annotations

import json
import types


class StatsGroup(types.SimpleNamespace):
    """One object of the stats: attributes named as the Go fields' json tags."""

    def as_dict(self) -> dict:
        """The group as plain dicts and lists (for json.dumps, logs)."""
        return {k: _plain(v) for k, v in vars(self).items()}


def _plain(v):
    if isinstance(v, StatsGroup):
        return v.as_dict()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def parse(text) -> StatsGroup:
    """The stats from the library's JSON text (str or bytes)."""
    st = json.loads(text, object_hook=lambda d: StatsGroup(**d))
    if not isinstance(st, StatsGroup):
        raise ValueError(f"stats: a JSON object expected, got {type(st).__name__}")
    return st
