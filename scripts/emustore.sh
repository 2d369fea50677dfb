#!/usr/bin/env bash
# The product's own rows (gpubench store-gpu, store-cpu, llama3-8b) on 8 loops under each
# limiter of scripts/emuloop.sh, ROUNDS rounds each: which limiter holds the product's
# patterns at or under the ceiling it samples. Needs bin/gpu (make gpu-pack) and nvcc.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/emustore.txt") 2>&1
. scripts/emuloop.sh
T=bin/gpu/tutti
make -C kernels NVCC=nvcc >/dev/null 2>&1; export TUTTI_KERNELS_LIB=$PWD/kernels/build/libtutti_kernels.so
FILES=(/dev/shm/es-{0..7}); L=()
emu_backing_many 3G "${FILES[@]}"
for f in "${FILES[@]}"; do L+=("$(losetup --find --show --direct-io=on "$f")"); done
M=()
for i in "${!L[@]}"; do mkfs.ext4 -q -F "${L[$i]}"; mkdir -p /mnt/es$i; mount "${L[$i]}" /mnt/es$i; M+=(/mnt/es$i); done
D=$(IFS=,; echo "${M[*]}")
for lim in ${LIMITERS:-iomax iocost}; do
	EMU_LIMITER=$lim emu_limit "${L[@]}"
	timeout 150 $T gpubench --model llama3-8b --tokens 32768 --store-dirs "$D" --rounds "${ROUNDS:-2}" --paths store-gpu,store-cpu --label "8 loops, $lim" >/tmp/es-$lim.txt 2>&1
	grep -E '^ceilings over|^  store-(gpu|cpu) ' /tmp/es-$lim.txt | sed "s/^/$lim: /" | cut -c1-160
	EMU_LIMITER=$lim emu_unlimit "${L[@]}"
done
for m in "${M[@]}"; do umount $m; done
for l in "${L[@]}"; do losetup -d $l; done; rm -f "${FILES[@]}"
