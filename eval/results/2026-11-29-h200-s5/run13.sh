#!/usr/bin/env bash
# run 13: confirm session 4's untested commits (495c9be) on the GPU; feeder chunk 1/4/8 on 70B loops; MLA loops
set -u
R=/tmp/res; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run13.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv > $R/machine.txt; nproc >> $R/machine.txt; uname -r >> $R/machine.txt
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
(cd kernels && timeout 200 ../bin/gpu/kernels.test -test.v -test.count=1 -test.run .) > $R/gotest.log 2>&1; echo "kernels.test rc=$? pass $(grep -cE '^\s*--- PASS' $R/gotest.log)"; grep -E '^\s*--- (FAIL|SKIP)|^FAIL|panic' $R/gotest.log | head; el
(cd runtime && timeout 120 ../bin/gpu/runtime.test -test.v -test.count=1 -test.run GPU) > $R/rt.log 2>&1; echo "runtime.test GPU rc=$?"; grep -E '^(--- |FAIL|panic)' $R/rt.log | head -4
(cd runtime/tp && timeout 120 ../../bin/gpu/tp.test -test.v -test.count=1 -test.run GPU) > $R/tp.log 2>&1; echo "tp.test GPU rc=$?"; grep -E '^(--- |FAIL|panic)' $R/tp.log | head -3; el
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
for d in "${L[@]}"; do echo "$d nr_requests $(cat /sys/block/$(basename $d)/queue/nr_requests) max_sectors_kb $(cat /sys/block/$(basename $d)/queue/max_sectors_kb)"; done
gb() { local n=$1; shift; timeout 150 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E 'ceiling \(|GB/s' $R/$n.txt | cut -c1-330 | head -6; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb g1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring,per-block
gb g1c4 --model llama3-70b --devices $devs --label "$E, enqueue chunk 4" --enqueue-chunk 4 --reuse --paths gpu-kick
gb g1c8 --model llama3-70b --devices $devs --label "$E, enqueue chunk 8" --enqueue-chunk 8 --reuse --paths gpu-kick
gb g1c1 --model llama3-70b --devices $devs --label "$E, enqueue chunk 1 again" --reuse --paths gpu-kick
gb g2 --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring,per-block
gb g2c4 --model deepseek-v3 --devices $devs --label "$E, enqueue chunk 4" --enqueue-chunk 4 --reuse --paths gpu-kick,uring
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
el
