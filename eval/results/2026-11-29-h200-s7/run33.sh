#!/usr/bin/env bash
# run 33: more rounds on the final code (95b3e74), decided before it ran: every round of runs 30-33 at the final settings is pooled whatever this one shows. Every GPU test; gpubench 70B and MLA on 4 loops with per-block, 9 rounds each; 70B on the disk; python tests. Results in $OUT/run33.tgz.
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run33.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
date -u > $R/machine.txt; nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv >> $R/machine.txt; nproc >> $R/machine.txt; uname -r >> $R/machine.txt; lscpu >> $R/machine.txt
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
(cd kernels && timeout 200 ../bin/gpu/kernels.test -test.v -test.count=1 -test.run .) > $R/gotest.log 2>&1; echo "kernels.test rc=$? pass $(grep -cE '^\s*--- PASS' $R/gotest.log)"; grep -E '^\s*--- (FAIL|SKIP)|^FAIL|panic' $R/gotest.log | head
(cd runtime && timeout 120 ../bin/gpu/runtime.test -test.v -test.count=1 -test.run 'GPU|DeviceWindow') > $R/rt.log 2>&1; echo "runtime.test GPU rc=$?"; grep -E '^(--- |FAIL|panic)' $R/rt.log | head -6
(cd runtime/tp && timeout 120 ../../bin/gpu/tp.test -test.v -test.count=1 -test.run GPU) > $R/tp.log 2>&1; echo "tp.test GPU rc=$?"; grep -E '^(--- |FAIL|panic)' $R/tp.log | head -3; el
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 200 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E 'GPU window' $R/$n.txt; echo "  rounds with io-wq workers: $(grep -E '^  gpu-driven' $R/$n.txt | grep -c iou-wrk) of $(grep -cE '^  gpu-driven' $R/$n.txt)"; grep -A4 '^median' $R/$n.txt | tail -4 | cut -c1-120; python3 -c "
import json
for l in open('$R/$n.json'):
  r=json.loads(l); pr=r['per_round']; print('  %-10s cpu %.4f first %.2f ms  x ceil %s  x sum %s  GB/s %s'%(r['path'][:10], r['cpu_s_per_gib'], r['first_layer_ms'], [round(x,3) for x in pr['ceiling_fraction_rounds']], [round(x,3) for x in pr.get('ceiling_sum_fraction_rounds',[])], [round(x/1e9,2) for x in pr['bytes_per_s_rounds']]))
"; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb g1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring,per-block --rounds 9
gb g2 --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring,per-block --rounds 9
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
mkdir -p /var/tmp/tk
gb d1 --model llama3-70b --dir /var/tmp/tk --label "real disk (virtio)" --paths gpu-kick,uring
rm -rf /var/tmp/tk
export TUTTI_LIB=$ROOT/bin/libtutti.so PYTHONPATH=$ROOT/python
timeout -k 10 100 python3 -m unittest discover -s python/tests -v > $R/python-tests.txt 2>&1; echo "python tests rc=$? $(grep -cE ' \.\.\. ok$' $R/python-tests.txt) ok; $(tail -1 $R/python-tests.txt)"; grep -E '(FAIL|ERROR|skipped)' $R/python-tests.txt | head -5; el
