#!/usr/bin/env bash
# eval/vllm/headline.sh: the headline in real vLLM 0.26 on the GPU machine —
# docqa served through no connector, vLLM's own offloading (CPU tier; CPU tier
# + file tier), tutti (GPU and CPU paths) and LMCache (local disk, GDS), Poisson
# arrivals at several rates, TTFT from vLLM's request metrics, the highest rate
# meeting the SLO (eval/vllm/headline.py's doc says how each number is taken).
#
# Stage here first: `bash eval/vllm/stage.sh` (vLLM, .vllm-stage/piece-NN) and
# `make gpu-bins` (bin/libtutti.so); optionally `bash eval/vllm/stage.sh
# --lmcache` (.vllm-stage/lmcache.tar.xz, ~7 MiB), and `make gpu-pack`
# (bin/gpu.tar.xz: libtutti.so and the CLI whose `tutti emudev` paces the
# loops). Then device calls, back to back on one warm machine (what they
# leave in /tmp lives only while it is held; eval/vllm/run.sh's header):
#
#   1. carry [.vllm-stage/piece-0N, .vllm-stage/MANIFEST], once per piece
#        bash eval/vllm/run.sh recv                     (~1 min each, the first with the machine's
#                                                        start; tutti's kernels build in the background)
#   2. carry [.vllm-stage/MANIFEST, bin/gpu.tar.xz]
#        tar xJf bin/gpu.tar.xz -C bin && bash eval/vllm/headline.sh run
#                                                       (~8.5 min: it unpacks vLLM, ~40 s, then
#                                                        runs within BUDGET_S=540 of the call's 600)
#   With LMCache: call 1 also carries .vllm-stage/lmcache.tar.xz and runs
#        `bash eval/vllm/run.sh recv && bash eval/vllm/headline.sh lmcache`, which starts
#        building LMCache's CUDA ops in the background (nvcc on every core, a few minutes);
#        `run` waits for that build before timing anything (a compile beside a run would
#        skew it), checks the compiled ops load, and runs the LMCache backends last (if
#        the ops did not build or load, they are not run: never on pure-PyTorch ops).
#
# tutti-gpu-async and tutti-gpu-auto are tutti's GPU path with async_loads true
# and "auto" (docs/vllm.md: loads beside the engine's steps); tutti-gpu-save is
# its GPU path as kv_role kv_producer (saves, never loads: what the saves alone
# cost the engine); tutti-gpu-hostwait has save_wait "host" (the host waits for
# the engine's stream at the save point: the control of the default "device");
# in no default set.
# Default (one call, ~8.5 min): BACKENDS="none tutti-gpu offload-cpu", STORAGES=loops,
# RATES=3,6,12 req/s, ROUNDS=2, REQUESTS=64 (the first 64 of the replay's docqa plan:
# 12 documents of 4K-8K tokens, 17 questions each; the 64 touch all 12), each backend
# one vLLM process (~45 s start, eager, dummy weights) + 2 x ~40 s of runs; `none`
# first with an unloaded pass of UNLOADED=24 requests that fixes the SLO (2 x its p90).
# FULL=1: all seven backends on loops and the real disk, RATES=2,3,4,6,8,12,16,
# REQUESTS=102 (the first half of the plan; `tutti replay --requests 102` gives the
# harness's figure for the same requests): about 6 min per backend and storage
# (2 x ~150 s of runs at most: a round stops at its first missed rate), 13 pairs,
# ~75 min over ~13 calls: far beyond one session's 30 min of device time. Run it
# as groups over calls (BACKENDS="..." STORAGES=... per call, SLO_MS from the first
# call's none result, printed in its summary.txt), then here `python3
# eval/vllm/headline.py report --out-dir DIR <every call's headline-*.json>`.
#
# Sizes, stated in every result: vLLM's GPU KV cache GPU_BLOCKS=2048 blocks of 16
# tokens (32,768 tokens = 4 GiB of Llama-3-8B KV; the 12 documents hold 69,749
# tokens, 8.5 GiB, so about 5 of them fit, less what running requests hold),
# 8,192 tokens a step; offload-cpu's CPU tier CPU_GIB=16 (pinned host
# memory: one run's documents and questions, ~10 GiB, all fit: the DRAM tier);
# offload-fs: a 2 GiB CPU tier in front of its file tier; tutti CAPACITY_GIB=24,
# LMCache's disk the same. Storage: loops = NLOOPS=8 RAM-backed loop devices of
# LOOP_GIB=4 (emulated storage, ext4, O_DIRECT loops; run.sh's), tutti striped
# over all 8; vLLM's file tier and LMCache take one path per GPU, so on loops
# they get one ext4 over a dm-stripe of 8 more such loops (as mdadm would give
# a one-path system 8 drives; the first loop alone where dmsetup is missing or
# /dev/shm lacks room, said in their row, and then neither offload-fs nor
# lmcache-gds runs); vLLM's file tier and LMCache's GDS backend never evict,
# so their files of earlier runs (other salts: never hit again) are deleted
# between runs (headline.NO_EVICTION); disk = /var/tmp on the machine's disk.
# /dev/shm holds the loops (32 GiB), with the stripe 32 more, and vLLM's CPU
# tier (CPU_GIB, pinned): a backend that would not fit is not run, said why.
#
# The harness against the real systems (issue 48): `tutti replay` re-implements
# these designs (recompute = none, dram = offload-cpu, vllm-fs = offload-fs, the
# rest by name); HARNESS=1 runs it after the backends, in the same call, on the
# same storage (its own directories), plan, REQUESTS and RATES (`tutti replay
# --at-rates`: each design's timeline at those rates, every request's TTFT;
# --compute gpu --gpu-prefill-every 8, llama3-8b, 256-token blocks, no GPU prefix
# cache: every hit is restored), then eval/vllm/harness_check.py holds its TTFT
# p50/p90/p99 per rate and its rate at SLO, under this call's SLO, against the real
# rows: harness-<storage>.json, harness-check-<storage>.json/.md, the table in
# summary.txt; a figure off by more than 15% is flagged (to be corrected in the
# harness or explained in its label). It keeps HARNESS_S=150 s per storage back
# from the backends (the replay itself: ~1 min for the default three designs and
# 64 requests, ~2.5 min for all seven and 102, estimated from device-run.sh's
# rates). `headline.sh harness` runs it alone (carry bin/gpu.tar.xz, unpack it;
# the same BACKENDS, STORAGES, REQUESTS, RATES), then here: `python3
# eval/vllm/harness_check.py check --replay harness-loops.json [--slo-ms X]
# headline-*.json` over one storage's results and none's.
#
# Budget: BUDGET_S (540) for the whole call; a backend is not started with under
# 100 s left, and each gets --deadline-s so it stops starting runs in time.
# Results under $OUT: headline-<backend>-<storage>.json (every request), the
# engine logs, headline.json and headline.md (report), summary.txt; with
# lmcache-gds, cufile.txt (which cuFile mode ran: LMCache's own log line, and
# gdscheck -p where the machine has it).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
. "$ROOT/eval/vllm/run.sh" # install_site, kernels_wait, loops_up, log; $SITE, $OUT, $NLOOPS, $LOOP_GIB
FULL=${FULL:-0}
if [ "$FULL" = 1 ]; then
	BACKENDS=${BACKENDS:-none tutti-gpu tutti-cpu offload-cpu offload-fs lmcache-disk lmcache-gds}
	STORAGES=${STORAGES:-loops disk}
	RATES=${RATES:-2,3,4,6,8,12,16}
	REQUESTS=${REQUESTS:-102}
else
	BACKENDS=${BACKENDS:-none tutti-gpu offload-cpu}
	STORAGES=${STORAGES:-loops}
	RATES=${RATES:-3,6,12}
	REQUESTS=${REQUESTS:-64}
fi
ROUNDS=${ROUNDS:-2}
UNLOADED=${UNLOADED:-24}
GPU_BLOCKS=${GPU_BLOCKS:-2048}
CPU_GIB=${CPU_GIB:-16}
FS_CPU_GIB=${FS_CPU_GIB:-2}
SLO_MS=${SLO_MS:-0}
HEADLINE_ARGS=${HEADLINE_ARGS:-}
HARNESS=${HARNESS:-0}
HARNESS_S=${HARNESS_S:-150} # kept back from the backends per storage with HARNESS=1
HARNESS_ARGS=${HARNESS_ARGS:-}
TUTTI_CLI=$ROOT/bin/gpu/tutti
TESTKIT_LIB=${TESTKIT_LIB:-$ROOT/kernels/build/libtutti_testkit.so} # the replay's GPU prefill (--compute gpu)
RESERVE_S=0
DROP_CACHES=${DROP_CACHES:-1}
LMC_STAGE=/tmp/lmcache-stage
LMC_SITE=/tmp/lmcache-site
LMC_SRC=$LMC_STAGE/lmcache-0.5.3
START_MIN_S=100 # a backend needs its engine start and at least one run

lmcache_build_bg() { # unpack .vllm-stage/lmcache.tar.xz, build LMCache's ops in the background
	[ -f "$LMC_SITE/.built" ] && return 0
	[ -f "$ROOT/.vllm-stage/lmcache.tar.xz" ] || { log "no .vllm-stage/lmcache.tar.xz (stage.sh --lmcache here, carry it)"; return 1; }
	lmcache_building && return 0
	rm -rf "$LMC_STAGE" "$LMC_SITE" /tmp/lmcache-build && mkdir -p "$LMC_STAGE" "$LMC_SITE" /tmp/lmcache-build
	xz -dc "$ROOT/.vllm-stage/lmcache.tar.xz" | tar -x -C "$LMC_STAGE" || { log "lmcache: unpacking failed"; return 1; }
	# Wheels are zips: unpacked onto their own paths (no pip needed there). The
	# build tools go to /tmp/lmcache-build, never onto vLLM's path.
	cat >/tmp/lmcache-build.sh <<-EOF
		set -x
		python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' /tmp/lmcache-build $LMC_STAGE/wheels/build/*.whl
		python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' $LMC_SITE $LMC_STAGE/wheels/run/*.whl
		nb=\$(echo /tmp/lmcache-build/ninja-*.data/scripts) # the wheel's binary (zip extraction drops its mode)
		chmod +x \$nb/ninja
		cd $LMC_SRC && PYTHONPATH=/tmp/lmcache-build PATH=\$nb:\$PATH \
			BUILD_WITH_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=\$(nproc) SETUPTOOLS_SCM_PRETEND_VERSION=0.5.3 \
			python3 setup.py build_ext --inplace || exit 1
		# The check that matters: LMCache binds the compiled ops beside this torch (else it runs
		# pure-PyTorch ops; its lmcache.c_ops is a shim over them: eval/vllm/lmcache_ops.py).
		PYTHONPATH=$LMC_SRC:$LMC_SITE python3 $ROOT/eval/vllm/lmcache_ops.py || exit 1
		touch $LMC_SITE/.built
	EOF
	setsid nohup bash /tmp/lmcache-build.sh >/tmp/lmcache-build.log 2>&1 </dev/null &
	echo $! >/tmp/lmcache-build.pid
	log "lmcache: building 0.5.3's CUDA ops against $(python3 -c 'import torch; print(torch.__version__)') in the background (/tmp/lmcache-build.log)"
}

lmcache_building() { [ -f /tmp/lmcache-build.pid ] && kill -0 "$(cat /tmp/lmcache-build.pid)" 2>/dev/null; }

lmcache_ready() { # waits up to $1 s for the build; true when its ops loaded
	local i
	for ((i = 0; i < ${1:-0}; i++)); do
		[ -f "$LMC_SITE/.built" ] && break
		lmcache_building || break
		sleep 1
	done
	[ -f "$LMC_SITE/.built" ] && return 0
	log "lmcache: not ready (build $(lmcache_building && echo 'still running' || echo 'failed or not started')); tail of /tmp/lmcache-build.log:"
	tail -5 /tmp/lmcache-build.log 2>/dev/null | tee -a "$OUT/summary.txt"
	return 1
}

storage_dirs() { # STORAGE -> JSON list of directories (nothing else on stdout: callers capture it)
	case $1 in
	loops)
		loops_up >/dev/null || return 1
		# run.sh's stores (/mnt/vl-loopN/tutti) stay on the kept loops after its calls, each
		# with CAPACITY_GIB preallocated: beside them tutti's store here would not fit (ENOSPC).
		# No run.sh runs beside this call; it empties them itself before each case.
		dirs_clear "$LOOPDIRS"
		echo "[${LOOPDIRS//\/tutti/\/headline}]"
		;;
	disk) rm -rf /var/tmp/tutti-vllm && echo '["/var/tmp/headline"]' ;; # run.sh's disk store, likewise
	*) return 1 ;;
	esac
}

shm_avail_gib() { df -B1G --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' '; }

shm_need_gib() { # BACKEND -> GiB it maps in /dev/shm (vLLM's CPU tier: /dev/shm/vllm_offload_<engine>.mmap, pinned)
	case $1 in
	offload-cpu) echo $((CPU_GIB + 1)) ;;
	offload-fs) echo $((FS_CPU_GIB + 1)) ;;
	*) echo 0 ;;
	esac
}

ONE_PATH_LABEL=""
STRIPE_WHY=""
stripe_down() { # the stripe's file system and device, on loops that no longer serve
	umount -l /mnt/vl-stripe
	dmsetup remove vl-stripe
}

stripe_up() { # a dm-stripe over NLOOPS more RAM-backed loops, ext4: the one path of a one-path backend
	local d devs=() sectors table
	ONE_PATH_LABEL="one dm-stripe (128 KiB chunks) over $NLOOPS more such loop devices, ext4"
	if [ -f /tmp/vl-stripe ] && loops_kept sloop stripe_down; then
		return 0
	fi
	rm -f /tmp/vl-stripe
	command -v dmsetup >/dev/null || { STRIPE_WHY="no dmsetup for a stripe"; log "stripe: $STRIPE_WHY; one-path backends get the first loop device alone"; return 1; }
	# Its backing files are written in full (emu_backing) beside the first loops' and the CPU tier's.
	local need=$((NLOOPS * LOOP_GIB + FS_CPU_GIB + 2)) have
	have=$(shm_avail_gib)
	if [ "${have:-0}" -lt "$need" ]; then
		STRIPE_WHY="/dev/shm has ${have:-?} GiB free, a stripe needs $need"
		log "stripe: $STRIPE_WHY; one-path backends get the first loop device alone"
		return 1
	fi
	STRIPE_WHY="the stripe failed (summary.txt)"
	loops_make sloop || return 1
	mapfile -t devs </tmp/vl-sloop.devs
	sectors=$(($(blockdev --getsz "${devs[0]}") / 256 * 256))
	table="0 $((sectors * NLOOPS)) striped $NLOOPS 256"
	for d in "${devs[@]}"; do table+=" $d 0"; done
	echo "$table" | dmsetup create vl-stripe || { log "stripe: dmsetup create failed"; return 1; }
	mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 /dev/mapper/vl-stripe && mkdir -p /mnt/vl-stripe &&
		mount /dev/mapper/vl-stripe /mnt/vl-stripe || { log "stripe: ext4 on it failed"; return 1; }
	echo /mnt/vl-stripe >/tmp/vl-stripe
	log "stripe: $NLOOPS more RAM-backed loop devices of $LOOP_GIB GiB as one dm-stripe, ext4 ($EMU_LIMITER limit): the one path of vLLM's file tier and LMCache"
}

one_path() { # BACKEND: true for a backend that takes one directory per GPU
	case $1 in offload-fs | lmcache-*) return 0 ;; esac
	return 1
}

storage_label() {
	case $1 in
	loops) echo "$NLOOPS RAM-backed loop devices of $LOOP_GIB GiB (emulated storage, $EMU_LIMITER limit at $EMU_RATE_BPS B/s each, ext4)" ;;
	disk) echo "the machine's disk (/var/tmp, ext4)" ;;
	esac
}

run_backend() { # BACKEND STORAGE
	local b=$1 st=$2 dirs left out extra=() pp="$SITE:$ROOT/python" rc pid shm_before shm_need shm_have f
	left=$((BUDGET_S - RESERVE_S - (SECONDS - T0)))
	if [ "$left" -lt "$START_MIN_S" ]; then
		log "$b on $st: not run, ${left} s of the call's $BUDGET_S s left"
		return 1
	fi
	dirs=$(storage_dirs "$st") || { log "$b on $st: storage failed"; return 1; }
	ONE_PATH_LABEL=""
	if one_path "$b" && [ "$st" = loops ]; then
		# A one-path system given 8 devices gets them as one striped device (what
		# mdadm/dm would make), with their bandwidth and capacity; else loop 0 alone.
		if stripe_up >/dev/null; then
			dirs='["/mnt/vl-stripe/headline"]'
		else
			ONE_PATH_LABEL="the first loop device alone ($LOOP_GIB GiB; $STRIPE_WHY)"
			extra+=(--capacity-gib $((LOOP_GIB - 1))) # what fits one loop device
			if [ "$b" = offload-fs ] || [ "$b" = lmcache-gds ]; then # never evict: one run's ~10 GiB would not fit
				log "$b on $st: not run, $ONE_PATH_LABEL: it never evicts and a run writes ~10 GiB"
				return 1
			fi
		fi
	fi
	[ -n "$ONE_PATH_LABEL" ] && extra+=(--one-path-label "$ONE_PATH_LABEL")
	out=$OUT/headline-$b-$st.json
	case $b in
	none) extra+=(--unloaded "$UNLOADED") ;;
	lmcache-*)
		lmcache_ready $((left - START_MIN_S)) || { log "$b on $st: not run (LMCache not built)"; return 1; }
		pp="$LMC_SRC:$LMC_SITE:$pp"
		;;
	esac
	[ "$b" != none ] && [ "$SLO_MS" != 0 ] && extra+=(--slo-ms "$SLO_MS")
	extra+=(--fs-cpu-gib "$FS_CPU_GIB")
	# A pinned CPU tier in a full /dev/shm dies of SIGBUS mid-start: say so instead.
	shm_need=$(shm_need_gib "$b")
	shm_have=$(shm_avail_gib)
	if [ "$shm_need" -gt 0 ] && [ "${shm_have:-0}" -lt "$shm_need" ]; then
		log "$b on $st: not run, /dev/shm has ${shm_have:-?} GiB free, its CPU tier needs $shm_need (loops and stripe live there too)"
		return 1
	fi
	shm_before=$(ls /dev/shm/vllm_offload_*.mmap 2>/dev/null)
	dirs_clear "$dirs" "$b"
	if [ "$DROP_CACHES" = 1 ]; then # every backend starts with a cold page cache, or its row says not
		sync
		{ echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null || log "$b on $st: page cache not dropped (/proc/sys/vm/drop_caches refused)"
	fi
	log "$b on $st: starting, ${left} s left"
	# Its own process group (setsid): vLLM's engine core, a child, goes with it whatever way it ends.
	PYTHONPATH=$pp TUTTI_LIB="$ROOT/bin/libtutti.so" TUTTI_KERNELS_LIB="$ROOT/kernels/build/libtutti_kernels.so" \
		PYTHONUNBUFFERED=1 setsid timeout $((left - 5)) python3 eval/vllm/headline.py run --backend "$b" --out "$out" \
		--storage "$(storage_label "$st")" --dirs "$dirs" --rates "$RATES" --rounds "$ROUNDS" --requests "$REQUESTS" \
		--gpu-blocks "$GPU_BLOCKS" --cpu-gib "$CPU_GIB" --capacity-gib "$CAPACITY_GIB" --work-dir /tmp/headline \
		--deadline-s $((left - 15)) "${extra[@]}" $HEADLINE_ARGS >"$OUT/headline-$b-$st.log" 2>&1 &
	pid=$!
	wait $pid
	rc=$?
	kill -- -$pid 2>/dev/null
	# vLLM unlinks its CPU tier's file only on a clean shutdown: one killed here would keep CPU_GIB of /dev/shm.
	sleep 1
	for f in /dev/shm/vllm_offload_*.mmap; do
		[ -e "$f" ] && ! grep -qxF "$f" <<<"$shm_before" && rm -f "$f" && log "$b on $st: removed its CPU tier's $f"
	done
	grep -E '^\[' "$OUT/headline-$b-$st.log" | tee -a "$OUT/summary.txt"
	[ $rc = 0 ] || { log "$b on $st: rc $rc; last lines:"; tail -15 "$OUT/headline-$b-$st.log" | tee -a "$OUT/summary.txt"; }
	if [ "$b" = none ] && [ "$SLO_MS" = 0 ] && [ -f "$out" ]; then
		SLO_MS=$(python3 -c "import json,sys; u=json.load(open(sys.argv[1]))['unloaded']; print(round(u['slo_s']*1e3, 3))" "$out" 2>/dev/null || echo 0)
		log "SLO from none's unloaded pass: p90 TTFT <= $SLO_MS ms (give SLO_MS=$SLO_MS to later calls)"
	fi
	if [ "$b" = lmcache-gds ]; then
		{ echo "LMCache's own words:"; grep -hE "GDS backend|GDS disabled|POSIX fallback|fstype|cufile|cuFile" "$OUT/headline-$b-$st.log" | head -20
			for g in /usr/local/cuda/gds/tools/gdscheck /usr/local/cuda-*/gds/tools/gdscheck; do
				[ -x "$g" ] && { echo "$g -p:"; "$g" -p 2>&1 | head -40; break; }
			done; } >>"$OUT/cufile.txt"
		log "cuFile mode: $(grep -m1 -oE 'Using GDS backend[^(]*|GDS disabled, using POSIX fallback' "$OUT/headline-$b-$st.log" || echo 'not stated in the log'); see cufile.txt"
	fi
	dirs_clear "$dirs" "$b"
	return $rc
}

harness_run() { # STORAGE: the replay's designs on the same plan, requests, rates and storage, then harness_check
	local st=$1 left dirs args rc t=$SECONDS reals=() f slo=()
	left=$((BUDGET_S - (SECONDS - T0) - 20))
	[ -x "$TUTTI_CLI" ] || { log "harness on $st: not run, no $TUTTI_CLI (make gpu-pack here; carry and unpack bin/gpu.tar.xz)"; return 1; }
	[ "$left" -ge 60 ] || { log "harness on $st: not run, ${left} s left"; return 1; }
	[ -f "$TESTKIT_LIB" ] || { log "harness on $st: not run, no $TESTKIT_LIB (its GPU prefill; run.sh's kernels_bg builds it: /tmp/kernels-build.log)"; return 1; }
	args=$(python3 eval/vllm/harness_check.py replay-args --requests "$REQUESTS" --rates "$RATES" --backends "$BACKENDS") ||
		{ log "harness on $st: replay-args failed"; return 1; }
	dirs=$(storage_dirs "$st") || { log "harness on $st: storage failed"; return 1; }
	dirs=$(echo "$dirs" | tr -d '[]"' | sed 's|/headline|/harness|g')
	dirs_clear "$dirs"
	for f in ${dirs//,/ }; do mkdir -p "$f"; done
	log "harness on $st: $TUTTI_CLI replay $args (timeout ${left} s)"
	# shellcheck disable=SC2086 # args and HARNESS_ARGS are word lists
	TUTTI_KERNELS_LIB="$ROOT/kernels/build/libtutti_kernels.so" TUTTI_TESTKIT_LIB="$TESTKIT_LIB" timeout -s INT -k 20 "$left" "$TUTTI_CLI" replay $args \
		--model llama3-8b --compute gpu --gpu-prefill-every 8 --no-ceiling --json --dir "$dirs" \
		--storage-label "$(storage_label "$st")" --out "$OUT/harness-$st" $HARNESS_ARGS \
		>"$OUT/harness-$st.json" 2>"$OUT/harness-$st.log"
	rc=$?
	dirs_clear "$dirs"
	log "harness on $st: exit $rc in $((SECONDS - t)) s"
	[ $rc = 0 ] || tail -5 "$OUT/harness-$st.log" | tee -a "$OUT/summary.txt"
	[ -s "$OUT/harness-$st.json" ] || return 1
	for f in "$OUT"/headline-*-"$st".json "$OUT"/headline-none-*.json; do
		[ -f "$f" ] && [[ " ${reals[*]} " != *" $f "* ]] && reals+=("$f")
	done
	if [ ${#reals[@]} = 0 ]; then # another call's results: the check runs on the dev machine
		log "harness on $st: no headline results in this call; check there: python3 eval/vllm/harness_check.py check --replay harness-$st.json headline-*.json"
		return $rc
	fi
	[ "$SLO_MS" != 0 ] && slo=(--slo-ms "$SLO_MS")
	python3 eval/vllm/harness_check.py check --replay "$OUT/harness-$st.json" "${slo[@]}" --json "$OUT/harness-check-$st.json" \
		--md "$OUT/harness-check-$st.md" "${reals[@]}" >>"$OUT/summary.txt" 2>&1 || { log "harness on $st: check failed (summary.txt)"; return 1; }
	return $rc
}

# Sourced (python/tests/test_headline.py): the functions above, nothing run.
[[ "${BASH_SOURCE[0]}" != "$0" ]] && return 0

case ${1:-} in
lmcache)
	lmcache_build_bg
	;;
run)
	T0=$SECONDS
	install_site || { log "vLLM is not staged: see eval/vllm/run.sh's header"; exit 1; }
	[ -f bin/libtutti.so ] || { log "no bin/libtutti.so: make gpu-bins here, carry bin/libtutti.so"; exit 1; }
	kernels_wait || exit 1
	if lmcache_building; then # a compile on every core beside a run would skew it
		log "lmcache: its build is still running; waiting for it (up to 300 s) before timing anything"
		for ((i = 0; i < 300; i++)); do lmcache_building || break; sleep 1; done
	fi
	log "headline: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader), $(python3 -c 'import torch; print("torch", torch.__version__)'); backends: $BACKENDS; storages: $STORAGES; rates $RATES; $ROUNDS rounds; requests $REQUESTS; /dev/shm $(shm_avail_gib) GiB free, RAM $(free -g | awk '/^Mem:/ {print $7}') GiB available"
	rc=0
	none_done=0
	[ "$HARNESS" = 1 ] && RESERVE_S=$((HARNESS_S * $(wc -w <<<"$STORAGES")))
	for st in $STORAGES; do
		for b in $BACKENDS; do
			if [ "$b" = none ]; then
				[ $none_done = 1 ] && continue # it touches no storage: once per call
				none_done=1
			fi
			run_backend "$b" "$st" || rc=1
		done
	done
	if [ "$HARNESS" = 1 ]; then
		for st in $STORAGES; do harness_run "$st" || rc=1; done
	fi
	slo=() # the report takes the SLO from none's unloaded pass when this call ran it
	[ $none_done = 0 ] && [ "$SLO_MS" != 0 ] && slo=(--slo-ms "$SLO_MS")
	python3 eval/vllm/headline.py report --out-dir "$OUT" "${slo[@]}" "$OUT"/headline-*-*.json \
		>>"$OUT/summary.txt" 2>&1 || rc=1
	log "headline: $((SECONDS - T0)) s"
	exit $rc
	;;
harness)
	T0=$SECONDS
	kernels_wait || exit 1
	rc=0
	for st in $STORAGES; do harness_run "$st" || rc=1; done
	exit $rc
	;;
*)
	echo "usage: $0 lmcache | run | harness   (knobs and device calls: this script's header)" >&2
	exit 2
	;;
esac
