#!/usr/bin/env bash
# run 9 (x2): the feeder (ABI 2) and the exact wake target by default: GPU tests, gpubench
# (4 loops, disk), --gpus 2 over 8 loops, the warm eval on emulated storage, every backend
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/res; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run9.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
(cd kernels && timeout 200 ../bin/gpu/kernels.test -test.v -test.count=1 -test.run .) > $R/gotest.log 2>&1; echo "kernels.test rc=$? pass $(grep -cE '^\s*--- PASS' $R/gotest.log)"; grep -E '^\s*--- (FAIL|SKIP)|^FAIL|panic' $R/gotest.log | head; el
(cd runtime && timeout 120 ../bin/gpu/runtime.test -test.v -test.count=1 -test.run GPU) > $R/rt.log 2>&1; echo "runtime.test GPU rc=$?"; grep -E '^(--- |FAIL|panic)' $R/rt.log | head -4
(cd runtime/tp && timeout 120 ../../bin/gpu/tp.test -test.v -test.count=1 -test.run GPU) > $R/tp.log 2>&1; echo "tp.test GPU rc=$?"; grep -E '^(--- |FAIL|panic)' $R/tp.log | head -3; el
L=(); for i in 0 1 2 3 4 5 6 7; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done
devs=$(IFS=,; echo "${L[*]:0:4}")
gb() { local n=$1; shift; timeout 150 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E 'ceiling \(|GB/s|tutti-tp' $R/$n.txt | cut -c1-200 | head -8; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb g1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring,per-block
gb g1l --model llama3-70b --devices $devs --label "$E, loose wake target" --kick-exact-target=false --no-ceiling --reuse --paths gpu-kick
gb g2 --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring,per-block
M=(); for i in 0 1 2 3 4 5 6 7; do mkfs.ext4 -q -F -m 0 ${L[$i]} && mkdir -p /mnt/l$i && mount ${L[$i]} /mnt/l$i && M+=(/mnt/l$i); done; mdirs=$(IFS=,; echo "${M[*]}")
gb t8 --gpus 2 --model llama3-70b --dir $mdirs
for m in "${M[@]}"; do umount $m; done; for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
mkdir -p /var/tmp/tk
gb d1 --model llama3-70b --dir /var/tmp/tk --label "real disk (virtio)" --paths gpu-kick,uring
rm -rf /var/tmp/tk
T=out/trace/conversation_trace.jsonl
(OUT=$R/e STORAGES=emulated MAX_RUN_S=150 BUDGET_S=200 \
  WINDOW_llama3_70b="--trace $T --from-ms 2927999 --requests 3" WINDOW_deepseek_v3="--trace $T --from-ms 2187000 --requests 3" \
  REPLAY_ARGS="--tutti-save-bound-ms 60000" bash eval/device-run.sh) > $R/e.txt 2>&1
echo "eval rc=$?"; grep -E '^(tutti|per-block|cufile|pagecache|dram|recompute)' $R/e.txt | cut -c1-120; el
