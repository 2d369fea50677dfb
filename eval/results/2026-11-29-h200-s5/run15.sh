#!/usr/bin/env bash
# run 15: GPU window = half of nr_requests per device (183fd1a): 70B/MLA on 4 loops, 70B on the disk;
# variants on 70B loops: kick batch 64, largest read 1280 KiB
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run15.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv > $R/machine.txt; nproc >> $R/machine.txt; uname -r >> $R/machine.txt; lscpu >> $R/machine.txt
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
(cd runtime && timeout 120 ../bin/gpu/runtime.test -test.v -test.count=1 -test.run 'GPU|DeviceWindow') > $R/rt.log 2>&1; echo "runtime.test GPU rc=$?"; grep -E '^(--- |FAIL|panic)' $R/rt.log | head -6
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 170 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E 'round . of|GPU window|GB/s' $R/$n.txt | sed 's/ 0 of them the whole batch wait (kick-wait, deferred task work)//; s/, READ_FIXED into registered staging//' | cut -c1-250 | head -24; grep -A4 '^median' $R/$n.txt | cut -c1-110; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb g1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring,per-block
gb g2 --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring,per-block
gb g1b64 --model llama3-70b --devices $devs --label "$E, kick batch 64" --kick-batch 64 --paths gpu-kick,per-block
gb g1m --model llama3-70b --devices $devs --label "$E, largest read 1280 KiB" --max-io 1310720 --paths gpu-kick,per-block
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
mkdir -p /var/tmp/tk
gb d1 --model llama3-70b --dir /var/tmp/tk --label "real disk (virtio)" --paths gpu-kick,uring
rm -rf /var/tmp/tk
el
