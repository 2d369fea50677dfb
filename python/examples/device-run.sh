#!/usr/bin/env bash
# The Python binding's run on the GPU machine, in one device call:
#   1. build the CUDA kernels (the GPU path needs them; without them the
#      example falls back to the CPU path and says so),
#   2. the Python tests (stdlib ones, then the torch ones on CUDA),
#   3. llama_loop.py on the machine's disk (/var/tmp, ext4 on virtio) and on
#      a RAM-backed loop device with ext4 (emulated fast storage: label it so).
# The GPU machine has no Go: build bin/libtutti.so on the dev machine
# (`go build -buildmode=c-shared -o bin/libtutti.so ./runtime/capi`) and
# carry bin. Results land in $OUT; a summary is printed last.
#
# Knobs: LLAMA_ARGS (extra llama_loop.py flags), SKIP_LOOP=1 (no loop device).
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
ROOT=$PWD
export TUTTI_LIB=$ROOT/bin/libtutti.so PYTHONPATH=$ROOT/python
declare -a SUMMARY
note() { SUMMARY+=("$1"); echo "== $1"; }

if [ ! -f "$TUTTI_LIB" ]; then
	echo "no $TUTTI_LIB: build it on the dev machine and carry bin" >&2
	exit 1
fi
echo "== $(date -u +%FT%TZ) $(hostname) $(nproc) cpus"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1

if command -v nvcc >/dev/null && make -C kernels NVCC=nvcc >"$OUT/kernels-build.log" 2>&1 &&
	[ -f "$ROOT/kernels/build/libtutti_kernels.so" ]; then
	export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
	note "kernels: built"
else
	note "kernels: not built (see kernels-build.log): GPU-path tests skip, the example uses the CPU path"
fi

python3 -m unittest discover -s python/tests -v >"$OUT/python-tests.txt" 2>&1
rc=$?
note "python tests: rc=$rc, $(tail -1 "$OUT/python-tests.txt")"
grep -E "\.\.\. (skipped|FAIL|ERROR)" "$OUT/python-tests.txt" | head -20

run_llama() { # name dir
	python3 python/examples/llama_loop.py --dir "$2" --json "$OUT/llama_loop_$1.json" ${LLAMA_ARGS:-} >"$OUT/llama_loop_$1.txt" 2>&1
	local rc=$?
	note "llama_loop ($1, $2): rc=$rc: $(tail -1 "$OUT/llama_loop_$1.txt")"
}

rm -rf /var/tmp/tutti-llama && mkdir -p /var/tmp/tutti-llama
run_llama disk /var/tmp/tutti-llama
rm -rf /var/tmp/tutti-llama

if [ -z "${SKIP_LOOP:-}" ] && [ "$(id -u)" = 0 ]; then
	img=/dev/shm/tutti-py.img mnt=/mnt/tutti-py
	truncate -s 6G "$img"
	if dev=$(losetup --find --show --direct-io=on "$img" 2>/dev/null || losetup --find --show "$img") &&
		mkfs.ext4 -q -F "$dev" && mkdir -p "$mnt" && mount "$dev" "$mnt"; then
		run_llama ramloop "$mnt"
		umount "$mnt"
	else
		note "loop device: setup failed"
	fi
	[ -n "${dev:-}" ] && losetup -d "$dev" 2>/dev/null
	rm -f "$img"
fi

echo
echo "== summary"
for s in "${SUMMARY[@]}"; do echo "  $s"; done
