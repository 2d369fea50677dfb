#!/usr/bin/env bash
# run 40 (planned for the next session's first call): the final GPU code (628a3a1) and gpubench's balanced round order (even rounds: each path first in half). Every GPU test; g1 (70B + per-block), g2 (MLA + per-block) on 4 loops, d1 (70B, disk), 6 rounds each; Python tests; pool. Results in $OUT/run40.tgz.
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run40.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
date -u > $R/machine.txt; nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv >> $R/machine.txt; nproc >> $R/machine.txt; uname -r >> $R/machine.txt
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
(cd kernels && timeout 200 ../bin/gpu/kernels.test -test.v -test.count=1 -test.run .) > $R/gotest.log 2>&1; echo "kernels.test rc=$? pass $(grep -cE '^\s*--- PASS' $R/gotest.log)"; grep -E '^\s*--- (FAIL|SKIP)|^FAIL|panic' $R/gotest.log | head
(cd runtime && timeout 120 ../bin/gpu/runtime.test -test.v -test.count=1 -test.run 'GPU|DeviceWindow|WindowFor') > $R/rt.log 2>&1; echo "runtime.test GPU rc=$?"; grep -E '^(--- FAIL|FAIL|panic)' $R/rt.log | head -6
(cd runtime/tp && timeout 120 ../../bin/gpu/tp.test -test.v -test.count=1 -test.run GPU) > $R/tp.log 2>&1; echo "tp.test GPU rc=$?"; grep -E '^(--- FAIL|FAIL|panic)' $R/tp.log | head -3; el
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 300 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; python3 -c "
import json
rs=[json.loads(l) for l in open('$R/$n.json')]
for r in rs:
  pr=r['per_round']; print('  %-10s cpu %.4f first %.2f ms p50 %.2f  x ceil %.3f %s  GB/s %s iowq %s'%(r['path'][:10], r['cpu_s_per_gib'], r['first_layer_ms'], r.get('layer_ms_p50',0), r['ceiling_fraction'], [round(x,3) for x in pr['ceiling_fraction_rounds']], [round(x/1e9,2) for x in pr['bytes_per_s_rounds']], r.get('io_wq_workers')))
g,a=rs[0]['per_round']['bytes_per_s_rounds'],rs[1]['per_round']['bytes_per_s_rounds']
print('  GPU/(a) per round', [round(x/y,3) for x,y in zip(g,a)])
"; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb g1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring,per-block --rounds 6
gb g2 --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring,per-block --rounds 6
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
mkdir -p /var/tmp/tk
gb d1 --model llama3-70b --dir /var/tmp/tk --label "real disk (virtio)" --paths gpu-kick,uring --rounds 6
rm -rf /var/tmp/tk
export TUTTI_LIB=$ROOT/bin/libtutti.so PYTHONPATH=$ROOT/python
timeout -k 10 100 python3 -m unittest discover -s python/tests -v > $R/python-tests.txt 2>&1; echo "python tests rc=$? $(grep -E '^Ran [0-9]+ tests' $R/python-tests.txt); $(tail -1 $R/python-tests.txt)"; grep -E '(FAIL|ERROR)' $R/python-tests.txt | head -5; el
bin/gpu/tutti gpubench-pool $R/g1.json $R/g2.json $R/d1.json | tee $R/pool.txt | cut -c1-260
