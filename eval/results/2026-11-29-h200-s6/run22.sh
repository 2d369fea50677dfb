#!/usr/bin/env bash
# run 22: striped ceiling bracketing each path, rotated order, kick backoff reset; every GPU test; 70B/MLA loops, 70B lookahead 8, 70B disk; python tests
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run22.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
date -u > $R/machine.txt; nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv >> $R/machine.txt; nproc >> $R/machine.txt; uname -r >> $R/machine.txt; lscpu >> $R/machine.txt
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
(cd kernels && timeout 200 ../bin/gpu/kernels.test -test.v -test.count=1 -test.run .) > $R/gotest.log 2>&1; echo "kernels.test rc=$? pass $(grep -cE '^\s*--- PASS' $R/gotest.log)"; grep -E '^\s*--- (FAIL|SKIP)|^FAIL|panic' $R/gotest.log | head
(cd runtime && timeout 120 ../bin/gpu/runtime.test -test.v -test.count=1 -test.run 'GPU|DeviceWindow') > $R/rt.log 2>&1; echo "runtime.test GPU rc=$?"; grep -E '^(--- |FAIL|panic)' $R/rt.log | head -6
(cd runtime/tp && timeout 120 ../../bin/gpu/tp.test -test.v -test.count=1 -test.run GPU) > $R/tp.log 2>&1; echo "tp.test GPU rc=$?"; grep -E '^(--- |FAIL|panic)' $R/tp.log | head -3; el
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 170 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E 'round . of|GPU window|GB/s' $R/$n.txt | sed 's/ 0 of them the whole batch wait (kick-wait, deferred task work)//; s/, READ_FIXED into registered staging//; s/devbench.CeilingEachInto: 1 MiB O_DIRECT random reads, QD 32, uring, 2 s, all devices at once, //; s/each device its share of the prefix, timed to the slowest; //' | cut -c1-260 | head -40; grep -A4 '^median' $R/$n.txt | cut -c1-110; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb g1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring,per-block
gb g1L8 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring --lookahead 8 --reuse
gb g2 --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring,per-block
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
mkdir -p /var/tmp/tk
gb d1 --model llama3-70b --dir /var/tmp/tk --label "real disk (virtio)" --paths gpu-kick,uring
rm -rf /var/tmp/tk
export TUTTI_LIB=$ROOT/bin/libtutti.so PYTHONPATH=$ROOT/python
timeout -k 10 100 python3 -m unittest discover -s python/tests -v > $R/python-tests.txt 2>&1; echo "python tests rc=$? $(grep -cE ' \.\.\. ok$' $R/python-tests.txt) ok; $(tail -1 $R/python-tests.txt)"; grep -E '(FAIL|ERROR|skipped)' $R/python-tests.txt | head -5; el
