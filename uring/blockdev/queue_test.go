package blockdev

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseQueueDepth(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"128\n", 128, true}, {"64", 64, true}, {"0\n", 0, false}, {"-3", 0, false},
		{"", 0, false}, {"12a", 0, false}, {"99999999999", 0, false},
	} {
		got, err := parseQueueDepth([]byte(c.in))
		if got != c.want || (err == nil) != c.ok {
			t.Errorf("parseQueueDepth(%q) = %d, %v", c.in, got, err)
		}
	}
}

func FuzzParseQueueDepth(f *testing.F) {
	f.Add([]byte("128\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := parseQueueDepth(b); (err == nil) != (n > 0) {
			t.Fatalf("parseQueueDepth(%q) = %d, %v", b, n, err)
		}
	})
}

// TestQueueDepthOfTempDir: the disk under the test's temporary directory
// has a request depth, or the directory is not on a block device (tmpfs),
// which is said so.
func TestQueueDepthOfTempDir(t *testing.T) {
	n, err := QueueDepth(t.TempDir())
	if errors.Is(err, ErrNoBlockDevice) {
		t.Skipf("temporary directory not on a block device: %v", err)
	}
	if err != nil || n <= 0 {
		t.Fatalf("QueueDepth = %d, %v", n, err)
	}
	t.Logf("nr_requests %d", n)
	// A block device node is looked up by the device it is (st_rdev), not by
	// the device its node lives on (devtmpfs).
	for _, dev := range []string{"/dev/loop0", "/dev/vda", "/dev/nvme0n1", "/dev/sda"} {
		var st unix.Stat_t
		if unix.Stat(dev, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
			continue
		}
		n, err := QueueDepth(dev)
		if err != nil || n <= 0 {
			t.Errorf("QueueDepth(%s) = %d, %v", dev, n, err)
		}
		m, err := MaxReadBytes(dev)
		if err != nil || m < 4096 || m > 4<<20 || m&(m-1) != 0 {
			t.Errorf("MaxReadBytes(%s) = %d, %v", dev, m, err)
		}
		t.Logf("%s: nr_requests %d, largest read %d", dev, n, m)
	}
	if _, err := QueueDepth("/nonexistent/x"); err == nil {
		t.Fatal("no error for a missing path")
	}
}
