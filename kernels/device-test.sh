#!/usr/bin/env bash
# Everything the GPU machine runs in one device call (`make device-test`):
# build both CUDA libraries with nvcc (the product's and the test kit's), run
# the C self-test and every GPU test, then gpubench on RAM-backed loop
# devices (labelled emulated) and on the machine's real disk. The GPU machine has no Go: build the binaries on the
# dev machine first and carry bin/ (`make gpu-bins`).
#
# Everything lands in $TK_WORK (default /tmp/device-test) and is packed into
# ONE file, $OUT/<its name>.tgz, at exit (the device tool brings back at
# most 8 files); the summary is printed last and is in summary.txt.
#
# Knobs (environment):
#   TK_STEPS   which steps, of "build selftest tests serve oneblock bench"
#              (default all). serve: a `tutti serve` over 4 loops (ext4) and
#              serve-bench's GPU-path engines restoring through it, one then
#              two at once then one (about 110 s); oneblock: runtime's
#              BenchmarkLoadOneBlock on 8 loops, GPU path (about 60 s)
#   TK_BENCH   product (default) store-gpu and store-cpu (runtime.Store's
#                    Save and Load) beside the kernels-only rows (GPU kick
#                    mode, (a); per-block and cuFile compat on 8 loops) for
#                    llama3-8b, llama3-70b and deepseek-v3 on 4 and 8 loops
#                    and the real disk, one round each, within TK_BENCH_S;
#              pool  the set a choice between GPU and (a) rests on: 70B and MLA on
#                    the loops (GPU, (a), per-block), 70B on the disk (GPU,
#                    (a)), TK_ROUNDS rounds each, then gpubench-pool;
#              paths every path (GPU, (a), per-block, cuFile,
#                    cuFile compat, page cache, DRAM), both models, both
#                    storages, one round each;
#              threshold  the product path's thresholds on steady emulated
#                    storage: ceilings sampled on 4 and 8 loops (emu_steady),
#                    then on 8 loops llama3-8b's kernels rows (GPU kick,
#                    per-block, cuFile compat) on the raw loops and its store
#                    rows (ext4), TK_ROUNDS rounds each (default 6)
#              none
#   TK_ROUNDS  gpubench rounds per file (default 6 for pool, 1 for paths;
#              keep it even for a pool: the paths' order is balanced over
#              pairs of rounds)
#   TK_TOKENS  prefix tokens (default 32768)
#   TK_BENCH_S product: no new gpubench run starts after this many seconds
#              of the script (default 480; the whole call stays under 10 min)
#   TK_RUN_S   the limit of one gpubench run in seconds (default 400)
#   TK_STORE_ROUNDS  product: gpubench rounds of the store rows (default 1;
#              each round of a model costs both paths' operations and 16
#              ceiling samples, about 20 s beyond them)
#   TK_KERNEL_ROWS  product: 0 leaves the kernels-only rows out (the store
#              rows alone, when the kernels rows were measured already)
#   TK_FLAGS   extra gpubench flags for every run (a diagnostic such as
#              "--window 32"; such a run is never a default-settings pool)
#   TK_DISK    the real disk's directory (default /var/tmp/tk)
#   TK_COMMIT  the commit the binaries were built from, for machine.txt
set -u
OUT=${OUT:-$PWD/out}
W=${TK_WORK:-/tmp/device-test}
STEPS=${TK_STEPS:-build selftest tests serve oneblock bench}
BENCH=${TK_BENCH:-product}
BENCH_S=${TK_BENCH_S:-480}
RUN_S=${TK_RUN_S:-400}
ROUNDS=${TK_ROUNDS:-$([ "$BENCH" = paths ] && echo 1 || echo 6)}
SERVE_S=${TK_SERVE_S:-20}
STORE_ROUNDS=${TK_STORE_ROUNDS:-1}
TOKENS=${TK_TOKENS:-32768}
FLAGS=${TK_FLAGS:-}
DISK=${TK_DISK:-/var/tmp/tk}
ROOT=$PWD
. "$ROOT/scripts/emuloop.sh"
LIB=$ROOT/kernels/build/libtutti_kernels.so
TESTKIT=$ROOT/kernels/build/libtutti_testkit.so
LOOPS=()
MOUNTS=()
SUMMARY=()
t0=$(date +%s)

rm -rf "$W" && mkdir -p "$W" "$OUT" || exit 1
note() { SUMMARY+=("$1 [$(($(date +%s) - t0)) s]"); echo "== $1"; }
finish() {
	unloops
	printf '%s\n' "${SUMMARY[@]}" >"$W/summary.txt"
	tar czf "$OUT/$(basename "$W").tgz" -C "$(dirname "$W")" "$(basename "$W")"
	echo; echo "== summary ($(($(date +%s) - t0)) s)"; cat "$W/summary.txt"
}
trap finish EXIT
exec > >(tee -a "$W/device-test.log") 2>&1
step() { [[ " $STEPS " == *" $1 "* ]]; }

{
	echo "date $(date -u +%FT%TZ) host $(hostname) kernel $(uname -r) cpus $(nproc)"
	echo "steps [$STEPS] bench $BENCH rounds $ROUNDS store rounds $STORE_ROUNDS tokens $TOKENS flags [$FLAGS]"
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,temperature.gpu --format=csv,noheader 2>&1 | head -2
	nvcc --version 2>&1 | tail -2
	echo "commit ${TK_COMMIT:-not given: set TK_COMMIT, the .git copied there may lag the tree}"
} | tee "$W/machine.txt"

# 1. build
if step build; then
	if make -C kernels NVCC=nvcc >"$W/build.log" 2>&1; then
		note "build: ok ($(grep -c 'registers' "$W/build.log") kernels reported by ptxas)"
	else
		tail -40 "$W/build.log"
		note "build: FAILED"
		exit 1
	fi
fi
[ -f "$LIB" ] && [ -f "$TESTKIT" ] || { note "no $LIB or $TESTKIT: run the build step"; exit 1; }
export TUTTI_KERNELS_LIB=$LIB TUTTI_TESTKIT_LIB=$TESTKIT
# The product's library must hold no test or baseline symbol.
if nm -D --defined-only "$LIB" | grep -E ' (tkt_|tk_kv_|tk_cufile|tk_prefill|tk_fail_msg)' >"$W/lib-leaks.txt"; then
	note "product library exports test symbols: $(tr '\n' ' ' <"$W/lib-leaks.txt")"
else note "product library: no test or baseline symbols"; fi

# 2. C self-test (its own SQPOLL ring)
if step selftest; then
	mkdir -p "$DISK"
	if timeout 120 kernels/build/selftest "$LIB" "$DISK" "$TESTKIT" >"$W/selftest.log" 2>&1; then note "selftest: PASS"; else note "selftest: FAIL ($?)"; fi
fi

# 3. GPU tests: a test binary built on the dev machine, run in its package's
# folder (testdata), with the tests that need the GPU named by -test.run.
gotest() { # name dir binary timeout_s run
	local name=$1 dir=$2 bin=$ROOT/$3 limit=$4 run=$5
	if [ ! -x "$bin" ]; then note "$name: $3 missing (make gpu-bins)"; return; fi
	(cd "$dir" && timeout "$limit" "$bin" -test.v -test.count=1 -test.run "$run") >"$W/$name.log" 2>&1
	local rc=$?
	local counts="$(grep -cE '^\s*--- PASS' "$W/$name.log") passed, $(grep -cE '^\s*--- SKIP' "$W/$name.log") skipped"
	if [ $rc -eq 0 ]; then note "$name: PASS ($counts)"; else
		grep -E '^\s*--- FAIL|^FAIL|^panic|_test.go:[0-9]+:' "$W/$name.log" | head -20
		note "$name: FAIL rc $rc ($counts)"
	fi
}
if step tests; then
	gotest kernels-test kernels bin/gpu/kernels.test 300 .
	gotest testkit-test kernels/testkit bin/gpu/testkit.test 120 .
	gotest runtime-test runtime bin/gpu/runtime.test 150 'GPU|DeviceWindow|WindowFor'
	gotest tp-test runtime/tp bin/gpu/tp.test 150 GPU
	gotest harness-test eval/harness bin/gpu/harness.test 150 '^Test(TuttiGPU|GPUCompute)'
	if [ -f bin/libtutti.so ]; then
		TUTTI_LIB=$ROOT/bin/libtutti.so PYTHONPATH=$ROOT/python timeout -k 10 150 \
			python3 -m unittest discover -s python/tests -v >"$W/python-tests.log" 2>&1
		rc=$?
		grep -E '^(FAIL|ERROR):' "$W/python-tests.log" | head -10
		note "python tests: $([ $rc -eq 0 ] && echo PASS || echo "FAIL rc $rc") ($(grep -E '^Ran [0-9]+ tests' "$W/python-tests.log"); $(tail -1 "$W/python-tests.log"))"
		# The connector's and the worker side's tests again with their tensors on cuda:0 and tutti's GPU path.
		(cd python/tests && TUTTI_TEST_PATH=gpu TUTTI_LIB=$ROOT/bin/libtutti.so PYTHONPATH=$ROOT/python:$ROOT/python/tests \
			timeout -k 10 150 python3 -m unittest -v test_vllm_adapter test_worker_side) >"$W/python-gpu-path.log" 2>&1
		rc=$?
		grep -E '^(FAIL|ERROR):' "$W/python-gpu-path.log" | head -10
		note "python tests, GPU path (vLLM adapter, worker side): $([ $rc -eq 0 ] && echo PASS || echo "FAIL rc $rc") ($(grep -E '^Ran [0-9]+ tests' "$W/python-gpu-path.log"); $(tail -1 "$W/python-gpu-path.log"))"
	else
		note "python tests: bin/libtutti.so missing (make gpu-bins)"
	fi
fi

# 4. gpubench
gb() { # name gpubench-args...
	local name=$1
	shift
	timeout "$RUN_S" bin/gpu/tutti gpubench --tokens "$TOKENS" --json "$W/$name.json" $FLAGS "$@" >"$W/$name.txt" 2>&1
	note "gpubench $name: rc $?"
	local line # the product rows and their ceilings, in the summary too
	while IFS= read -r line; do SUMMARY+=("  $name: ${line## }"); done < <(grep -E '^  store-(gpu|cpu)[ /]|^ceilings over' "$W/$name.txt" | cut -c1-200)
}
loops() { # n size [steady]: n loop devices over /dev/shm files, O_DIRECT, under emu_limit; with
	# "steady", emu_steady samples their ceilings first (EMU_STEADY_SAMPLES, default 8) into the summary
	local n=$1 size=$2 i files=() line
	for ((i = 0; i < n; i++)); do files+=("/dev/shm/tk-loop$i"); done
	emu_backing_many "$size" "${files[@]}" || return 1
	mapfile -t files < <(emu_loops "${files[@]}" 2>>"$W/emudev.txt")
	LOOPS+=("${files[@]}")
	[ ${#files[@]} = "$n" ] || { note "loop devices: ${#files[@]} of $n ($EMU_LIMITER; emudev.txt)"; return 1; }
	note "$(emu_limit "${LOOPS[@]}")"
	[ "${3:-}" = steady ] || return 0
	emu_steady bin/gpu/tutti "${EMU_STEADY_SAMPLES:-8}" 1GiB "${LOOPS[@]}" >"$W/steady-$n.txt" 2>&1
	while IFS= read -r line; do note "$line"; done < <(grep ceiling "$W/steady-$n.txt")
	return 0
}
unloops() { # detaches the loops (and unmounts their filesystems)
	local d
	for d in "${MOUNTS[@]}"; do umount "$d"; done
	MOUNTS=()
	emu_unlimit "${LOOPS[@]}"
	for d in "${LOOPS[@]}"; do losetup -d "$d"; done
	LOOPS=()
	emu_devices_stop >>"$W/emudev.txt"
	rm -f /dev/shm/tk-loop*
}
mountloops() { # ext4 on every loop, mounted under /mnt/tk-loopN; sets STORE_DIRS
	local i=0 d m dirs=()
	for d in "${LOOPS[@]}"; do
		m=/mnt/tk-loop$i
		mkdir -p "$m" && mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$d" && mount "$d" "$m" || return 1
		MOUNTS+=("$m")
		dirs+=("$m")
		i=$((i + 1))
	done
	STORE_DIRS=$(IFS=,; echo "${dirs[*]}")
}
# serve: two engine processes on one GPU restoring through one node service
# (issue 50): the pair's total against one engine alone, every byte verified.
servestep() {
	loops 4 6G || { note "serve: loop devices: ${#LOOPS[@]} of 4 set up"; unloops; return; }
	mountloops || { note "serve: ext4 on the loops failed"; unloops; return; }
	local sock=/tmp/tk-serve.sock pid rc line
	rm -f "$sock"
	bin/gpu/tutti serve --dir "$STORE_DIRS" --socket "$sock" --model llama3-8b --capacity-blocks 128 --no-prewrite >"$W/serve.log" 2>&1 &
	pid=$!
	for _ in $(seq 300); do [ -S "$sock" ] && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	[ -S "$sock" ] || { note "serve: no socket: $(tail -3 "$W/serve.log" | tr '\n' ' ' | cut -c1-300)"; kill -9 "$pid" 2>/dev/null; unloops; return; }
	local B=(bin/gpu/tutti serve-bench --socket "$sock" --model llama3-8b --path gpu --prefixes 8 --min-blocks 8 --max-blocks 8 --load-only --duration "${SERVE_S}s")
	for run in "populate --engines 1 --populate" "two --engines 2" "one --engines 1"; do
		set -- $run
		local name=$1
		shift
		timeout 120 "${B[@]}" "$@" >"$W/serve-bench-$name.txt" 2>&1
		rc=$?
		line=$(grep -E '^total' "$W/serve-bench-$name.txt" | tail -1 | cut -c1-200)
		note "serve-bench $name: rc $rc ${line:-$(tail -2 "$W/serve-bench-$name.txt" | tr '\n' ' ' | cut -c1-200)}"
	done
	kill -INT "$pid" 2>/dev/null
	for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null
	unloops
}
if step serve; then
	if [ -x bin/gpu/tutti ]; then servestep; else note "serve: bin/gpu/tutti missing (make gpu-bins)"; fi
fi

# oneblock: the fixed cost of a Load (issue 46): one block restored on the GPU path
# over 8 loops (ext4), spread against one device per run.
if step oneblock; then
	if loops 8 2G && mountloops; then
		(cd runtime && TUTTI_BENCH_PATH=gpu TUTTI_BENCH_DIRS=$STORE_DIRS timeout 200 "$ROOT/bin/gpu/runtime.test" \
			-test.run '^$' -test.bench 'LoadOneBlock$' -test.benchtime 20x) >"$W/oneblock.txt" 2>&1
		note "oneblock: rc $?"
		while IFS= read -r line; do SUMMARY+=("  ${line}"); done < <(grep -E '^Benchmark' "$W/oneblock.txt" | cut -c1-200)
	else note "oneblock: loops or ext4 failed"; fi
	unloops
fi

budget() { # true while the bench is within TK_BENCH_S of the script's start
	[ $(($(date +%s) - t0)) -lt "$BENCH_S" ] && return 0
	note "bench: time budget ${BENCH_S} s spent, the rest skipped"
	return 1
}
# product: the product paths (store-gpu, store-cpu: runtime.Store Save and
# Load) beside the kernels-only rows, for three models on 4 and 8 loops
# (raw devices for the kernels rows, ext4 on the same loops for the store)
# and on the real disk; one round each (TK_STORE_ROUNDS for the store rows).
product() {
	local n size kp m
	for n in 4 8; do
		size=$([ "$n" = 4 ] && echo 5G || echo 3G)
		kp=gpu-kick,uring
		[ "$n" = 8 ] && kp=gpu-kick,uring,per-block,cufile-compat
		loops "$n" "$size" steady || { note "loop devices: ${#LOOPS[@]} of $n set up"; return 1; }
		local devs label="emulated storage ($n RAM-backed loop devices)"
		devs=$(IFS=,; echo "${LOOPS[*]}")
		for m in llama3-8b llama3-70b deepseek-v3; do
			[ "${TK_KERNEL_ROWS:-1}" = 0 ] && break
			budget || return 0
			gb "emu$n-$m" --model $m --devices "$devs" --label "$label" --rounds 1 --paths $kp
			files+=("$W/emu$n-$m.json")
		done
		mountloops || { note "ext4 on the $n loops failed"; unloops; return 1; }
		for m in llama3-8b llama3-70b deepseek-v3; do
			budget || { unloops; return 0; }
			gb "emu$n-store-$m" --model $m --store-dirs "$STORE_DIRS" --label "$label (ext4)" --rounds "$STORE_ROUNDS" --paths store-gpu,store-cpu
		done
		unloops
	done
	for m in llama3-8b llama3-70b deepseek-v3; do
		budget || return 0
		if [ "${TK_KERNEL_ROWS:-1}" != 0 ]; then
			gb "disk-$m" --model $m --dir "$DISK" --label "$REAL" --rounds 1 --paths gpu-kick,uring
			files+=("$W/disk-$m.json")
			rm -rf "$DISK"/gpubench-*
		fi
		budget || return 0
		gb "disk-store-$m" --model $m --dir "$DISK" --label "$REAL" --rounds "$STORE_ROUNDS" --paths store-gpu,store-cpu
	done
}
if step bench && [ "$BENCH" != none ]; then
	[ -x bin/gpu/tutti ] || { note "gpubench: bin/gpu/tutti missing (make gpu-bins)"; exit 1; }
	EMU="emulated storage (4 RAM-backed loop devices)"
	REAL="real disk (virtio)"
	mkdir -p "$DISK"
	files=()
	if [ "$BENCH" != product ] && [ "$BENCH" != threshold ]; then
		loops 4 3G steady || { note "loop devices: ${#LOOPS[@]} of 4 set up"; exit 1; }
		devs=$(IFS=,; echo "${LOOPS[*]}")
	fi
	case $BENCH in
	product)
		product
		;;
	threshold)
		loops 4 2G steady
		unloops
		loops 8 3G steady || { note "loop devices: ${#LOOPS[@]} of 8 set up"; exit 1; }
		devs=$(IFS=,; echo "${LOOPS[*]}")
		label="emulated storage (8 RAM-backed loop devices, limit: $EMU_LIMITER at $EMU_RATE_BPS B/s each)"
		gb emu8-llama3-8b --model llama3-8b --devices "$devs" --label "$label" --rounds "$ROUNDS" --paths gpu-kick,per-block,cufile-compat
		files+=("$W/emu8-llama3-8b.json")
		if mountloops; then
			gb emu8-store-llama3-8b --model llama3-8b --store-dirs "$STORE_DIRS" --label "$label (ext4)" --rounds "$ROUNDS" --paths store-gpu,store-cpu
		else note "ext4 on the 8 loops failed"; fi
		unloops
		;;
	pool)
		gb g1 --model llama3-70b --devices "$devs" --label "$EMU" --paths gpu-kick,uring,per-block --rounds "$ROUNDS"
		gb g2 --model deepseek-v3 --devices "$devs" --label "$EMU" --paths gpu-kick,uring,per-block --rounds "$ROUNDS"
		gb d1 --model llama3-70b --dir "$DISK" --label "$REAL" --paths gpu-kick,uring --rounds "$ROUNDS"
		files=("$W/g1.json" "$W/g2.json" "$W/d1.json")
		;;
	paths)
		# cuFile refuses the virtio disk (error 5027) and is not worth its time on the loops: the real
		# cuFile path runs on the disk (its refusal is the result), the compat path on both.
		files=()
		for m in llama3-70b deepseek-v3; do
			gb "emu-$m" --model $m --devices "$devs" --label "$EMU" --rounds "$ROUNDS" \
				--paths gpu-kick,uring,per-block,cufile-compat,page-cache,dram
			gb "disk-$m" --model $m --dir "$DISK" --label "$REAL" --rounds "$ROUNDS" \
				--paths gpu-kick,uring,per-block,cufile,cufile-compat,page-cache,dram
			files+=("$W/emu-$m.json" "$W/disk-$m.json")
		done
		;;
	*)
		note "TK_BENCH=$BENCH: want product, threshold, pool, paths or none"
		exit 1
		;;
	esac
	rm -rf "$DISK"/gpubench-*
	if [ ${#files[@]} -gt 0 ]; then
		bin/gpu/tutti gpubench-pool "${files[@]}" >"$W/pool.txt" 2>&1
		note "gpubench-pool: rc $? (pool.txt, kernels-only rows)"
		cut -c1-250 "$W/pool.txt"
	fi
fi
