#!/usr/bin/env bash
# A compile check of the CUDA sources where there is no nvcc and no GPU (this
# dev machine, CI): clang++'s CUDA front end parses and type-checks each .cu for
# the host and for the device (-fsyntax-only; no code is generated, nothing
# runs). It catches what a device call would otherwise spend its first build
# on: a misspelt CUDA call, a wrong argument count, a signature that differs
# from tutti_kernels.h. It is not a build: only `make -C kernels` on the GPU
# machine (nvcc 13, sm_90) builds and tests the libraries.
#
# Needs clang++ (Debian 12's clang 14: `apt-get install clang`) and the Python
# package registry: CUDA 11.8's runtime, nvcc and cuRAND headers come from
# NVIDIA's wheels (clang 14 reads 11.x headers; 12.x dropped what its wrapper
# includes), cached in $TK_SYNTAX_CACHE (default /tmp/tk-syntax). tk_prefill.cu
# needs cuBLAS's headers (a 400 MB wheel) and is not checked: it says so.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${TK_SYNTAX_CACHE:-/tmp/tk-syntax}
command -v clang++ >/dev/null || { echo "syntax-check: clang++ not found (apt-get install clang)" >&2; exit 2; }
cuda=$cache/cuda
if [ ! -f "$cuda/version.txt" ]; then
	mkdir -p "$cache/whl" "$cache/x"
	pip download -q --no-deps -d "$cache/whl" "nvidia-cuda-runtime-cu11==11.8.89" "nvidia-cuda-nvcc-cu11==11.8.89" \
		"nvidia-curand-cu11==10.3.0.86"
	for w in "$cache"/whl/*.whl; do python3 -m zipfile -e "$w" "$cache/x"; done
	rm -rf "$cuda" && mkdir -p "$cuda/include" "$cuda/bin" "$cuda/lib64" "$cuda/nvvm"
	for d in cuda_runtime cuda_nvcc curand; do cp -rsf "$cache/x/nvidia/$d/include/." "$cuda/include/"; done
	ln -s "$cache/x/nvidia/cuda_nvcc/nvvm/libdevice" "$cuda/nvvm/libdevice"
	echo "CUDA Version 11.8.89" >"$cuda/version.txt"
fi
fail=0
for f in "$here"/*.cu; do
	name=$(basename "$f")
	if [ "$name" = tk_prefill.cu ]; then
		echo "skip  $name (needs cuBLAS's headers)"
		continue
	fi
	if clang++ -x cuda --cuda-path="$cuda" --cuda-gpu-arch=sm_80 -std=c++17 -fsyntax-only -Wno-unknown-cuda-version \
		-I"$here" "$f"; then
		echo "ok    $name"
	else
		echo "FAIL  $name"
		fail=1
	fi
done
if ${CC:-gcc} -fsyntax-only -Wall -Werror -I"$here" "$here/test/selftest.c"; then echo "ok    test/selftest.c"; else echo "FAIL  test/selftest.c"; fail=1; fi
exit $fail
