#!/usr/bin/env bash
# A virtual environment with vLLM 0.26.0 and torch 2.11.0 (CPU use only: no GPU
# is needed to import vLLM and run its scheduler), at $VLLM_VENV (default
# .venv-vllm in the repository). The one home of how that environment is made:
# `make test-deps` calls it for the tests that drive tutti's connector under
# vLLM's own scheduler (python/tests/test_vllm_real.py), eval/vllm/stage.sh
# --check to check the GPU machine's pins import. A no-op when the environment
# already holds exactly the pinned requirements (a stamp of the files).
#   torch 2.11.0 first, with the dependencies it pins (its CUDA libraries load
#   on a machine without a GPU); then, without dependencies, vLLM and what its
#   LLM path imports: eval/vllm/requirements-0.26.0.txt (what the GPU machine
#   lacks) and eval/vllm/requirements-cpu.txt (what it has).
# About 4.6 GB, a minute or two from the package registry.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VLLM_VENV:-$ROOT/.venv-vllm}
PY=${PYTHON:-python3}
R1=$ROOT/eval/vllm/requirements-0.26.0.txt
R2=$ROOT/eval/vllm/requirements-cpu.txt
stamp=$(cat "$R1" "$R2" | sha256sum | cut -d' ' -f1)
if [ -f "$VENV/.stamp" ] && [ "$(cat "$VENV/.stamp")" = "$stamp" ]; then
	exit 0
fi
echo "vllm-venv: making $VENV (torch 2.11.0, vLLM 0.26.0; about 4.6 GB)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
log=$(mktemp /tmp/vllm-venv.XXXXXX.log)
{
	"$VENV/bin/pip" install --disable-pip-version-check -q torch==2.11.0 &&
		"$VENV/bin/pip" install --disable-pip-version-check -q --no-deps -r "$R2" -r "$R1"
} >"$log" 2>&1 || { echo "vllm-venv: pip failed (log: $log)"; tail -5 "$log"; exit 1; }
(cd /tmp && HF_HUB_OFFLINE=1 "$VENV/bin/python" "$ROOT/eval/vllm/imports.py" >>"$log" 2>&1) ||
	{ echo "vllm-venv: vLLM's LLM path does not import (log: $log)"; tail -5 "$log"; exit 1; }
echo "$stamp" >"$VENV/.stamp"
rm -f "$log"
