"""Finished requests whose saves still read their pages (worker side).

A full-attention page keeps a finished request's KV until the engine
allocates it again, so the request's saves in flight, and its last chunk
queued behind the one before it, may go on reading it after the request
finished: the step need not wait for them. This is the bookkeeping that
says, for the pages a step writes afresh, whose saves must end first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Iterable, List, Set


class DeferredEnds:
    """Requests (oldest first) and the pages each may still read; at most
    ``limit`` requests."""

    def __init__(self, limit: int):
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"DeferredEnds limit = {limit!r}: want an int >= 1")
        self.limit = limit
        self._pages: "OrderedDict[str, Set[int]]" = OrderedDict()
        self._readers: Dict[int, Set[str]] = {}

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._pages

    def requests(self) -> List[str]:
        return list(self._pages)

    def add(self, req_id: str, pages: Iterable[int]) -> List[str]:
        """Defers req_id's end over ``pages`` (a request already deferred, or
        with no pages, is left as it is); returns the oldest requests removed
        to stay within the limit: the caller ends them now."""
        pages = {int(p) for p in pages}
        if req_id in self._pages or not pages:
            return []
        self._pages[req_id] = pages
        for p in pages:
            self._readers.setdefault(p, set()).add(req_id)
        out = []
        while len(self._pages) > self.limit:
            oldest = next(iter(self._pages))
            self.remove(oldest)
            out.append(oldest)
        return out

    def readers(self, pages: Iterable[int]) -> List[str]:
        """The requests that may read any of ``pages`` (sorted)."""
        if not self._readers:
            return []
        return sorted({r for p in pages for r in self._readers.get(int(p), ())})

    def remove(self, req_id: str):
        for p in self._pages.pop(req_id, ()):
            readers = self._readers[p]
            readers.discard(req_id)
            if not readers:
                del self._readers[p]

    def clear(self):
        self._pages.clear()
        self._readers.clear()
