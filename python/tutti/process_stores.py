"""One store per process and key: an engine that puts its scheduler and
worker in one process (vLLM at TP = 1) gets one store for both, since a
store's directories are locked per process."""

from __future__ import annotations

import threading
from typing import Callable, Dict, Optional

from .store import Store

_stores_lock = threading.Lock()
_stores: Dict[str, Store] = {}


def process_store(key: str, opener: Callable[[], Store]) -> Store:
    """The store of this process under ``key``, opened by ``opener`` the
    first time (or after it was closed)."""
    with _stores_lock:
        st = _stores.get(key)
        if st is None or st.closed:
            st = _stores[key] = opener()
        return st


def shared_store(key: str) -> Optional[Store]:
    """The store of this process under ``key`` if one is open, else None."""
    with _stores_lock:
        st = _stores.get(key)
        return st if st is not None and not st.closed else None
