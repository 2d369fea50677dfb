#!/usr/bin/env bash
# scripts/emuprobe.sh: how steady can emulated storage be on this kernel? A
# diagnostic for choosing the limiter of RAM-backed loop devices (emulated
# storage), run as root on the GPU machine in one device call (about 90 s):
#
#   bash scripts/emuprobe.sh            (needs bin/gpu/tutti: make gpu-bins, carry it)
#
# It prints the kernel's block-layer options (throttling, iocost, null_blk,
# ublk), then the striped ceiling (`tutti devbench --striped`) of 8 and 4
# loop devices sampled several times, long (2 GiB a device) and short
# (128 MiB a device, a restore of a few blocks), under: no limit; cgroup v2
# io.max (blk-throttle); iocost with a fixed linear model (vrate pinned at
# 100%). blk-throttle admits about one 100 ms slice of its rate at once
# after an idle spell, so a short transfer runs at the host's copy speed
# and only long ones see the limit; iocost charges every bio against the
# model, which this probe measures. Results: stdout and $OUT/emuprobe.txt.
#
# Knobs: RATE_BPS (per-device limit, default 1500000000), LOOP_SIZE (3G).
set -u
OUT=${OUT:-/tmp/out}
RATE=${RATE_BPS:-1500000000}
SIZE=${LOOP_SIZE:-3G}
T=${TUTTI:-bin/gpu/tutti}
mkdir -p "$OUT"
exec > >(tee "$OUT/emuprobe.txt") 2>&1
. "$(dirname "$0")/emuloop.sh"
[ -x "$T" ] || { echo "emuprobe: $T missing (make gpu-bins)"; exit 2; }
echo "kernel $(uname -r), $(nproc) CPUs; cgroup v2 controllers: $(cat /sys/fs/cgroup/cgroup.controllers 2>&1)"
(zcat /proc/config.gz 2>/dev/null || cat "/boot/config-$(uname -r)" 2>/dev/null) |
	grep -E 'BLK_DEV_THROTTLING=|BLK_CGROUP_IOCOST=|BLK_DEV_NULL_BLK|BLK_DEV_UBLK|BLK_DEV_NBD|CONFIGFS_FS'
FILES=(/dev/shm/emuprobe-{0..7})
LOOPS=()
cleanup() {
	local l
	for l in "${LOOPS[@]}"; do
		echo "$(cat "/sys/block/${l#/dev/}/dev") enable=0" >/sys/fs/cgroup/io.cost.qos 2>/dev/null
		losetup -d "$l"
	done
	rm -f "${FILES[@]}"
	rmdir /sys/fs/cgroup/emuprobe 2>/dev/null
}
trap cleanup EXIT
emu_backing_many "$SIZE" "${FILES[@]}" || { echo "emuprobe: backing files failed"; exit 1; }
for f in "${FILES[@]}"; do LOOPS+=("$(losetup --find --show --direct-io=on "$f")") || exit 1; done
devno() { cat "/sys/block/${1#/dev/}/dev"; }
P8=$(IFS=,; echo "${LOOPS[*]}")
P4=$(IFS=,; echo "${LOOPS[*]:0:4}")
sample() { # label paths op rounds size-per-device
	local i
	for ((i = 0; i < $4; i++)); do
		timeout 60 "$T" devbench --striped --path "$2" --size "$5" --buffer 256MiB --ops "$3" --allow-holes 2>&1 |
			grep -E '^striped|rror' | head -1 | sed "s|^|$1 $3 $5 #$i: |"
	done
}
echo "== no limit"
sample raw8 "$P8" randread 3 2GiB
sample raw8 "$P8" randread 3 128MiB
sample raw8 "$P8" seqwrite 2 2GiB
echo "== io.max rbps=wbps=$RATE a device (cgroup v2, this shell moved into it)"
if mkdir -p /sys/fs/cgroup/emuprobe; then
	for l in "${LOOPS[@]}"; do echo "$(devno "$l") rbps=$RATE wbps=$RATE" >/sys/fs/cgroup/emuprobe/io.max; done
	(
		echo $BASHPID >/sys/fs/cgroup/emuprobe/cgroup.procs || exit 1
		sample max8 "$P8" randread 4 2GiB
		sample max8 "$P8" randread 4 128MiB
		sample max4 "$P4" randread 3 2GiB
	)
	for l in "${LOOPS[@]}"; do echo "$(devno "$l") rbps=max wbps=max" >/sys/fs/cgroup/emuprobe/io.max; done
fi
echo "== iocost, linear model at $RATE B/s a device, vrate pinned at 100%"
for l in "${LOOPS[@]}"; do
	echo "$(devno "$l") ctrl=user model=linear rbps=$RATE rseqiops=2000000 rrandiops=2000000 wbps=$RATE wseqiops=2000000 wrandiops=2000000" >/sys/fs/cgroup/io.cost.model || echo "iocost model refused for $l"
	echo "$(devno "$l") enable=1 ctrl=user rpct=0 rlat=0 wpct=0 wlat=0 min=100 max=100" >/sys/fs/cgroup/io.cost.qos || echo "iocost qos refused for $l"
done
sample cost8 "$P8" randread 4 2GiB
sample cost8 "$P8" randread 4 128MiB
sample cost4 "$P4" randread 3 2GiB
sample cost8 "$P8" seqwrite 3 2GiB
sample cost8 "$P8" seqwrite 2 128MiB
