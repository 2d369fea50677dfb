#!/usr/bin/env bash
# run 34 (exploration, not a done-when run): does the kick loop's wake batch explain 70B's gap to (a)? 70B on 4 loops, gpu-kick and (a) in each call (paired), kick batch 32 (default) / 16 / 8, 4 rounds each. Results in $OUT/run34.tgz.
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run34.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
date -u > $R/machine.txt; nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv >> $R/machine.txt; nproc >> $R/machine.txt; uname -r >> $R/machine.txt
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
L=(); for i in 0 1 2 3; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 150 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; echo "  rounds with io-wq workers: $(grep -E '^  gpu-driven' $R/$n.txt | grep -c iou-wrk) of $(grep -cE '^  gpu-driven' $R/$n.txt)"; python3 -c "
import json
rs=[json.loads(l) for l in open('$R/$n.json')]
for r in rs:
  pr=r['per_round']; print('  %-10s cpu %.4f first %.2f ms  x ceil %.3f %s  GB/s %s'%(r['path'][:10], r['cpu_s_per_gib'], r['first_layer_ms'], r['ceiling_fraction'], [round(x,3) for x in pr['ceiling_fraction_rounds']], [round(x/1e9,2) for x in pr['bytes_per_s_rounds']]))
g,a=rs[0]['per_round']['bytes_per_s_rounds'],rs[1]['per_round']['bytes_per_s_rounds']
print('  GPU/(a) per round', [round(x/y,3) for x,y in zip(g,a)])
"; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb k32 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring --rounds 4
gb k16 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring --rounds 4 --kick-batch 16 --reuse
gb k8 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring --rounds 4 --kick-batch 8 --reuse
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
