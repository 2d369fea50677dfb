#!/usr/bin/env bash
# run 11: real disk, copy-engine staging vs zero copy, interleaved (virtio variance)
set -u
R=/tmp/res; mkdir -p $R; ROOT=$PWD
trap 'tar czf $OUT/run11.tgz -C /tmp res' EXIT
make -C kernels NVCC=nvcc > $R/build.log 2>&1 || { echo BUILD FAILED; tail -40 $R/build.log; exit 1; }
export TUTTI_KERNELS_LIB=$ROOT/kernels/build/libtutti_kernels.so
mkdir -p /var/tmp/tk
gb() { local n=$1; shift; timeout 100 bin/gpu/tutti gpubench --json $R/$n.json "$@" > $R/$n.txt 2>&1; echo "gpubench $n rc=$?"; grep -E 'ceiling \(|GB/s' $R/$n.txt | cut -c1-150 | head -4; }
gb d1 --model llama3-70b --dir /var/tmp/tk --label "real disk (virtio)" --paths gpu-kick,uring
gb d1z --model llama3-70b --dir /var/tmp/tk --label "real disk (virtio), zero-copy scatter" --zero-copy-scatter --reuse --paths gpu-kick
gb d1b --model llama3-70b --dir /var/tmp/tk --label "real disk (virtio), again" --reuse --paths gpu-kick,uring
