#!/usr/bin/env bash
# run 27 (final code, another host): 70B and MLA on 4 loops with the diagnostic (a0)
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run27.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
date -u > $R/machine.txt; nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv >> $R/machine.txt; nproc >> $R/machine.txt; uname -r >> $R/machine.txt; lscpu >> $R/machine.txt
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 200 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E 'GPU window' $R/$n.txt; grep -A4 '^median' $R/$n.txt | tail -4 | cut -c1-120; python3 -c "
import json
for l in open('$R/$n.json'):
  r=json.loads(l); pr=r['per_round']; print('  %-10s first %.2f ms  x ceil %s  x sum %s  GB/s %s'%(r['path'][:10], r['first_layer_ms'], [round(x,3) for x in pr['ceiling_fraction_rounds']], [round(x,3) for x in pr.get('ceiling_sum_fraction_rounds',[])], [round(x/1e9,2) for x in pr['bytes_per_s_rounds']]))
"; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb g1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring,uring-staging-only
gb g2 --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring,uring-staging-only
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
