#!/usr/bin/env bash
# run 23: kick-loop ramp A/B (first layer), MLA ABA and 70B AB on 4 loops; GPU tests
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run23.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
date -u > $R/machine.txt; nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv >> $R/machine.txt; nproc >> $R/machine.txt; uname -r >> $R/machine.txt
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
(cd kernels && timeout 200 ../bin/gpu/kernels.test -test.v -test.count=1 -test.run .) > $R/gotest.log 2>&1; echo "kernels.test rc=$? pass $(grep -cE '^\s*--- PASS' $R/gotest.log)"; grep -E '^\s*--- (FAIL|SKIP)|^FAIL|panic' $R/gotest.log | head; el
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 170 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -A3 '^median' $R/$n.txt | tail -2 | cut -c1-120; python3 -c "
import json,sys
for l in open('$R/$n.json'):
  r=json.loads(l); pr=r['per_round']; print('  %-10s first %.2f ms  p50 %.2f  x ceil %s  GB/s %s  kicks: %s'%(r['path'][:10], r['first_layer_ms'], r['layer_ms_p50'], [round(x,3) for x in pr['ceiling_fraction_rounds']], [round(x/1e9,2) for x in pr['bytes_per_s_rounds']], r['note'][:30]))
"; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb g2r --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring
gb g2n --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring --reuse --kick-ramp -1
gb g2r2 --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring --reuse
gb g1r --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring
gb g1n --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring --reuse --kick-ramp -1
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
