#!/usr/bin/env bash
# Diagnosis of the GPU-driven path inside `tutti gpubench` (it restores and
# verifies in the Go GPU tests and the C self-test, but timed out in gpubench on
# 2026-11-29: the kernel never consumed the GPU-published SQEs). One device
# call, about 40 s: gpubench's GPU paths on a fresh machine BEFORE anything
# else ran, then the Go GPU tests, then gpubench again; on a timeout gpubench
# prints the kernel stacks of the io_uring threads. Needs bin/gpu (carry it).
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT" /var/tmp/tk/bench
exec > >(tee -a "$OUT/device-diag.log") 2>&1
make -C kernels NVCC=nvcc >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
export TUTTI_KERNELS_LIB=$PWD/kernels/build/libtutti_kernels.so
run() {
	timeout 40 bin/gpu/tutti gpubench --model llama3-70b --tokens "${1:-640}" --dir /var/tmp/tk/bench --no-ceiling \
		--poll-timeout 2s --paths gpu,gpu-kick,uring ${2:-} 2>&1 | tail -40
}
echo "== 1. gpubench first, fresh machine"; run 640
echo "== 2. Go GPU tests"; (cd kernels && timeout 120 ../bin/gpu/kernels.test -test.run GPU -test.v 2>&1 | grep -E '^(--- |ok|FAIL|PASS)')
echo "== 3. gpubench after the tests"; run 640
echo "== 4. gpubench, 4096 tokens, test-like window"; run 4096 "--window 24 --max-io 65536 --lookahead 1"
