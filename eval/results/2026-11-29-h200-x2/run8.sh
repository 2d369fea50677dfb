#!/usr/bin/env bash
# run 8 (x2): gpubench --gpus 2 over 8 loops (storage above one GPU path);
# the replay floor: tutti-gpu sized to the devices, with and without the exact wake target
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/res; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run8.tgz -C /tmp res' EXIT
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
L=(); for i in 0 1 2 3 4 5 6 7; do truncate -s 3G /dev/shm/l$i; L+=($(losetup --find --show --direct-io=on /dev/shm/l$i)); done; devs=$(IFS=,; echo "${L[*]}")
gb() { local n=$1; shift; timeout 150 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E 'ceiling|GB/s|tutti-tp|ranks' $R/$n.txt | head -10; el; }
gb g8 --model llama3-70b --devices $devs --label "emulated storage (8 RAM-backed loop devices)" --paths gpu-kick,uring
M=(); for i in 0 1 2 3 4 5 6 7; do mkfs.ext4 -q -F -m 0 ${L[$i]} && mkdir -p /mnt/l$i && mount ${L[$i]} /mnt/l$i && M+=(/mnt/l$i); done; mdirs=$(IFS=,; echo "${M[*]}"); echo "mounted $mdirs"
gb t8 --gpus 2 --model llama3-70b --dir $mdirs --kick-exact-target
gb t8m --gpus 2 --model deepseek-v3 --dir $mdirs --kick-exact-target
for m in "${M[@]}"; do umount $m; done; for d in "${L[@]}"; do losetup -d $d; done; rm -f /dev/shm/l*
T=out/trace/conversation_trace.jsonl
for v in base exact; do
  A="--tutti-save-bound-ms 60000"; [ $v = exact ] && A="$A --tutti-gpu-exact-wake-target"
  mkdir -p $R/e-$v
  (OUT=$R/e-$v STORAGES=emulated MODELS=llama3-70b BACKENDS=tutti-gpu,per-block MAX_RUN_S=150 BUDGET_S=170 \
    WINDOW_llama3_70b="--trace $T --from-ms 2927999 --requests 3" REPLAY_ARGS="$A" bash eval/device-run.sh) > $R/e-$v.txt 2>&1
  echo "eval $v rc=$?"; grep -E 'tutti-gpu|per-block|note|batch' $R/e-$v.txt | tail -8; el
done
