#!/usr/bin/env bash
# scripts/emuprobe.sh: which limiter of scripts/emuloop.sh holds emulated
# storage still, for every I/O pattern? Run as root on the GPU machine in one
# device call (about 70 s a limiter): bash scripts/emuprobe.sh (needs
# bin/gpu/tutti: make gpu-pack, carry it; nvcc for the store rows' GPU path).
#
# For each limiter in LIMITERS (default "emudev iomax"), on NLOOPS (8) fresh
# RAM-backed loop devices at RATE_BPS (1.5e9) each: the striped read and write
# ceilings sampled 6 times long (2 GiB a device) and 6 times short (128 MiB a
# device, half a second idle after each: a restore after a pause; knobs
# LOOP_SIZE, LONG_SIZE, SHORT_SIZE), then
# gpubench's store rows (llama3-8b, 32K tokens, ROUNDS rounds: the product's
# own saves and restores, store-gpu and store-cpu) on ext4 over the loops;
# with emudev, its CPU seconds (what emulating costs the host). The kernel's
# block-layer options are printed first. Results: stdout and $OUT/emuprobe.txt.
set -u
OUT=${OUT:-/tmp/out}
T=${TUTTI:-bin/gpu/tutti}
N=${NLOOPS:-8}
EMU_RATE_BPS=${RATE_BPS:-1500000000}
ROUNDS=${ROUNDS:-2}
SIZE=${LOOP_SIZE:-3G}
LONG=${LONG_SIZE:-2GiB}
SHORT=${SHORT_SIZE:-128MiB}
mkdir -p "$OUT"
exec > >(tee "$OUT/emuprobe.txt") 2>&1
. "$(dirname "$0")/emuloop.sh"
EMU_TUTTI=$T
[ -x "$T" ] || { echo "emuprobe: $T missing (make gpu-bins)"; exit 2; }
echo "kernel $(uname -r), $(nproc) CPUs; cgroup v2 controllers: $(cat /sys/fs/cgroup/cgroup.controllers 2>&1); /dev/fuse: $([ -c /dev/fuse ] && echo yes || echo no)"
(zcat /proc/config.gz 2>/dev/null || cat "/boot/config-$(uname -r)" 2>/dev/null) |
	grep -E 'BLK_DEV_THROTTLING|BLK_CGROUP_IOCOST=|BLK_DEV_NULL_BLK=|BLK_DEV_UBLK=|FUSE_FS='
if [ -f kernels/build/libtutti_kernels.so ] || make -C kernels NVCC=nvcc >/tmp/emuprobe-build.log 2>&1; then
	export TUTTI_KERNELS_LIB=$PWD/kernels/build/libtutti_kernels.so
fi
FILES=()
for ((i = 0; i < N; i++)); do FILES+=("/dev/shm/emuprobe-$i"); done
LOOPS=()
MOUNTS=()
down() {
	local l
	for l in "${MOUNTS[@]}"; do umount "$l"; done
	emu_unlimit "${LOOPS[@]}"
	for l in "${LOOPS[@]}"; do losetup -d "$l"; done
	LOOPS=()
	MOUNTS=()
	emu_devices_stop | sed 's/^/emudev: /'
}
trap 'down; rm -f "${FILES[@]}"' EXIT
emu_backing_many "$SIZE" "${FILES[@]}" || { echo "emuprobe: backing files failed"; exit 1; }
for lim in ${LIMITERS:-emudev iomax}; do
	EMU_LIMITER=$lim
	echo "== $lim at $EMU_RATE_BPS B/s a device"
	mapfile -t LOOPS < <(emu_loops "${FILES[@]}")
	[ ${#LOOPS[@]} = "$N" ] || { echo "$lim: ${#LOOPS[@]} of $N loop devices"; down; continue; }
	emu_limit "${LOOPS[@]}"
	emu_steady "$T" 6 "$LONG" "${LOOPS[@]}" | grep ceiling | sed "s/^/$lim long: /"
	EMU_STEADY_GAP_S=0.5 emu_steady "$T" 6 "$SHORT" "${LOOPS[@]}" | grep ceiling | sed "s/^/$lim short: /"
	dirs=()
	for ((i = 0; i < N; i++)); do
		m=/mnt/emuprobe-$i
		mkdir -p "$m" && mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "${LOOPS[$i]}" && mount "${LOOPS[$i]}" "$m" || break
		MOUNTS+=("$m")
		dirs+=("$m")
	done
	cpu0=$( [ -f "$EMU_DEV/pid" ] && awk '{print $14 + $15}' "/proc/$(cat "$EMU_DEV/pid")/stat" 2>/dev/null)
	timeout 200 "$T" gpubench --model llama3-8b --tokens 32768 --store-dirs "$(IFS=,; echo "${dirs[*]}")" --rounds "$ROUNDS" \
		--paths "${PATHS:-store-gpu,store-cpu}" --label "$N loops, $lim" >"$OUT/emuprobe-$lim-gpubench.txt" 2>&1
	grep -E '^ceilings over|^  store-(gpu|cpu) ' "$OUT/emuprobe-$lim-gpubench.txt" | sed "s/^/$lim: /" | cut -c1-160
	if [ -n "${cpu0:-}" ]; then
		cpu1=$(awk '{print $14 + $15}' "/proc/$(cat "$EMU_DEV/pid")/stat" 2>/dev/null)
		echo "$lim: emudev CPU during the store rows: $(((cpu1 - cpu0) / $(getconf CLK_TCK))) s"
	fi
	down
done
