#!/usr/bin/env bash
# The Python binding's run on the GPU machine, in one device call:
#   1. build the CUDA kernels (the GPU path needs them; without them the
#      example falls back to the CPU path and says so),
#   2. the Python tests (stdlib ones, then the torch ones on CUDA),
#   3. llama_loop.py on the machine's disk (/var/tmp, ext4 on virtio) and on
#      a RAM-backed loop device with ext4 (emulated fast storage: label it so).
# The GPU machine has no Go: build bin/libtutti.so on the dev machine
# (`make python-test` does) and carry bin:
#   OUT=$OUT bash python/examples/device-run.sh
# Every output (logs, JSON, summary) is packed into ONE file, $OUT/py.tgz;
# the summary is printed last; the step timeouts below bound the call.
#
# Default shape of llama_loop (LLAMA_ARGS): full-width Llama-3-70B layers
# (hidden 8192, 64 heads, 8 KV heads, MLP 28672, bf16), 32 layers sharing
# the weights of 8 distinct ones, a 16,384-token prefix, 1 warm-up and 3
# timed repetitions, each on its own prefix. Why:
#   - full width: per layer, recompute runs the real 70B GEMMs (weights
#     streamed from HBM; a layer is 1.7 GB, no cache holds it) and tutti
#     reads the real 70B KV (16 tokens x 8 heads x 128 x 2 planes x 2 bytes
#     = 64 KiB per page and layer: 64 MiB per layer at 16K tokens), so the
#     load-vs-recompute ratio per layer is the real one;
#   - 32 layers, not 80: both TTFTs grow linearly with layers (tutti's
#     pipeline adds one layer's load up front), so 32 layers show the ratio
#     of 80 within a few percent; 80 layers would take 2.5x the time. The
#     weight sharing keeps weights at 15 GB (80 distinct layers: 140 GB,
#     more than the H200's HBM); the KV cache for 7 page sets is 14 GiB;
#   - 16K tokens: 2 GiB of KV per request, enough that reading it from the
#     disk and recomputing it both dwarf a call's fixed costs; 4 prefixes =
#     8 GiB written and read, 9 full 16K forwards per run. For 32K tokens (4
#     GiB per request, attention's quadratic share grows) set
#     LLAMA_ARGS="--layers 32 --distinct-layers 8 --prefix-tokens 32768"
#     (about twice as long; LOOP_GIB=24).
#
# HF=1 adds hf_serve.py (transformers' Llama-3-8B and Qwen2-7B shapes on
# tutti's KV, 4 RAM-backed loop devices of HF_LOOP_GIB (7) and the disk;
# HF_ARGS its flags, HF_TIMEOUT 420 s); SKIP_LLAMA=1 leaves llama_loop out.
# Knobs: LLAMA_ARGS (llama_loop.py flags, replacing the defaults),
# SKIP_LOOP=1 (no loop device), SKIP_TESTS=1 (no Python tests: a second
# run of the example with other flags), LOOP_GIB (size of the RAM-backed image,
# default 12), BUILD_TIMEOUT / TEST_TIMEOUT / LLAMA_TIMEOUT (seconds per step:
# 150 / 120 / 130 per run, 530 in all, so that a hang cannot eat the device
# call's 10 minutes and the tarball is always written).
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
ROOT=$PWD
. "$ROOT/scripts/emuloop.sh"
W=$(mktemp -d /tmp/tutti-py.XXXXXX) # packed into $OUT/py.tgz at exit
export TUTTI_LIB=$ROOT/bin/libtutti.so PYTHONPATH=$ROOT/python
LLAMA_ARGS=${LLAMA_ARGS:---layers 32 --distinct-layers 8 --prefix-tokens 16384 --reps 3 --warmup 1}
LOOP_GIB=${LOOP_GIB:-12}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-150}
TEST_TIMEOUT=${TEST_TIMEOUT:-120}
LLAMA_TIMEOUT=${LLAMA_TIMEOUT:-130}
declare -a SUMMARY
note() { SUMMARY+=("$1"); echo "== $1"; }
img="" mnt="" dev=""

finish() {
	if [ -n "$mnt" ] && mountpoint -q "$mnt"; then umount "$mnt"; fi
	[ -n "$dev" ] && losetup -d "$dev" 2>/dev/null
	[ -n "$img" ] && rm -f "$img"
	rm -rf /var/tmp/tutti-llama
	note "wall: ${SECONDS}s"
	{
		echo
		echo "== summary"
		for s in "${SUMMARY[@]}"; do echo "  $s"; done
	} | tee "$W/summary.txt"
	tar -C "$W" -czf "$OUT/py.tgz" . && rm -rf "$W"
	echo "(all outputs in \$OUT/py.tgz)"
}
trap finish EXIT

if [ ! -f "$TUTTI_LIB" ]; then
	note "no $TUTTI_LIB: build it on the dev machine (make python-test) and carry bin"
	exit 1
fi
{
	echo "== $(date -u +%FT%TZ) $(hostname) $(nproc) cpus, kernel $(uname -r)"
	nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 | head -2
	python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1
	df -h /var/tmp /dev/shm 2>&1
	free -g 2>&1
} | tee "$W/machine.txt"

if ! command -v nvcc >/dev/null; then
	note "kernels: not built (no nvcc): GPU-path tests skip, the example uses the CPU path"
elif timeout -k 10 "$BUILD_TIMEOUT" make -C kernels NVCC=nvcc build/libtutti_kernels.so >"$W/kernels-build.log" 2>&1 &&
	[ -f "$ROOT/kernels/build/libtutti_kernels.so" ]; then
	export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
	note "kernels: built (${SECONDS}s)"
else
	note "kernels: not built (see kernels-build.log): GPU-path tests skip, the example uses the CPU path"
fi

if [ -n "${SKIP_TESTS:-}" ]; then
	note "python tests: skipped (SKIP_TESTS)"
else
	timeout -k 10 "$TEST_TIMEOUT" python3 -m unittest discover -s python/tests -v >"$W/python-tests.txt" 2>&1
	rc=$?
	note "python tests: rc=$rc$([ $rc = 124 ] && echo " (timed out after ${TEST_TIMEOUT}s)"), $(tail -1 "$W/python-tests.txt") (${SECONDS}s)"
	grep -E "\.\.\. (skipped|FAIL|ERROR)" "$W/python-tests.txt" | head -20
fi

run_llama() { # name dir
	local t=$SECONDS
	# shellcheck disable=SC2086 # LLAMA_ARGS is a list of flags
	timeout -k 10 "$LLAMA_TIMEOUT" python3 python/examples/llama_loop.py --dir "$2" --json "$W/llama_loop_$1.json" \
		$LLAMA_ARGS >"$W/llama_loop_$1.txt" 2>&1
	local rc=$?
	[ $rc = 124 ] && echo "timed out after ${LLAMA_TIMEOUT}s" >>"$W/llama_loop_$1.txt"
	sed -n '/^TTFT breakdown/,$p' "$W/llama_loop_$1.txt"
	note "llama_loop ($1, $2, $((SECONDS - t))s): rc=$rc: $(tail -1 "$W/llama_loop_$1.txt")"
}

# transformers' own models on tutti's KV (hf_serve.py): HF=1, on 4 RAM-backed
# loop devices (emulated fast storage) and the machine's disk, both paths.
if [ -n "${HF:-}" ]; then
	hfmnts=""
	for i in 0 1 2 3; do
		himg=/dev/shm/tutti-hf$i.img hmnt=/mnt/tutti-hf$i
		emu_backing "$himg" "${HF_LOOP_GIB:-7}G"
		if hdev=$(losetup --find --show --direct-io=on "$himg") && mkfs.ext4 -q -F "$hdev" && mkdir -p "$hmnt" && mount "$hdev" "$hmnt"; then
			hfmnts="$hfmnts${hfmnts:+,}$hmnt"
			HF_LOOPS="${HF_LOOPS:-} $hdev:$himg:$hmnt"
		fi
	done
	note "hf: loop devices (RAM-backed, emulated fast storage): $hfmnts"
	mkdir -p /var/tmp/tutti-hf
	t=$SECONDS
	# shellcheck disable=SC2086 # HF_ARGS is a list of flags
	timeout -k 10 "${HF_TIMEOUT:-420}" python3 python/examples/hf_serve.py --storage "loop4=$hfmnts" \
		--storage disk=/var/tmp/tutti-hf --json "$W/hf_serve.jsonl" ${HF_ARGS:-} >"$W/hf_serve.txt" 2>&1
	rc=$?
	sed -n '/^model /,$p' "$W/hf_serve.txt"
	note "hf_serve ($((SECONDS - t))s): rc=$rc: $(tail -1 "$W/hf_serve.txt")"
	for x in ${HF_LOOPS:-}; do
		IFS=: read -r hdev himg hmnt <<<"$x"
		umount "$hmnt"; losetup -d "$hdev"; rm -f "$himg"
	done
	rm -rf /var/tmp/tutti-hf
fi

if [ -z "${SKIP_LLAMA:-}" ]; then
	rm -rf /var/tmp/tutti-llama && mkdir -p /var/tmp/tutti-llama
	run_llama disk /var/tmp/tutti-llama
	rm -rf /var/tmp/tutti-llama
fi

if [ -z "${SKIP_LOOP:-}" ] && [ -z "${SKIP_LLAMA:-}" ] && [ "$(id -u)" = 0 ]; then
	avail=$(df --output=avail -BG /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
	if [ -n "$avail" ] && [ "$avail" -gt "$LOOP_GIB" ]; then
		img=/dev/shm/tutti-py.img mnt=/mnt/tutti-py
		emu_backing "$img" "${LOOP_GIB}G"
		if dev=$(losetup --find --show --direct-io=on "$img" 2>/dev/null || losetup --find --show "$img") &&
			mkfs.ext4 -q -F "$dev" && mkdir -p "$mnt" && mount "$dev" "$mnt"; then
			note "loop device: $dev over $img (${LOOP_GIB} GiB, RAM-backed: emulated fast storage), direct-io $(cat /sys/block/"${dev#/dev/}"/loop/dio 2>/dev/null)"
			run_llama ramloop "$mnt"
		else
			note "loop device: setup failed"
		fi
	else
		note "loop device: skipped, /dev/shm has ${avail:-?} GiB free, need more than $LOOP_GIB"
	fi
fi
