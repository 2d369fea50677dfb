# Sourced by the device scripts: the one home of how a RAM-backed loop
# device (emulated fast storage) gets its backing file.
#
# emu_backing FILE SIZE: FILE of SIZE (truncate's suffixes) with every page
# written now. A tmpfs page costs at its first write what no SSD does: a
# sparse file allocates and zeroes it then, and a fallocated one still has
# its pages marked not up to date until written. Dev VM, 2026-12-02, one
# loop with ext4: a fresh store's first 1 GiB store-cpu save took 2.29 s on
# a fallocated backing file and 0.30 s on a written one (its save-again
# 0.31 and 0.21 s). On the GPU machine the first backend of a replay paid
# it: tutti-gpu's saves took 10.2 s running first and 4.2 s running last
# (tutti-cpu 5.9 and 4.8), and gpubench's first saves ran at 0.33-0.6 of
# the write ceiling where save-again ran at 0.9-1.1.
emu_backing() {
	local bytes
	bytes=$(numfmt --from=iec "$2") || return 1
	truncate -s "$2" "$1" && fallocate -l "$2" "$1" &&
		dd if=/dev/zero of="$1" bs=16M count=$(((bytes + (16 << 20) - 1) / (16 << 20))) conv=notrunc status=none
}

# emu_backing_many SIZE FILE...: emu_backing for every FILE at once (the
# writes are memory copies: one core each).
emu_backing_many() {
	local size=$1 f rc=0 pids=()
	shift
	for f in "$@"; do
		emu_backing "$f" "$size" &
		pids+=($!)
	done
	for f in "${pids[@]}"; do wait "$f" || rc=1; done
	return $rc
}
