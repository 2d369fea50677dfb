#!/usr/bin/env bash
# eval/vllm/run.sh: tutti inside real vLLM 0.26.0 on the GPU machine.
#
# Stage first, on the dev machine: `bash eval/vllm/stage.sh` (vLLM and what it
# imports, packed into .vllm-stage/piece-NN, each under 48 MiB) and
# `make gpu-bins` (bin/libtutti.so). A device call carries at most 64 MiB and
# ignored files stay on the GPU machine only while it is warm (30 s idle), so
# the pieces go over back-to-back calls, then the checks run:
#
#   run carry=[.vllm-stage/piece-00, .vllm-stage/MANIFEST]  'bash eval/vllm/run.sh recv'
#   ... one call per piece (stage.sh prints them: 3 with the hybrid models' packages)
#   run carry=[.vllm-stage/MANIFEST, bin/libtutti.so]       'bash eval/vllm/run.sh check CASE...'
#
# With `make gpu-pack`, carry bin/gpu.tar.xz instead of bin/libtutti.so and run
# `tar xJf bin/gpu.tar.xz -C bin && bash eval/vllm/run.sh ...`: the loops are
# then paced by `tutti emudev` (scripts/emuloop.sh), else limited by io.max.
#
# recv checks each piece it has against MANIFEST (sha256) and says what is
# still missing; the first recv also starts building the CUDA kernels in the
# background. Once all pieces are there, vLLM is unpacked into /tmp/vllm-site
# (PYTHONPATH) and the checks run, one vLLM process per phase (eval/vllm/drive.py):
#
#   CASE = MODEL:STORAGE:PATH, e.g. llama3-8b:loops:gpu, llama3-8b:disk:cpu,
#          deepseek-v2-lite:loops:gpu; hybrid models (vLLM's hybrid KV cache
#          manager, tutti.groups): gemma3-1b:loops:gpu (sliding window),
#          qwen3-next-tiny:loops:gpu (gated delta net, Mamba "align" state)
#     MODEL    a directory under eval/vllm/models (dummy weights from its config.json)
#     STORAGE  loops: NLOOPS RAM-backed loop devices (files in /dev/shm, O_DIRECT,
#              ext4 each; emulated storage), disk: /var/tmp on the machine's disk
#     PATH     tutti's GPU path or CPU path
#   For each model, one baseline process (no connector) gives the reference
#   outputs; for each case a `first` process (a new store) and, after it exits,
#   a `second` one, without PYTHONHASHSEED or any other variable of tutti's,
#   that must hit what the first saved. eval/vllm/compare.py checks every
#   case: no request failed, the connector's check mode found every restored
#   block equal to the KV vLLM computed for it, greedy outputs equal the
#   baseline's (where they part: the first position and both top logits),
#   the second process restored from tutti.
#
# Time on the GPU machine: the recv calls about a minute each with the
# machine's start; a vLLM process under a minute (import, engine start with dummy
# weights and no graph capture, the waves), so a model's baseline and first case
# about 2 minutes and each further case about 1; every model, storage and path
# about 12 minutes, over two or three check calls (each stops starting cases once
# BUDGET_S, default 540, is spent). Results: $OUT/vllm-<case>.json,
# $OUT/vllm.log, $OUT/summary.txt.
#
# TTFT of restored prefixes against recompute and vLLM's OffloadingConnector (CPU
# tier), one process each on the same model (drive.py's ttft phase; a table from
# eval/vllm/ttft_table.py, $OUT/ttft-<case>.json):
#
#   run carry=[.vllm-stage/MANIFEST, bin/libtutti.so]       'bash eval/vllm/run.sh ttft CASE...'
#
# With VLLM_BATCH_INVARIANT=1 in the command's environment every phase runs vLLM's
# batch-invariant kernels, and compare.py and ttft_table.py then require greedy
# outputs and log-probs equal to recompute's bit for bit (attention-only models:
# vLLM 0.26's Mamba backends refuse the mode), e.g.
#
#   run carry=[...]     'VLLM_BATCH_INVARIANT=1 bash eval/vllm/run.sh ttft gemma3-1b:loops:gpu'
#
# Hybrid models in one command (the checks, then the TTFTs, of gemma3-1b:loops:gpu and
# qwen3-next-tiny:loops:gpu, or the cases named; about 15 minutes, so call it again
# when BUDGET_S runs out: what was done on this warm machine is skipped):
#
#   run carry=[.vllm-stage/MANIFEST, bin/libtutti.so]       'bash eval/vllm/run.sh hybrid'
#
# A model's own drive.py flags: eval/vllm/models/MODEL/drive.args (every phase; DRIVE_ARGS come
# after them and win). gemma3-1b's 7 KV cache groups (6 sliding-window, 1 full) share one pool:
# vLLM 0.26's scheduler admits a 6k-token prompt only with about 1400 blocks of 16 tokens or
# more (below, a wave never finishes: eval/vllm/drive_fit.py checks every hybrid model's
# drive.args on the CPU, in CI), so it asks for 2048. The TTFT phase's OffloadingConnector
# run failing on a model is logged and costs its row of the table only.
#
# Knobs (environment): NLOOPS (8), LOOP_GIB (4), CAPACITY_GIB (24, per store),
# BUDGET_S (540), DRIVE_ARGS (extra flags for drive.py, every phase; a load that preempts:
# "--gpu-blocks 400 --max-model-len 4608 --doc-tokens 4096 --reserve-full-isl off"), CHECK (1: the
# connector's check mode on), CONTROL (1: check also runs the first phase through vLLM's OffloadingConnector,
# once per model, and compare.py reports tutti's outputs against it: eval/vllm/compare.py's doc),
# TUTTI_EXTRA (more kv_connector_extra_config keys, JSON members), TTFT_OFFLOADING (0: ttft runs no
# OffloadingConnector row), TTFT_CONTROL (1: ttft also runs no connector without the reset, so the questions hit
# vLLM's own cache, and holds tutti's answers to it bit for bit; give every phase a GPU cache that keeps every
# document, e.g. DRIVE_ARGS="--gpu-blocks 256" for qwen3-next-tiny). DRIVE_ARGS=--state-probe makes ttft a diagnostic of where tutti's restored KV
# parts from what vLLM computed (eval/vllm/state_probe.py; its timings are not TTFTs).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
ST=$ROOT/.vllm-stage
SITE=/tmp/vllm-site
RES=/tmp/vllm-results
# A baseline kept on a warm machine serves only runs of its own kernels.
BASE_TAG=
[ "${VLLM_BATCH_INVARIANT:-0}" = 1 ] && BASE_TAG=-invariant
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT" "$RES"
NLOOPS=${NLOOPS:-8}
LOOP_GIB=${LOOP_GIB:-4}
CAPACITY_GIB=${CAPACITY_GIB:-24}
BUDGET_S=${BUDGET_S:-540}
DRIVE_ARGS=${DRIVE_ARGS:-}
CHECK=${CHECK:-1}
CONTROL=${CONTROL:-0}
TTFT_OFFLOADING=${TTFT_OFFLOADING:-1}
TTFT_CONTROL=${TTFT_CONTROL:-0}
# The loops' limiter: emudev where the call carries bin/gpu/tutti (bin/gpu.tar.xz,
# unpacked) and /dev/fuse exists, else io.max; every storage label names it.
# The loops and their emudev (its own session: it outlives the call) stay
# while the machine is warm.
EMU_LIMITER=${EMU_LIMITER:-$([ -c /dev/fuse ] && [ -x "$ROOT/bin/gpu/tutti" ] && echo emudev || echo iomax)}
. "$ROOT/scripts/emuloop.sh"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

pieces_ok() { # prints the missing pieces; true when none is
	local name bytes sum missing=0
	while read -r name bytes sum; do
		case $name in piece-*) ;; *) continue ;; esac
		if [ ! -f "$ST/$name" ] || [ "$(sha256sum "$ST/$name" | cut -d' ' -f1)" != "$sum" ]; then
			echo "missing or damaged: $name"
			missing=1
		fi
	done <"$ST/MANIFEST"
	return $missing
}

install_site() {
	[ -f "$SITE/.installed" ] && return 0
	pieces_ok || return 1
	local t=$SECONDS
	rm -rf "$SITE" && mkdir -p "$SITE"
	cat "$ST"/piece-* | xz -d | tar -x -C "$SITE" || { log "unpacking vLLM failed"; return 1; }
	touch "$SITE/.installed"
	log "vLLM unpacked into $SITE in $((SECONDS - t)) s ($(du -sm "$SITE" | cut -f1) MiB)"
}

kernels_bg() { # the CUDA kernels, built in the background while pieces arrive: the connector's
	# library and the testkit (the harness's GPU prefill: headline.sh)
	[ -f kernels/build/libtutti_kernels.so ] && [ -f kernels/build/libtutti_testkit.so ] && return 0
	pgrep -f "make -C kernels" >/dev/null && return 0
	setsid nohup make -C kernels -j "$(nproc)" NVCC=nvcc build/libtutti_kernels.so build/libtutti_testkit.so \
		>/tmp/kernels-build.log 2>&1 </dev/null &
	log "kernels: building in the background (/tmp/kernels-build.log)"
}

kernels_wait() { # the whole build (nvcc on every core beside a timed run would skew it)
	local i
	for ((i = 0; i < 300; i++)); do
		pgrep -f "make -C kernels" >/dev/null || break
		sleep 1
	done
	[ -f kernels/build/libtutti_kernels.so ] || make -C kernels NVCC=nvcc build/libtutti_kernels.so >>/tmp/kernels-build.log 2>&1
	[ -f kernels/build/libtutti_kernels.so ] || { log "kernels: build failed"; tail -20 /tmp/kernels-build.log; return 1; }
}

LOOPDIRS=""
# dirs_clear DIRS [SUB]: removes every directory of DIRS (a JSON list of
# paths, or its quoted comma-separated members), or SUB under each.
dirs_clear() {
	local d
	for d in $(echo "$1" | tr -d '[]"' | tr , ' '); do rm -rf "${d:?}${2:+/$2}"; done
}

# loops_make TAG: NLOOPS loop devices with direct I/O over RAM-backed files
# /dev/shm/vl-TAG<i>, paced by EMU_LIMITER (emudev: its own, EMU_DEV
# /tmp/vl-emudev-TAG), listed in /tmp/vl-TAG.devs, limited, and kept while
# the machine is warm (loops_kept).
loops_make() {
	local tag=$1 i files=() EMU_DEV=/tmp/vl-emudev-$1
	for ((i = 0; i < NLOOPS; i++)); do files+=("/dev/shm/vl-$tag$i"); done
	emu_backing_many "${LOOP_GIB}G" "${files[@]}" || return 1
	mapfile -t files < <(EMU_TUTTI=$ROOT/bin/gpu/tutti emu_loops "${files[@]}")
	printf '%s\n' "${files[@]}" >"/tmp/vl-$tag.devs"
	[ ${#files[@]} = "$NLOOPS" ] || { log "$tag: loop devices ($EMU_LIMITER): ${#files[@]} of $NLOOPS"; return 1; }
	log "$(emu_limit $(cat "/tmp/vl-$tag.devs"))"
}

# loops_kept TAG RELEASE: true while the loops loops_make TAG made still
# serve (their limit set again: io.max holds the cgroup this call's shell
# joins). When their emudev is gone, RELEASE (a function: what is built on
# them comes down) runs, the loop devices are detached and it is false, as
# when none were made.
loops_kept() {
	local tag=$1 release=$2 d EMU_DEV=/tmp/vl-emudev-$1
	[ -f "/tmp/vl-$tag.devs" ] || return 1
	if [ "$EMU_LIMITER" = emudev ] && ! emu_devices_alive; then
		log "$tag: the kept loops' emudev is gone: they are made again"
		"$release" 2>/dev/null
		for d in $(cat "/tmp/vl-$tag.devs"); do losetup -d "$d" 2>/dev/null; done
		rm -f "/tmp/vl-$tag.devs"
		return 1
	fi
	log "$(emu_limit $(cat "/tmp/vl-$tag.devs"))"
}

loops_unmount() { # the file systems on the kept loops, lazily
	local i
	for ((i = 0; i < NLOOPS; i++)); do umount -l "/mnt/vl-loop$i"; done
}

loops_up() { # NLOOPS loop devices with ext4, mounted under /mnt/vl-loopN (kept while warm)
	local i d m dirs=()
	if [ -f /tmp/vl-loops ] && loops_kept loop loops_unmount; then
		LOOPDIRS=$(cat /tmp/vl-loops)
		return 0
	fi
	rm -f /tmp/vl-loops
	loops_make loop || return 1
	i=0
	for d in $(cat /tmp/vl-loop.devs); do
		m=/mnt/vl-loop$i
		mkdir -p "$m" && mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$d" && mount "$d" "$m" || return 1
		dirs+=("\"$m/tutti\"")
		i=$((i + 1))
	done
	LOOPDIRS=$(IFS=,; echo "${dirs[*]}")
	echo "$LOOPDIRS" >/tmp/vl-loops
	log "storage: $NLOOPS RAM-backed loop devices of $LOOP_GIB GiB (emulated storage, $EMU_LIMITER limit), ext4, O_DIRECT"
}

phase() { # model phase out [extra-config [drive.py args...]]
	local model=$1 ph=$2 out=$3 extra=${4:-}
	local args=(--model "eval/vllm/models/$model" --phase "$ph" --out "$out" "${@:5}")
	case $extra in
	"") ;;
	offloading) args+=(--connector offloading) ;;
	*) args+=(--connector tutti --extra-config "$extra") ;;
	esac
	# A model's own drive flags (a hybrid model's GPU cache size in its blocks, say).
	[ -f "eval/vllm/models/$model/drive.args" ] && args+=($(cat "eval/vllm/models/$model/drive.args"))
	# env -u: the second process must need nothing of the environment.
	env -u PYTHONHASHSEED PYTHONPATH="$SITE:$ROOT/python" TUTTI_LIB="$ROOT/bin/libtutti.so" \
		TUTTI_KERNELS_LIB="$ROOT/kernels/build/libtutti_kernels.so" PYTHONUNBUFFERED=1 \
		timeout 300 python3 eval/vllm/drive.py "${args[@]}" $DRIVE_ARGS >>"$OUT/vllm.log" 2>&1
	local rc=$?
	log "$model $ph ${extra:+(${extra:0:10})}: rc $rc, $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"engine start {r['engine_start_s']:.0f} s\")" "$out" 2>/dev/null)"
	return $rc
}

check_case() { # MODEL:STORAGE:PATH
	local model storage path dirs store extra
	IFS=: read -r model storage path <<<"$1"
	case $storage in
	loops) loops_up || { log "$1: loop devices failed"; return 1; }; dirs=$LOOPDIRS ;;
	disk) dirs="\"/var/tmp/tutti-vllm\"" ;;
	*) log "$1: unknown storage $storage"; return 1 ;;
	esac
	# A new store per case: its directories and the check digests are emptied.
	dirs_clear "$dirs"
	rm -rf "$RES/check-$1" && mkdir -p "$RES/check-$1"
	extra="{\"dirs\":[$dirs],\"capacity_bytes\":$((CAPACITY_GIB << 30)),\"path\":\"$path\""
	[ "$CHECK" = 1 ] && extra+=",\"check\":{\"dir\":\"$RES/check-$1\"}"
	extra+="${TUTTI_EXTRA:+,$TUTTI_EXTRA}}"
	if [ ! -f "$RES/baseline-$model$BASE_TAG.json" ]; then
		phase "$model" baseline "$RES/baseline-$model$BASE_TAG.json" || return 1
	fi
	phase "$model" first "$RES/first-$1.json" "$extra" || return 1
	phase "$model" second "$RES/second-$1.json" "$extra" || return 1
	local control=() cf="$RES/control-first-$model$BASE_TAG.json"
	if [ "$CONTROL" = 1 ]; then # the first phase through vLLM's own OffloadingConnector (compare.py's doc)
		if [ -f "$cf" ] || phase "$model" first "$cf" offloading; then
			control=(--control "$cf")
		else
			log "$1: the control run (vLLM's OffloadingConnector) failed (its error: $OUT/vllm.log)"
		fi
	fi
	python3 eval/vllm/compare.py --case "$1" --baseline "$RES/baseline-$model$BASE_TAG.json" \
		--first "$RES/first-$1.json" --second "$RES/second-$1.json" --check-dir "$RES/check-$1" \
		"${control[@]}" --json "$OUT/vllm-${1//:/-}.json" | tee -a "$OUT/summary.txt"
}

tutti_extra() { # storage path check-dir -> kv_connector_extra_config (dirs emptied: a new store)
	local storage=$1 path=$2 chk=$3 dirs extra
	case $storage in
	loops) loops_up >&2 || return 1; dirs=$LOOPDIRS ;; # its log lines are not the config
	disk) dirs="\"/var/tmp/tutti-vllm\"" ;;
	*) return 1 ;;
	esac
	dirs_clear "$dirs"
	extra="{\"dirs\":[$dirs],\"capacity_bytes\":$((CAPACITY_GIB << 30)),\"path\":\"$path\""
	[ -n "$chk" ] && extra+=",\"check\":{\"dir\":\"$chk\"}"
	echo "$extra${TUTTI_EXTRA:+,$TUTTI_EXTRA}}"
}

ttft_case() { # MODEL:STORAGE:PATH: TTFT of restored prefixes, recompute vs tutti vs OffloadingConnector
	local model storage path extra
	IFS=: read -r model storage path <<<"$1"
	if [ "$storage" = loops ]; then loops_up || { log "$1: loop devices failed"; return 1; }; fi
	extra=$(tutti_extra "$storage" "$path" "") || { log "$1: storage $storage failed"; return 1; }
	phase "$model" ttft "$RES/ttft-none-$model.json" || return 1
	phase "$model" ttft "$RES/ttft-tutti-${1//:/-}.json" "$extra" || return 1
	if [[ " $DRIVE_ARGS " == *" --state-probe "* ]]; then # a diagnostic run: where tutti's restored prefix parts
		python3 eval/vllm/state_probe.py --recompute "$RES/ttft-none-$model.json" \
			--tutti "$RES/ttft-tutti-${1//:/-}.json" | tee -a "$OUT/summary.txt"
	fi
	local ctl=""
	if [ "$TTFT_CONTROL" = 1 ]; then # no connector, no reset: the questions hit vLLM's own cache (the control)
		ctl=$RES/ttft-vllmcache-$model.json
		phase "$model" ttft "$ctl" "" --ttft-reset off || { log "$1: the control run failed"; ctl=""; }
	fi
	# vLLM's OffloadingConnector failing on a model (a hybrid one, say) costs its row, not tutti's.
	local off=$RES/ttft-offloading-$model.json
	if [ "$TTFT_OFFLOADING" = 0 ]; then
		off=""
	elif ! phase "$model" ttft "$off" offloading; then
		log "$1: vLLM's OffloadingConnector failed on $model (its error: $OUT/vllm.log); the table has no row of it"
		rm -f "$off"
		off=""
	fi
	python3 eval/vllm/ttft_table.py --case "$1" --recompute "$RES/ttft-none-$model.json" \
		--tutti "$RES/ttft-tutti-${1//:/-}.json" ${off:+--offloading "$off"} ${ctl:+--vllm-cache "$ctl"} \
		--json "$OUT/ttft-${1//:/-}.json" | tee -a "$OUT/summary.txt"
}

start_checks() {
	install_site || { log "vLLM is not staged: see this script's header"; exit 1; }
	[ -f bin/libtutti.so ] || { log "no bin/libtutti.so: make gpu-bins here, carry bin/libtutti.so"; exit 1; }
	kernels_wait || exit 1
	log "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader), $(python3 -c 'import torch; print("torch", torch.__version__)')"
}

HYBRID_CASES="gemma3-1b:loops:gpu qwen3-next-tiny:loops:gpu"

# Sourced (eval/vllm/headline.sh): the functions above, nothing run.
[[ "${BASH_SOURCE[0]}" != "$0" ]] && return 0

case ${1:-} in
ttft | hybrid)
	what=$1
	shift
	t0=$SECONDS
	start_checks
	rc=0
	jobs=()
	if [ "$what" = hybrid ]; then # every hybrid check, then every TTFT; a job done on this warm machine is skipped
		for c in ${*:-$HYBRID_CASES}; do jobs+=("check_case $c"); done
		for c in ${*:-$HYBRID_CASES}; do jobs+=("ttft_case $c"); done
	else
		for c in "$@"; do jobs+=("ttft_case $c"); done
	fi
	for j in "${jobs[@]}"; do
		mark="$RES/done-${j// /-}"
		mark=${mark//:/-}
		if [ "$what" = hybrid ] && [ -f "$mark" ]; then
			log "$j: done already on this machine (rm $RES/done-* to run it again)"
			continue
		fi
		if [ $((SECONDS - t0)) -ge "$BUDGET_S" ]; then
			log "$j: not run, the call's budget of $BUDGET_S s is spent (call again: done ones are skipped)"
			rc=1
			continue
		fi
		if $j; then touch "$mark"; else rc=1; fi
	done
	exit $rc
	;;
recv)
	kernels_bg
	if pieces_ok; then install_site; else log "pieces still to come (above)"; fi
	;;
check)
	shift
	t0=$SECONDS
	install_site || { log "vLLM is not staged: see this script's header"; exit 1; }
	[ -f bin/libtutti.so ] || { log "no bin/libtutti.so: make gpu-bins here, carry bin/libtutti.so"; exit 1; }
	kernels_wait || exit 1
	log "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader), $(python3 -c 'import torch; print("torch", torch.__version__)')"
	rc=0
	for c in "$@"; do
		if [ $((SECONDS - t0)) -ge "$BUDGET_S" ]; then
			log "$c: not run, the call's budget of $BUDGET_S s is spent"
			rc=1
			continue
		fi
		check_case "$c" || rc=1
	done
	cp /tmp/kernels-build.log "$OUT/" 2>/dev/null
	exit $rc
	;;
*)
	echo "usage: $0 recv | check MODEL:STORAGE:PATH... | ttft MODEL:STORAGE:PATH... | hybrid [MODEL:STORAGE:PATH...]" >&2
	exit 2
	;;
esac
