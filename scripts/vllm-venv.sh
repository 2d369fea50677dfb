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
# About 5.9 GB installed, 7.3 GB at the peak of torch's install (measured, pip
# without its cache), a minute or two from the package registry; the rest of
# `make test` takes about 2.2 GB more beside it (a fresh clone's run peaked at
# 8.1 GB), hence the default below.
# Where the disk has less than NEED_MB free (VLLM_VENV_NEED_MB, default 10240)
# before the install, or runs out during it, no environment is made: the
# partial one is removed, the reason is written to $VLLM_VENV.skipped and
# printed, the script exits 0, and the tests that need it skip naming that
# reason. Any other failure (the registry, an import) fails the script.
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
NEED_MB=${VLLM_VENV_NEED_MB:-10240}
SKIPPED=$VENV.skipped
rm -rf "$VENV" "$SKIPPED"
# skip REASON: no environment, said where the tests will find it.
skip() {
	rm -rf "$VENV"
	echo "$1" >"$SKIPPED"
	echo "vllm-venv: SKIPPED, no vLLM environment: $1 (the tests under vLLM's own scheduler skip; written to $SKIPPED)"
	exit 0
}
# free_mb DIR: megabytes free to this user on DIR's file system.
free_mb() { df -Pm "$1" | awk 'NR == 2 { print $4 }'; }
tmp=${TMPDIR:-/tmp}
mkdir -p "$(dirname "$VENV")"
for d in "$(dirname "$VENV")" "$tmp"; do
	f=$(free_mb "$d")
	if [ "$f" -lt "$NEED_MB" ]; then
		skip "$f MB free on $d's file system, the install needs $NEED_MB MB (VLLM_VENV_NEED_MB)"
	fi
done
echo "vllm-venv: making $VENV (torch 2.11.0, vLLM 0.26.0; about 5.9 GB, $NEED_MB MB free needed)"
"$PY" -m venv "$VENV"
log=$(mktemp "$tmp/vllm-venv.XXXXXX.log")
pip=("$VENV/bin/pip" install --disable-pip-version-check --no-cache-dir -q)
if ! { "${pip[@]}" torch==2.11.0 && "${pip[@]}" --no-deps -r "$R2" -r "$R1"; } >"$log" 2>&1; then
	if grep -q "No space left on device" "$log"; then
		tail -3 "$log"
		skip "the disk filled during pip's install ($(free_mb "$(dirname "$VENV")") MB free after removing it; log $log)"
	fi
	echo "vllm-venv: pip failed (log: $log)"
	tail -5 "$log"
	exit 1
fi
(cd /tmp && HF_HUB_OFFLINE=1 "$VENV/bin/python" "$ROOT/eval/vllm/imports.py" >>"$log" 2>&1) ||
	{ echo "vllm-venv: vLLM's LLM path does not import (log: $log)"; tail -5 "$log"; exit 1; }
echo "$stamp" >"$VENV/.stamp"
rm -f "$log"
