#!/usr/bin/env bash
# Everything the GPU machine runs in one device call (`make device-test`):
# build the CUDA library with nvcc, run the C self-test and the Go GPU tests
# (test binary built on the dev machine: go test -c -o bin/gpu/kernels.test ./kernels),
# then gpubench (bin/gpu/tutti, built on the dev machine) on the real disk and on
# RAM-backed loop devices. Logs and JSON land under $OUT; a short table last.
#
# Knobs (environment): TK_BENCH=none|small|full (default small), TK_TOKENS
# (prefix tokens, default 32768 for full), TK_STEPS (which steps; default all).
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
LOG="$OUT/device-test.log"
exec > >(tee -a "$LOG") 2>&1
BENCH=${TK_BENCH:-small}
ROOT=$PWD
LIB=$ROOT/kernels/build/libtutti_kernels.so
declare -a SUMMARY
note() { SUMMARY+=("$1"); echo "== $1"; }
t0=$(date +%s)

echo "== date $(date -u +%FT%TZ) host $(hostname) kernel $(uname -r) cpus $(nproc)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader 2>&1 | head -2
nvcc --version | tail -2
df -h / /tmp /dev/shm 2>&1 | tail -n +1
ls /usr/local/cuda/include/cufile.h /usr/local/cuda/lib64/libcufile.so* 2>&1 | head -3

# 1. build
if make -C kernels NVCC=nvcc >"$OUT/build.log" 2>&1; then
	note "build: ok ($(grep -c 'registers' "$OUT/build.log") kernels reported by ptxas)"
	grep -E 'Compiling entry|registers|spill' "$OUT/build.log" | head -20
else
	tail -40 "$OUT/build.log"
	note "build: FAILED"
	printf '%s\n' "${SUMMARY[@]}"
	exit 1
fi

# 2. C self-test (its own SQPOLL ring)
mkdir -p /var/tmp/tk
if timeout 120 kernels/build/selftest "$LIB" /var/tmp/tk; then note "selftest: PASS"; else note "selftest: FAIL ($?)"; fi

# 3. Go GPU tests
if [ -x bin/gpu/kernels.test ]; then
	if (cd kernels && TUTTI_KERNELS_LIB=$LIB timeout 300 ../bin/gpu/kernels.test -test.v -test.count=1 -test.timeout 280s) >"$OUT/gotest.log" 2>&1; then
		note "go GPU tests: PASS ($(grep -c '^--- PASS' "$OUT/gotest.log") passed, $(grep -c '^--- SKIP' "$OUT/gotest.log") skipped)"
	else
		grep -E '^(--- |FAIL|panic|\s+\w+_test.go)' "$OUT/gotest.log" | head -30
		note "go GPU tests: FAIL"
	fi
else
	note "go GPU tests: bin/gpu/kernels.test missing"
fi

# 4. gpubench
if [ "$BENCH" != none ] && [ -x bin/gpu/tutti ]; then
	export TUTTI_KERNELS_LIB=$LIB
	TOK=${TK_TOKENS:-$([ "$BENCH" = full ] && echo 32768 || echo 4096)}
	DISK=/var/tmp/tk/bench
	mkdir -p "$DISK"
	GPUFLAGS=${TK_GPUFLAGS:-}
	GPUPATHS="gpu,gpu-kick,"
	if [ -n "${TK_VARIANTS:-}" ]; then
		# GPU-path configurations, quickest first to fail: the first that
		# restores and verifies is used for the benchmark below.
		GPUPATHS=""
		while IFS= read -r v; do
			[ -z "$v" ] && continue
			rm -f /tmp/tk-variant.json
			timeout 25 bin/gpu/tutti gpubench --model llama3-70b --tokens "${TK_VTOKENS:-4096}" --dir "$DISK" --reuse --no-ceiling --rounds 1 \
				--poll-timeout 1s --paths gpu,gpu-kick $v --json /tmp/tk-variant.json >/tmp/tk-variant.txt 2>&1
			rc=$?
			ok=$(grep -c '"verify_mismatches":0' /tmp/tk-variant.json 2>/dev/null)
			echo "variant [$v]: rc $rc, verified paths $ok"
			grep -o '"path":"[^"]*"\|"bytes_per_s":[0-9.e+]*\|"error":"[^"]\{0,600\}' /tmp/tk-variant.json | head -8
			{ echo "## variant [$v]"; cat /tmp/tk-variant.txt; } >>"$OUT/variants.log"
			cat /tmp/tk-variant.json >>"$OUT/variants.jsonl" 2>/dev/null
			rowok() { sed -n "${1}p" /tmp/tk-variant.json 2>/dev/null | grep '"verify_mismatches":0,' | grep -vc '"error"'; }
			if [ "$(rowok 1)" = 1 ]; then
				CHOSEN=1; GPUFLAGS="$v"; GPUPATHS="gpu,"
				[ "$(rowok 2)" = 1 ] && GPUPATHS="gpu,gpu-kick,"
				break
			fi
		done <<<"$TK_VARIANTS"
		note "GPU variant chosen: [${GPUFLAGS}] paths [${GPUPATHS}]"
	fi
	DISKMODELS="llama3-70b deepseek-v3"
	# no GPU configuration works: the real-disk CPU paths were measured before, save the time
	[ -n "${TK_VARIANTS:-}" ] && [ -z "${CHOSEN:-}" ] && DISKMODELS=""
	for model in $DISKMODELS; do
		rm -f /tmp/tk-run.json
		timeout 150 bin/gpu/tutti gpubench --model $model --tokens "$TOK" --dir "$DISK" --label "real disk (virtio)" $GPUFLAGS \
			--paths "${GPUPATHS}uring,per-block,cufile,cufile-compat,page-cache,dram" \
			--json /tmp/tk-run.json 2>&1 | grep -v '^  '
		note "gpubench $model real disk: rc ${PIPESTATUS[0]}"
		cat /tmp/tk-run.json >>"$OUT/gpubench.jsonl"
		rm -f "$DISK"/gpubench-$model.dat "$DISK"/gpubench-$model.dat.layout
	done
	# emulated storage: 4 RAM-backed loop devices, the prefix striped over them (runs, as the store lays it out)
	LOOPS=()
	for i in 0 1 2 3; do
		truncate -s 3G /dev/shm/tk-loop$i && dev=$(losetup --find --show --direct-io=on /dev/shm/tk-loop$i 2>/dev/null || losetup --find --show /dev/shm/tk-loop$i) && LOOPS+=("$dev")
	done
	if [ ${#LOOPS[@]} -eq 4 ]; then
		devs=$(IFS=,; echo "${LOOPS[*]}")
		for model in llama3-70b deepseek-v3; do
			# cuFile on loop devices ran at 0.13 GB/s in the 4096-token run: too slow for 10 GiB here
			rm -f /tmp/tk-run.json
			timeout 100 bin/gpu/tutti gpubench --model $model --tokens "$TOK" --devices "$devs" --label "emulated storage (4 RAM-backed loop devices)" $GPUFLAGS \
				--paths "${GPUPATHS}uring,per-block,cufile-compat,page-cache,dram" \
				--json /tmp/tk-run.json 2>&1 | grep -v '^  '
			note "gpubench $model emulated: rc ${PIPESTATUS[0]}"
			cat /tmp/tk-run.json >>"$OUT/gpubench.jsonl"
		done
		# GPU-path variants on the same devices (one per line of TK_LOOP_VARIANTS,
		# e.g. "--max-io 4194304" or "--no-fixed-buffers"), GPU rows only.
		while IFS= read -r v; do
			[ -z "$v" ] && continue
			rm -f /tmp/tk-run.json
			timeout 100 bin/gpu/tutti gpubench --model llama3-70b --tokens "$TOK" --devices "$devs" --label "emulated storage (4 RAM-backed loop devices) [$v]" $GPUFLAGS $v \
				--paths "gpu,gpu-kick,per-block" --json /tmp/tk-run.json 2>&1 | grep -v '^  '
			note "gpubench llama3-70b emulated [$v]: rc ${PIPESTATUS[0]}"
			cat /tmp/tk-run.json >>"$OUT/gpubench.jsonl"
		done <<<"${TK_LOOP_VARIANTS:-}"

		for d in "${LOOPS[@]}"; do losetup -d "$d"; done
	else
		note "loop devices: only ${#LOOPS[@]} of 4 set up"
	fi
	rm -f /dev/shm/tk-loop*
fi

echo
echo "== summary ($(( $(date +%s) - t0 )) s)"
printf '%s\n' "${SUMMARY[@]}"
