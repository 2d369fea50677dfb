"""get_tensor_model_parallel_rank as vLLM's worker processes have it (the
double's driver sets the rank of its worker process)."""
_TP_RANK = 0


def set_rank_for_test(rank: int):
    global _TP_RANK
    _TP_RANK = rank


def get_tensor_model_parallel_rank() -> int:
    return _TP_RANK
