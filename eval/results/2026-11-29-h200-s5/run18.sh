#!/usr/bin/env bash
# run 18: the GPU window on 4 loops: 256 (default, 64 per device) against 128 and 64, 70B and MLA, gpu-kick and (a)
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run18.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 170 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E 'GPU window' $R/$n.txt; grep -oE 'round . of .: ceiling \(into [0-9]+ MiB per device[^:]*: [0-9.]+ GB/s|^  [a-z(].{30}[0-9.]+ GB/s|iou-wrk-[0-9]+\[[0-9]+\]' $R/$n.txt | sed 's/(devbench.CeilingInto.*per device, the staging pool.s share)//' | uniq -c | cut -c1-120; grep -A3 '^median' $R/$n.txt | tail -2 | cut -c1-75; el; }
E="emulated storage (4 RAM-backed loop devices)"
for m in llama3-70b deepseek-v3; do
  gb $m-w256 --model $m --devices $devs --label "$E" --paths gpu-kick,uring
  gb $m-w128 --model $m --devices $devs --label "$E, window 128" --window 128 --paths gpu-kick,uring
  gb $m-w64 --model $m --devices $devs --label "$E, window 64" --window 64 --paths gpu-kick,uring
done
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*; el
