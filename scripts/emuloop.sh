# Sourced by the device scripts: the one home of how a RAM-backed loop
# device (emulated fast storage) gets its backing file.
#
# emu_backing FILE SIZE: FILE of SIZE (truncate's suffixes) with every page
# allocated now. A sparse tmpfs file allocates (and zeroes) a page at its
# first write, which no SSD does: on a fresh sparse loop the first 4 GiB
# save ran at 0.23 of the write ceiling and the same save again at 0.61
# (dev VM, 4 loops); with the pages allocated first, 0.51 and 0.52.
emu_backing() {
	truncate -s "$2" "$1" && fallocate -l "$2" "$1"
}
