#!/usr/bin/env bash
# run 7 (x2): GPU topology; kernels/runtime/tp GPU tests; gpubench single GPU with and
# without ExactWakeTarget; gpubench --gpus 2 on ext4 over 4 loops and on the real disk
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/res; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run7.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
(nvidia-smi -L; nvidia-smi topo -m; nproc; uname -r) > $R/topo.txt 2>&1; head -12 $R/topo.txt
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
(cd kernels && timeout 200 ../bin/gpu/kernels.test -test.v -test.count=1 -test.run .) > $R/gotest.log 2>&1; echo "kernels.test rc=$? pass $(grep -cE '^--- PASS' $R/gotest.log)"; grep -E '^(--- FAIL|--- SKIP|FAIL|panic)' $R/gotest.log | head; el
(cd runtime && timeout 120 ../bin/gpu/runtime.test -test.v -test.count=1 -test.run GPU) > $R/rt.log 2>&1; echo "runtime.test GPU rc=$?"; grep -E '^(--- |FAIL|panic)' $R/rt.log | head; el
(cd runtime/tp && timeout 120 ../../bin/gpu/tp.test -test.v -test.count=1 -test.run GPU) > $R/tp.log 2>&1; echo "tp.test GPU rc=$?"; grep -E '^(--- |FAIL|panic)|device' $R/tp.log | head; el
L=(); for i in 0 1 2 3; do truncate -s 4G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done; devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 150 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E 'ceiling|GB/s|tutti-tp|ranks' $R/$n.txt | head -10; el; }
E="emulated storage (4 RAM-backed loop devices)"
gb g1 --model llama3-70b --devices $devs --label "$E" --paths gpu-kick,uring,per-block
gb g1x --model llama3-70b --devices $devs --label "$E, exact wake target" --kick-exact-target --no-ceiling --reuse --paths gpu-kick
gb g1s --model llama3-70b --devices $devs --label "$E, 2048 tokens" --tokens 2048 --no-ceiling --paths gpu-kick,uring
gb g1sx --model llama3-70b --devices $devs --label "$E, 2048 tokens, exact wake target" --tokens 2048 --kick-exact-target --no-ceiling --reuse --paths gpu-kick
gb g2 --model deepseek-v3 --devices $devs --label "$E" --paths gpu-kick,uring,per-block
gb g2x --model deepseek-v3 --devices $devs --label "$E, exact wake target" --kick-exact-target --no-ceiling --reuse --paths gpu-kick
M=(); for i in 0 1 2 3; do mkfs.ext4 -q -F ${L[$i]} && mkdir -p /mnt/l$i && mount ${L[$i]} /mnt/l$i && M+=(/mnt/l$i); done; mdirs=$(IFS=,; echo "${M[*]}"); echo "mounted $mdirs"
gb t1 --gpus 2 --model llama3-70b --dir $mdirs
gb t1x --gpus 2 --model llama3-70b --dir $mdirs --kick-exact-target
gb t2 --gpus 2 --model deepseek-v3 --dir $mdirs
for m in "${M[@]}"; do umount $m; done; for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
mkdir -p /var/tmp/tk
gb d1 --model llama3-70b --dir /var/tmp/tk --label "real disk (virtio)" --paths gpu-kick,uring
gb d1x --model llama3-70b --dir /var/tmp/tk --label "real disk (virtio), exact wake target" --kick-exact-target --no-ceiling --reuse --paths gpu-kick
rm -rf /var/tmp/tk/*
gb t3 --gpus 2 --model llama3-70b --dir /var/tmp/tk
rm -rf /var/tmp/tk
el
