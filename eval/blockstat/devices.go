package blockstat

import "github.com/tutti-io/tutti/uring/blockdev"

// The block-device facts live in uring/blockdev (the runtime sizes its
// reads with them, through blockdev.QueueDepth and MaxReadBytes); these
// names keep blockstat's callers as they were.

// Dev is a block device number (as /proc/diskstats and stat(2) give it).
type Dev = blockdev.Dev

// ErrNoBlockDevice is returned when a path is not on a block device (tmpfs,
// overlay, network file systems).
var ErrNoBlockDevice = blockdev.ErrNoBlockDevice

// DiskOf is blockdev.DiskOf: the whole disk under path.
func DiskOf(path string) (Dev, error) { return blockdev.DiskOf(path) }
