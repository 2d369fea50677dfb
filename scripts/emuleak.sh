#!/usr/bin/env bash
# Where does an iocost-limited loop device let reads through above its limit?
# devbench grids (mergeable 128k sequential and 1m random reads, plain and SQPOLL
# rings) in this shell's cgroup and in a child cgroup, with the loops' merging on
# and off (queue/nomerges=2), then a GPU-path serve-bench restore (every knob on).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/emuleak.txt") 2>&1
. scripts/emuloop.sh
T=bin/gpu/tutti
echo "cgroup: $(cat /proc/self/cgroup)"; cat /sys/fs/cgroup/cgroup.subtree_control
FILES=(/dev/shm/el-{0..3}); L=()
emu_backing_many 4G "${FILES[@]}"
for f in "${FILES[@]}"; do L+=("$(losetup --find --show --direct-io=on "$f")"); done
emu_limit "${L[@]}"
for l in "${L[@]}"; do echo "$l rotational=$(cat /sys/block/${l#/dev/}/queue/rotational) max_sectors_kb=$(cat /sys/block/${l#/dev/}/queue/max_sectors_kb) nomerges=$(cat /sys/block/${l#/dev/}/queue/nomerges)"; done
grep -E "^$(cat /sys/block/${L[0]#/dev/}/dev) " /sys/fs/cgroup/io.cost.qos /sys/fs/cgroup/io.cost.model
grid() {
	timeout 60 $T devbench --path "${L[0]}" --bs 128k,1m --qd 32 --engines uring,uring-sqpoll --ops seqread,randread --runtime 1s --allow-holes 2>&1 | grep -E '^ +uring' | awk -v tag="$1" '{print tag": "$0}' | cut -c1-160
}
mkdir -p /sys/fs/cgroup/emuleak
for nm in 0 2; do
	for l in "${L[@]}"; do echo $nm >/sys/block/${l#/dev/}/queue/nomerges; done
	grid "cg=self nomerges=$nm"
	( echo $BASHPID >/sys/fs/cgroup/emuleak/cgroup.procs; grid "cg=child nomerges=$nm" )
done
echo "== io.stat of the child"; cat /sys/fs/cgroup/emuleak/io.stat
# the real thing: a GPU-path restore through a node service, in the child, nomerges=2
make -C kernels NVCC=nvcc >/dev/null 2>&1; export TUTTI_KERNELS_LIB=$PWD/kernels/build/libtutti_kernels.so
(
	echo $BASHPID >/sys/fs/cgroup/emuleak/cgroup.procs
	M=()
	for i in 0 1 2 3; do mkfs.ext4 -q -F "${L[$i]}"; mkdir -p /mnt/el$i; mount "${L[$i]}" /mnt/el$i; M+=(/mnt/el$i); done
	D=$(IFS=,; echo "${M[*]}")
	$T devbench --striped --path "$D" --size 1GiB --buffer 256MiB --ops randread 2>&1 | grep striped
	$T serve --dir "$D" --socket /tmp/el.sock --model llama3-8b --capacity-blocks 128 --no-prewrite >/tmp/el-serve.log 2>&1 &
	sp=$!
	for _ in $(seq 300); do [ -S /tmp/el.sock ] && break; sleep 0.1; done
	for p in gpu cpu; do
		B="$T serve-bench --socket /tmp/el.sock --model llama3-8b --path $p --prefixes 8 --min-blocks 8 --max-blocks 8 --load-only --duration 8s"
		[ $p = gpu ] && $B --engines 1 --populate >/dev/null 2>&1
		$B --engines 1 2>&1 | tail -1 | sed -E 's/.*"loaded_bytes":([0-9]+).*"load_gb_per_s":([0-9.]+).*/'$p' path: loaded \1 B at \2 GB\/s (limit 6 GB\/s over 4 loops)/'
	done
	grep -o '"probes":\[[^]]*\]' /tmp/el-serve.log | head -1 | cut -c1-400
	kill -9 $sp; sleep 0.5
	for m in "${M[@]}"; do umount $m; done
)
echo "== io.stat of the child after"; cat /sys/fs/cgroup/emuleak/io.stat
emu_unlimit "${L[@]}"; for l in "${L[@]}"; do losetup -d $l; done; rm -f "${FILES[@]}"; rmdir /sys/fs/cgroup/emuleak
