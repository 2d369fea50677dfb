#!/usr/bin/env bash
# run 28: window x lookahead A/B/C interleaved, 70B on 4 loops, gpu-kick: A = lookahead 12 window 256 (3e1334d default), B = lookahead 12 window 128, C = lookahead 4 window 256 (session 5 default); per-block once for the CPU ratio
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run28.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
date -u > $R/machine.txt; nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv >> $R/machine.txt; nproc >> $R/machine.txt; uname -r >> $R/machine.txt; lscpu >> $R/machine.txt
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 200 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E 'GPU window' $R/$n.txt; python3 -c "
import json
for l in open('$R/$n.json'):
  r=json.loads(l); pr=r['per_round']; print('  %-10s cpu %.4f first %.2f ms  x ceil %s  x sum %s  GB/s %s'%(r['path'][:10], r['cpu_s_per_gib'], r['first_layer_ms'], [round(x,3) for x in pr['ceiling_fraction_rounds']], [round(x,3) for x in pr.get('ceiling_sum_fraction_rounds',[])], [round(x/1e9,2) for x in pr['bytes_per_s_rounds']]))
"; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb A1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick
gb B1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick --window 128 --reuse
gb C1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick --lookahead 4 --reuse
gb A2 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick --reuse
gb B2 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick --window 128 --reuse
gb C2 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick --lookahead 4 --reuse
gb P --model llama3-70b --devices $devs --label "$E" --paths per-block --reuse --rounds 1
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
