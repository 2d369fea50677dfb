#!/usr/bin/env bash
# scripts/emuleak.sh: where does an iocost-limited loop device let reads
# through above its limit (a diagnostic of the kernel limiters that
# scripts/emuloop.sh offers; the GPU machine, one device call, ~70 s)? In a
# child cgroup: devbench at deep queues; a GPU-path and a CPU-path restore
# through a node service under iocost alone, then under iocost plus io.max on
# the same cgroup; then unlimited. Needs bin/gpu (make gpu-pack) and nvcc.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/emuleak.txt") 2>&1
EMU_LIMITER=iocost
. scripts/emuloop.sh
T=bin/gpu/tutti
R=1500000000
FILES=(/dev/shm/el-{0..3}); L=()
emu_backing_many 4G "${FILES[@]}"
for f in "${FILES[@]}"; do L+=("$(losetup --find --show --direct-io=on "$f")"); done
emu_limit "${L[@]}"
CG=/sys/fs/cgroup/emuleak; mkdir -p $CG
echo $$ >$CG/cgroup.procs
echo "cgroup: $(cat /proc/self/cgroup)"
$T devbench --path "${L[0]}" --bs 1m,4m --qd 128,512 --engines uring --ops randread --runtime 1s --allow-holes 2>&1 | grep -E '^ +uring' | cut -c1-120
make -C kernels NVCC=nvcc >/dev/null 2>&1; export TUTTI_KERNELS_LIB=$PWD/kernels/build/libtutti_kernels.so
M=()
for i in 0 1 2 3; do mkfs.ext4 -q -F "${L[$i]}"; mkdir -p /mnt/el$i; mount "${L[$i]}" /mnt/el$i; M+=(/mnt/el$i); done
D=$(IFS=,; echo "${M[*]}")
$T serve --dir "$D" --socket /tmp/el.sock --model llama3-8b --capacity-blocks 128 --no-prewrite >/tmp/el-serve.log 2>&1 &
sp=$!
for _ in $(seq 300); do [ -S /tmp/el.sock ] && break; sleep 0.1; done
B="$T serve-bench --socket /tmp/el.sock --model llama3-8b --prefixes 8 --min-blocks 8 --max-blocks 8 --load-only --duration 6s --engines 1"
$B --path gpu --populate >/dev/null 2>&1
rb() { awk '{for(i=2;i<=NF;i++) if($i ~ /^rbytes=/){split($i,a,"="); s+=a[2]}} END{print s+0}' $CG/io.stat; }
run() {
	local p=$1 tag=$2 b0 b1 t0 t1
	b0=$(rb); t0=$(date +%s%N)
	$B --path $p 2>&1 | tail -1 | sed -E 's/.*"load_gb_per_s":([0-9.]+).*/\1/' | xargs printf "$tag $p path: serve-bench %s GB/s"
	b1=$(rb); t1=$(date +%s%N)
	awk -v b="$((b1 - b0))" -v t="$(((t1 - t0) / 1000000))e-3" 'BEGIN{printf "; devices read %.1f GB in %.1f s (%.2f GB/s; limit 6)\n", b/1e9, t, b/1e9/t}'
}
run gpu "iocost"
run cpu "iocost"
for l in "${L[@]}"; do echo "$(cat /sys/block/${l#/dev/}/dev) rbps=$R wbps=$R" >$CG/io.max; done
run gpu "iocost+io.max"
run cpu "iocost+io.max"
for i in 1 2 3 4; do $T devbench --striped --path "$(IFS=,; echo "${L[*]}")" --size 128MiB --buffer 256MiB --ops randread --allow-holes 2>&1 | grep -E '^striped' | cut -c1-60 | sed 's/^/iocost+io.max 128MiB: /'; sleep 0.3; done
for l in "${L[@]}"; do echo "$(cat /sys/block/${l#/dev/}/dev) rbps=max wbps=max" >$CG/io.max; done
emu_unlimit "${L[@]}"
run gpu "io.max-off,iocost-off (host)"
kill -9 $sp; sleep 0.5
echo $$ >/sys/fs/cgroup/cgroup.procs 2>/dev/null || echo $$ >/sys/fs/cgroup/process_api/cgroup.procs 2>/dev/null
for m in "${M[@]}"; do umount $m; done
for l in "${L[@]}"; do losetup -d $l; done; rm -f "${FILES[@]}"; rmdir $CG
