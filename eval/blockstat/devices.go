package blockstat

import "github.com/tutti-io/tutti/uring/blockdev"

// The block-device facts live in uring/blockdev (the runtime sizes its
// reads with them); these names keep blockstat's callers as they were.

// Dev is a block device number (as /proc/diskstats and stat(2) give it).
type Dev = blockdev.Dev

// ErrNoBlockDevice is returned when a path is not on a block device (tmpfs,
// overlay, network file systems).
var ErrNoBlockDevice = blockdev.ErrNoBlockDevice

// DiskOf is blockdev.DiskOf: the whole disk under path.
func DiskOf(path string) (Dev, error) { return blockdev.DiskOf(path) }

// QueueDepth is blockdev.QueueDepth: the request depth (nr_requests) of the
// disk serving path.
func QueueDepth(path string) (int, error) { return blockdev.QueueDepth(path) }

// MaxReadBytes is blockdev.MaxReadBytes: the largest read the disk serving
// path takes unsplit.
func MaxReadBytes(path string) (int, error) { return blockdev.MaxReadBytes(path) }
