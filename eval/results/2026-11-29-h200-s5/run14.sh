#!/usr/bin/env bash
# run 14: kernels .cu cleanups + feeder chunk default (50097b1), gpubench runs layout (3195736) and rounds (173e12f):
# 70B/MLA on 4 loops (runs vs layers), 70B on the disk
set -u
R=/tmp/res; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run14.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv > $R/machine.txt; nproc >> $R/machine.txt; uname -r >> $R/machine.txt
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
(cd kernels && timeout 200 ../bin/gpu/kernels.test -test.v -test.count=1 -test.run .) > $R/gotest.log 2>&1; echo "kernels.test rc=$? pass $(grep -cE '^\s*--- PASS' $R/gotest.log)"; grep -E '^\s*--- (FAIL|SKIP)|^FAIL|panic' $R/gotest.log | head; el
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 170 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E '^gpubench|round . of|^median|GB/s' $R/$n.txt | sed 's/ KiB (per-layer).*storage/ .. storage/' | cut -c1-300 | head -24; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb g1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring,per-block
gb g1L --model llama3-70b --devices $devs --label "$E" --stripe layers --paths gpu-kick
gb g2 --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring,per-block
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
mkdir -p /var/tmp/tk
gb d1 --model llama3-70b --dir /var/tmp/tk --label "real disk (virtio)" --paths gpu-kick,uring
rm -rf /var/tmp/tk
el
