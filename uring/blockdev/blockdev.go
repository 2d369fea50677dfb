// Package blockdev says what a block device takes: the whole disk under a
// path (DiskOf: a partition maps to its disk), its request queue depth
// (QueueDepth: queue/nr_requests) and the largest read it takes unsplit
// (MaxReadBytes: queue/max_sectors_kb). It reads sysfs and stat(2) only;
// nothing is cached, every call reads the files again.
//
// Callers size their I/O with these facts: a read that finds no free
// request tag, or that the block layer must split, is not issued inline by
// io_uring but handed to an io-wq worker thread (runtime's GPU path, tutti
// gpubench and replay). eval/blockstat counts device bytes on the same Dev.
package blockdev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Dev is a block device number (as /proc/diskstats and stat(2) give it).
type Dev struct{ Major, Minor uint32 }

func (d Dev) String() string { return fmt.Sprintf("%d:%d", d.Major, d.Minor) }

// ErrNoBlockDevice is returned when a path is not on a block device (tmpfs,
// overlay, network file systems). Its text predates this package (it moved
// from eval/blockstat) and is kept.
var ErrNoBlockDevice = errors.New("blockstat: path is not on a block device")

// DiskOf returns the whole disk under path: the device of its file system,
// with a partition mapped to its parent disk (the block tracepoints report
// the disk, and diskstats counts partition I/O in the disk's line too).
func DiskOf(path string) (Dev, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Dev{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return wholeDisk(path, Dev{Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev)})
}

// wholeDisk maps block device d (found for path) to its disk: d itself, or
// the parent disk of a partition.
func wholeDisk(path string, d Dev) (Dev, error) {
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", d.Major, d.Minor)
	if _, err := os.Stat(sys); err != nil {
		return Dev{}, fmt.Errorf("%s (device %s): %w", path, d, ErrNoBlockDevice)
	}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		b, err := os.ReadFile(filepath.Join(sys, "..", "dev"))
		if err != nil {
			return Dev{}, fmt.Errorf("parent disk of partition %s: %w", d, err)
		}
		var maj, mnr uint32
		if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &maj, &mnr); err != nil {
			return Dev{}, fmt.Errorf("parent disk of partition %s: %q: %w", d, b, err)
		}
		d = Dev{Major: maj, Minor: mnr}
	}
	return d, nil
}
