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

# The limit that makes a loop device hold still: without one, a loop's rate
# is whatever the host's copies reach at that moment (striped ceilings of 8
# loops sampled 19-31 GB/s in one call) and its copies compete with the
# product's own CPU work. Limiters (scripts/emuprobe.sh, emuleak.sh;
# BENCHMARKS.md, Emulated storage):
#   iomax   blk-throttle (cgroup v2 io.max), the default where /dev/fuse is
#           missing: the product's own saves and restores
#           (gpubench store rows) run at the limit and 1-2 GiB samples hold
#           within 1%; but one or two throttle slices (20 ms each) of the
#           rate pass at once after an idle spell, so a short transfer (a
#           512 MiB ceiling sample, a docqa restore) reads above it;
#   iocost  a fixed linear model, vrate pinned at 100%: devbench's samples
#           hold, long and short, but gpubench's product rows drop to about
#           0.2 of the limit while the GPU path's restores pass at up to 1.4x;
#   both    as iocost for gpubench's rows;
#   emudev  the default: the loops go over RAM-backed FUSE files that
#           `tutti emudev` (eval/emudev) paces as devices of an exact rate,
#           first come first served, no burst after idle: whatever the
#           pattern, one rate (dev VM: ceilings at the limit, store-cpu's rows
#           0.95-0.998 of them); its cost is a second copy of every byte on
#           the host's CPUs (about 0.7 CPU s a GB there);
#   none    the host's copies set the rate.
# io.max needs a cgroup other than the root: the calling shell ($$) and
# everything it starts later move into /sys/fs/cgroup/tutti-emu until
# emu_unlimit.
#
# EMU_LIMITER picks one (every run's label names it). EMU_RATE_BPS: every loop's read and write rate in
# bytes/s under a limiter (default 1500000000, a PCIe Gen4 NVMe drive's
# order: 12 GB/s over 8 loops, 6 over 4). EMU_TUTTI: the CLI for emudev
# (default bin/gpu/tutti, else bin/tutti).
EMU_LIMITER=${EMU_LIMITER:-$([ -c /dev/fuse ] && echo emudev || echo iomax)}
EMU_RATE_BPS=${EMU_RATE_BPS:-1500000000}
EMU_CGROUP=/sys/fs/cgroup/tutti-emu
EMU_FROM=/tmp/tutti-emu.from # the cgroup the shell came from
EMU_DEV=/tmp/tutti-emudev     # emudev's mounts, pid and log
EMU_TUTTI=${EMU_TUTTI:-$([ -x bin/gpu/tutti ] && echo bin/gpu/tutti || echo bin/tutti)}

# emu_devices FILE...: what the loop devices go over, one path a line, in
# FILE's order: the backing files themselves, or under EMU_LIMITER=emudev
# the files `tutti emudev` serves over them (started here, in the
# background; emu_devices_stop ends it once the loops are detached). One
# emulator per EMU_DEV directory: set EMU_DEV to run several.
emu_devices() {
	if [ "$EMU_LIMITER" != emudev ]; then
		printf '%s\n' "$@"
		return 0
	fi
	local files i
	files=$(IFS=,; echo "$*")
	emu_devices_stop
	emu_devices_unmount
	mkdir -p "$EMU_DEV/mnt" || return 1
	# its own session: a device call's leftover processes are ended when it
	# returns, and kept loops (eval/vllm/run.sh) need it after
	setsid "$EMU_TUTTI" emudev --backing "$files" --mount "$EMU_DEV/mnt" --read-bytes-per-sec "$EMU_RATE_BPS" \
		--write-bytes-per-sec "$EMU_RATE_BPS" >"$EMU_DEV/log" 2>&1 </dev/null &
	echo $! >"$EMU_DEV/pid"
	for ((i = 0; i < 300; i++)); do
		grep -q '"op":"ready"' "$EMU_DEV/log" 2>/dev/null && break
		emu_devices_alive || break
		sleep 0.1
	done
	if ! grep -q '"op":"ready"' "$EMU_DEV/log" 2>/dev/null; then
		echo "emudev did not start: $(tail -3 "$EMU_DEV/log" 2>/dev/null | tr '\n' ' ')" >&2
		return 1
	fi
	grep '"op":"ready"' "$EMU_DEV/log" | head -1 | grep -o '"paths":\[[^]]*\]' | grep -o '"/[^"]*"' | tr -d '"'
}

# emu_loops FILE...: a loop device with direct I/O over what emu_devices
# serves for each FILE (backing files written whole), one path a line in
# FILE's order; on an error it says what failed on stderr and stops short
# (callers compare the count). emudev's loops are read once before they are
# handed out: the emulator's stack (FUSE readers, its runtime's threads and
# heap) grows on its first parallel load, and the first reads after setup
# ran slower than every later pass.
emu_loops() {
	local f l devs=() loops=()
	mapfile -t devs < <(emu_devices "$@")
	if [ ${#devs[@]} != $# ]; then
		echo "emulated devices ($EMU_LIMITER): ${#devs[@]} of $#" >&2
		return 1
	fi
	for f in "${devs[@]}"; do
		l=$(losetup --find --show --direct-io=on "$f") || break
		loops+=("$l")
	done
	if [ ${#loops[@]} = $# ] && [ "$EMU_LIMITER" = emudev ]; then
		"$EMU_TUTTI" devbench --striped --path "$(IFS=,; echo "${loops[*]}")" --size 256MiB --buffer 256MiB \
			--ops randread --allow-holes >/dev/null 2>&1 || echo "emulated devices: the warm-up read failed" >&2
	fi
	[ ${#loops[@]} = 0 ] || printf '%s\n' "${loops[@]}"
	[ ${#loops[@]} = $# ]
}

# emu_devices_alive: true while EMU_DEV's emudev runs (a zombie is not
# running: an unreaped one still answers kill -0).
emu_devices_alive() {
	local p
	p=$(cat "$EMU_DEV/pid" 2>/dev/null) || return 1
	[ -n "$p" ] && grep -q '^State:[[:space:]]*[RSD]' "/proc/$p/status" 2>/dev/null
}

# emu_devices_unmount: lazily unmounts what an emudev of EMU_DEV left
# mounted (one killed, not stopped: its mounts answer ENOTCONN).
emu_devices_unmount() {
	local m
	for m in "$EMU_DEV"/mnt/*; do umount -l "$m" 2>/dev/null; done
	return 0
}

# emu_devices_stop: ends a running `tutti emudev` (after the loop devices
# over its files are detached) and prints its per-device counters' line.
emu_devices_stop() {
	local pid i
	[ -f "$EMU_DEV/pid" ] || return 0
	pid=$(cat "$EMU_DEV/pid")
	rm -f "$EMU_DEV/pid"
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 300; i++)); do grep -q '^State:[[:space:]]*[RSD]' "/proc/$pid/status" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null
	grep '"op":"stats"' "$EMU_DEV/log" 2>/dev/null | cut -c1-400
	return 0
}

# emu_limit DEV...: EMU_LIMITER's limit on every DEV (a loop device);
# prints what it set, or why it could not and returns 1.
emu_limit() {
	local d n rc=0
	case $EMU_LIMITER in
	none)
		echo "emulated storage: no rate limit (EMU_LIMITER=none): rates follow the host's copies"
		return 0
		;;
	emudev)
		if emu_devices_alive; then
			echo "emulated storage: $EMU_RATE_BPS B/s read and write on each of $# loop devices (emudev: paced FUSE files)"
			return 0
		fi
		echo "emulated storage: EMU_LIMITER=emudev but no tutti emudev runs (emu_devices starts it): rates unknown"
		return 1
		;;
	iocost | iomax | both) ;;
	*)
		echo "emulated storage: EMU_LIMITER=$EMU_LIMITER: want none, iocost, iomax, both or emudev"
		return 1
		;;
	esac
	if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" != cgroup2fs ]; then
		echo "emulated storage: rate limit REFUSED: /sys/fs/cgroup is not cgroup v2 here: rates follow the host's copies"
		return 1
	fi
	if [ "$EMU_LIMITER" != iocost ]; then
		[ -f "$EMU_FROM" ] || sed -n 's/^0:://p' "/proc/$$/cgroup" >"$EMU_FROM" 2>/dev/null
		mkdir -p "$EMU_CGROUP" && echo $$ >"$EMU_CGROUP/cgroup.procs" || rc=1
	fi
	for d in "$@"; do
		n=$(cat "/sys/block/${d#/dev/}/dev") || { rc=1; continue; }
		if [ "$EMU_LIMITER" != iomax ]; then
			echo "$n ctrl=user model=linear rbps=$EMU_RATE_BPS rseqiops=2000000 rrandiops=2000000 wbps=$EMU_RATE_BPS wseqiops=2000000 wrandiops=2000000" \
				2>/dev/null >/sys/fs/cgroup/io.cost.model &&
				echo "$n enable=1 ctrl=user rpct=0 rlat=0 wpct=0 wlat=0 min=100 max=100" 2>/dev/null >/sys/fs/cgroup/io.cost.qos || rc=1
			grep -q "^$n enable=1 " /sys/fs/cgroup/io.cost.qos 2>/dev/null || rc=1
		fi
		if [ "$EMU_LIMITER" != iocost ]; then
			echo "$n rbps=$EMU_RATE_BPS wbps=$EMU_RATE_BPS" 2>/dev/null >"$EMU_CGROUP/io.max" || rc=1
			grep -q "^$n rbps=$EMU_RATE_BPS wbps=$EMU_RATE_BPS" "$EMU_CGROUP/io.max" 2>/dev/null || rc=1
		fi
	done
	if [ $rc = 0 ]; then
		echo "emulated storage: $EMU_RATE_BPS B/s read and write on each of $# loop devices ($EMU_LIMITER)"
	else
		echo "emulated storage: rate limit ($EMU_LIMITER) REFUSED on some of $*: rates follow the host's copies"
	fi
	return $rc
}

# emu_unlimit DEV...: takes the limits off (before the loops are detached)
# and moves the calling shell back to the cgroup it came from.
emu_unlimit() {
	local d n from
	for d in "$@"; do
		n=$(cat "/sys/block/${d#/dev/}/dev" 2>/dev/null) || continue
		echo "$n enable=0" 2>/dev/null >/sys/fs/cgroup/io.cost.qos
		echo "$n rbps=max wbps=max" 2>/dev/null >"$EMU_CGROUP/io.max"
	done
	if [ -f "$EMU_FROM" ]; then
		from=$(cat "$EMU_FROM")
		echo $$ >"/sys/fs/cgroup$from/cgroup.procs" 2>/dev/null
		rm -f "$EMU_FROM"
	fi
	rmdir "$EMU_CGROUP" 2>/dev/null
	return 0
}

# emu_steady TUTTI SAMPLES SIZE DEV...: the striped read and write ceilings
# of the DEVs (`tutti devbench --striped`, SIZE a device a sample) sampled
# SAMPLES times each (EMU_STEADY_GAP_S: seconds idle after each), one line a sample, then one line each of min, max and
# max/min. Writes overwrite the devices: call it before mkfs. Returns 1 when
# either max/min is above 1.03 (the devices do not hold still).
emu_steady() {
	local t=$1 n=$2 size=$3 op i v vals rc=0 paths
	shift 3
	paths=$(IFS=,; echo "$*")
	for op in randread seqwrite; do
		vals=()
		for ((i = 0; i < n; i++)); do
			v=$(timeout 60 "$t" devbench --striped --path "$paths" --size "$size" --buffer 256MiB --ops "$op" --allow-holes 2>&1 |
				sed -nE 's/^striped (read|write) ceiling ([0-9.]+) MB\/s.*/\2/p' | head -1)
			echo "emulated storage $# loops $op #$i: ${v:-failed} MB/s"
			[ -n "${EMU_STEADY_GAP_S:-}" ] && sleep "$EMU_STEADY_GAP_S"
			[ -n "$v" ] && vals+=("$v")
		done
		printf '%s\n' "${vals[@]}" | awk -v op="$op" -v want="$n" -v d=$# '
			NR == 1 { lo = $1; hi = $1 } { if ($1 < lo) lo = $1; if ($1 > hi) hi = $1 }
			END { if (NR < want || lo <= 0) { printf "emulated storage %d loops %s: %d of %d samples\n", d, op, NR, want; exit 1 }
				r = hi / lo; printf "emulated storage %d loops %s ceiling: min %.0f max %.0f MB/s, max/min %.3f (%s)\n", d, op, lo, hi, r, r <= 1.03 ? "steady" : "NOT steady: above 1.03"
				exit r <= 1.03 ? 0 : 1 }' || rc=1
	done
	return $rc
}
