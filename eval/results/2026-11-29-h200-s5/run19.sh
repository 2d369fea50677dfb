#!/usr/bin/env bash
# run 19 (diagnostic): do host-to-device copies slow the loop devices down? ioexp (one ring over 4 loops,
# the GPU path's read pattern, no GPU) alone and next to paced H2D copies from pinned memory
set -u
R=/tmp/res; rm -rf $R; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run19.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
nvcc -O2 -o /tmp/h2d .dev/h2d/h2d.cu > $R/nvcc.log 2>&1 || { echo NVCC FAILED; cat $R/nvcc.log; exit 1; }
L=(); for i in 0 1 2 3; do truncate -s 1G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
for d in "${L[@]}"; do dd if=/dev/zero of=$d bs=1M count=1024 oflag=direct status=none & done; wait
devs=$(IFS=,; echo "${L[*]}"); el
X="bin/gpu/ioexp --devs $devs --window 128 --span 227 --size 1024 --secs 3"
/tmp/h2d 0 2; /tmp/h2d 15 2
for rep in 1 2 3; do
  echo "-- rep $rep"; $X
  /tmp/h2d 15 3.5 & sleep 0.3; $X | sed 's/^/  with H2D 15 GB\/s: /'; wait
  /tmp/h2d 0 3.5 & sleep 0.3; $X | sed 's/^/  with H2D max: /'; wait
done 2>&1 | tee $R/exp.txt
for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*; el
