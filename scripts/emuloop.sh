# Sourced by the device scripts: the one home of how a RAM-backed loop
# device (emulated fast storage) gets its backing file.
#
# emu_backing FILE SIZE: FILE of SIZE (truncate's suffixes) with every page
# written now. A tmpfs page costs at its first write what no SSD does: a
# sparse file allocates and zeroes it then, and a fallocated one is still
# not up to date until written, so whichever backend or store wrote first
# would pay it (BENCHMARKS.md, What the defaults rest on). fallocate
# first fails at once where /dev/shm lacks the room.
emu_backing() {
	local bytes
	bytes=$(numfmt --from=iec "$2") || return 1
	truncate -s "$2" "$1" && fallocate -l "$2" "$1" && head -c "$bytes" /dev/zero 1<>"$1"
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
