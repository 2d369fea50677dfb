#!/usr/bin/env bash
# A build check of the CUDA sources where there is no GPU (this dev machine,
# CI): nvcc 13.0, the GPU machine's compiler major, for Linux x86-64, from
# NVIDIA's wheels on the Python package registry (nvcc, NVVM, its crt headers,
# the CUDA runtime, cuRAND's headers; pinned below, about 160 MB, cached in
# $TK_NVCC_CACHE, default /tmp/tk-nvcc). libtutti_kernels.so is built by
# kernels/Makefile's own rule (sm_90 code through ptxas, linked) into the cache;
# the testkit's sources are compiled but not linked, and tk_prefill.cu and
# test/contention.cu are skipped (cuBLAS is a 500 MB wheel): it says so. It
# catches what a device call would otherwise spend its first build on. Nothing
# runs: only the GPU machine (kernels/device-test.sh) tests the libraries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${TK_NVCC_CACHE:-/tmp/tk-nvcc}
cuda=$cache/x/nvidia/cu13
wheels=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96
	nvidia-curand==10.4.0.35)
if [ ! -f "$cache/ok" ] || [ "$(cat "$cache/ok")" != "${wheels[*]}" ]; then
	rm -rf "$cache" && mkdir -p "$cache/whl" "$cache/x"
	python3 -m pip download -q --no-deps -d "$cache/whl" "${wheels[@]}"
	for w in "$cache"/whl/*.whl; do python3 -m zipfile -e "$w" "$cache/x"; done
	chmod +x "$cuda"/bin/* "$cuda"/nvvm/bin/*
	ln -s lib "$cuda/lib64" # where nvcc.profile and the Makefile look
	echo "${wheels[*]}" >"$cache/ok"
fi
nvcc=$cuda/bin/nvcc
log=$cache/build.log
fail=0
if make -s -C "$here" NVCC="$nvcc" BUILD="$cache/build" "$cache/build/libtutti_kernels.so" >"$log" 2>&1; then
	echo "ok    libtutti_kernels.so ($("$nvcc" --version | tail -2 | head -1))"
else
	grep -E 'error|Error' "$log" | head -20
	echo "FAIL  libtutti_kernels.so (the whole log: $log)"
	fail=1
fi
for name in tk_testkit.cu tk_cufile.cu; do
	if "$nvcc" -gencode arch=compute_90,code=sm_90 -O3 -std=c++17 -Xcompiler -fPIC,-Wall -c -o "$cache/build/$name.o" \
		"$here/$name" >"$log" 2>&1; then
		echo "ok    $name (compiled)"
	else
		grep -E 'error' "$log" | head -20
		echo "FAIL  $name"
		fail=1
	fi
done
echo "skip  tk_prefill.cu, test/contention.cu (need cuBLAS)"
if ${CC:-gcc} -fsyntax-only -Wall -Werror -I"$here" "$here/test/selftest.c"; then echo "ok    test/selftest.c"; else echo "FAIL  test/selftest.c"; fail=1; fi
exit $fail
