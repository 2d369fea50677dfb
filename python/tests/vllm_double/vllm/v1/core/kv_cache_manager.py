"""KVCacheBlocks: get_block_ids() gives one list of block ids per KV cache group."""


class KVCacheBlocks:
    def __init__(self, block_ids_per_group):
        self._ids = tuple(list(g) for g in block_ids_per_group)

    def get_block_ids(self, allow_none=False):
        if allow_none and not any(self._ids):
            return None
        return self._ids
