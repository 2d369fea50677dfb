#!/usr/bin/env bash
# run 17 (diagnostic): what limits restores on the loop devices? devbench's ceiling (4 rings, random, QD 32)
# against one ring over 4 devices with the GPU path's pattern (ioexp, host only, no GPU), interleaved
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run17.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
L=(); for i in 0 1 2 3; do truncate -s 1G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
for d in "${L[@]}"; do dd if=/dev/zero of=$d bs=1M count=1024 oflag=direct status=none & done; wait
devs=$(IFS=,; echo "${L[*]}"); el
ceil() { local s=0; for d in "${L[@]}"; do bin/gpu/tutti devbench --path $d --bs 1m --qd 32 --engines uring --ops randread --runtime 2s --json > $R/db-$(basename $d).json 2>&1 & done; wait
  python3 -c "import json,glob;v=[json.load(open(f))[0]['bytes_per_s']/1e9 for f in sorted(glob.glob('$R/db-*.json'))];print('devbench ceiling, 4 processes, QD 32 random: %.2f GB/s %s'%(sum(v),['%.2f'%x for x in v]))"; }
for rep in 1 2; do
  ceil
  bin/gpu/ioexp --devs $devs --window 256 --span 227 --size 1024
  bin/gpu/ioexp --devs $devs --window 256 --span 227 --size 1024 --rings 4
  bin/gpu/ioexp --devs $devs --window 128 --span 227 --size 1024 --random
  bin/gpu/ioexp --devs $devs --window 128 --span 227 --size 1024 --rings 4 --random
  bin/gpu/ioexp --devs $devs --window 64 --span 227 --size 1024
  el
done 2>&1 | tee $R/exp.txt
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
timeout 150 bin/gpu/tutti gpubench --model llama3-70b --devices $devs --label "emulated storage (4 RAM-backed loop devices)" --rounds 2 --paths gpu-kick,uring,page-cache,dram --json $R/g1.json > $R/g1.txt 2>&1; echo "gpubench rc=$?"
grep -E 'round . of|GB/s' $R/g1.txt | sed 's/devbench.CeilingInto: 1 MiB O_DIRECT random reads, QD 32, uring, 2 s, all devices at once, //' | cut -c1-200
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*; el
