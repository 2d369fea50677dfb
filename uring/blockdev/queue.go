package blockdev

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// QueueDepth is the block layer's request depth (queue/nr_requests) of the
// disk that serves path: a block device itself, or the disk under a file or
// directory (a partition maps to its disk). Why it matters: an io_uring read
// issued without blocking (REQ_NOWAIT) that finds no free request tag is
// handed to an io-wq worker thread, so keeping the reads in flight on one
// disk under this depth keeps them on the cheap inline path.
func QueueDepth(path string) (int, error) {
	b, q, err := readQueueAttr(path, "nr_requests")
	if err != nil {
		return 0, err
	}
	n, err := parseQueueDepth(b)
	if err != nil {
		return 0, fmt.Errorf("queue depth of %s (%s): %w", path, q, err)
	}
	return n, nil
}

// MaxReadBytes is the largest read the disk serving path takes as one
// request: its queue/max_sectors_kb, rounded down to a power of two, at
// most 4 MiB. A larger read is split by the block layer, and a split read
// issued without blocking (io_uring's inline issue) goes to an io-wq worker
// instead. (With 4 KiB pages the segment limit splits sooner; uring's
// buffers of 2 MiB and more are huge pages for that reason.)
func MaxReadBytes(path string) (int, error) {
	b, q, err := readQueueAttr(path, "max_sectors_kb")
	if err != nil {
		return 0, err
	}
	kb, err := parseQueueDepth(b) // the same one-positive-number format
	if err != nil {
		return 0, fmt.Errorf("largest read of %s (%s): %w", path, q, err)
	}
	n := 4 << 20
	for n > 4096 && n > kb*1024 {
		n >>= 1
	}
	return n, nil
}

// readQueueAttr reads queue/NAME of the disk serving path: a block device
// node by the device it is (st_rdev), anything else by DiskOf; a partition's
// queue is its disk's.
func readQueueAttr(path, name string) ([]byte, string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, "", fmt.Errorf("queue %s of %s: %w", name, path, err)
	}
	var d Dev
	var err error
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		d, err = wholeDisk(path, Dev{Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)})
	} else {
		d, err = DiskOf(path)
	}
	if err != nil {
		return nil, "", fmt.Errorf("queue %s of %s: %w", name, path, err)
	}
	q := fmt.Sprintf("/sys/dev/block/%d:%d/queue/%s", d.Major, d.Minor, name)
	b, err := os.ReadFile(q)
	if err != nil {
		return nil, q, fmt.Errorf("queue %s of %s (device %s): %w", name, path, d, err)
	}
	return b, q, nil
}

// parseQueueDepth reads the one number of a queue/nr_requests file.
func parseQueueDepth(b []byte) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 || n > 1<<20 {
		return 0, fmt.Errorf("malformed nr_requests %q", b)
	}
	return n, nil
}
