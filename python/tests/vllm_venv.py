"""Where the tests find vLLM 0.26's CPU environment (scripts/vllm-venv.sh, made
by `make test-deps`), and why it is missing when it is: the one home of that
rule for the tests that run vLLM's own code."""

import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VENV = os.environ.get("VLLM_VENV", os.path.join(ROOT, ".venv-vllm"))
PY = os.path.join(VENV, "bin", "python")


def missing():
    """None where the environment is complete (its stamp is written last),
    else the reason to skip: scripts/vllm-venv.sh's own where it skipped
    (a disk too small), or that it was never made."""
    if os.path.exists(os.path.join(VENV, ".stamp")):
        return None
    try:
        with open(VENV + ".skipped") as f:
            return f"no vLLM environment at {VENV}: scripts/vllm-venv.sh skipped it: {f.read().strip()}"
    except FileNotFoundError:
        return f"no vLLM environment at {VENV}: scripts/vllm-venv.sh makes it (make test-deps does)"
