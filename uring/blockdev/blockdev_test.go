package blockdev

import (
	"errors"
	"testing"
)

func TestDiskOfNotBlock(t *testing.T) {
	if _, err := DiskOf("/proc"); !errors.Is(err, ErrNoBlockDevice) {
		t.Fatalf("/proc: %v", err)
	}
	if _, err := DiskOf("/nonexistent/x"); err == nil || errors.Is(err, ErrNoBlockDevice) {
		t.Fatalf("missing path: %v", err)
	}
}

// TestDiskOfTempDir: the disk under a temporary directory is a whole disk
// (no partition file in its sysfs directory), or the directory is on no
// block device.
func TestDiskOfTempDir(t *testing.T) {
	d, err := DiskOf(t.TempDir())
	if errors.Is(err, ErrNoBlockDevice) {
		t.Skipf("temporary directory not on a block device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if again, err := wholeDisk("again", d); err != nil || again != d {
		t.Fatalf("wholeDisk(%s) = %s, %v: not a whole disk", d, again, err)
	}
	t.Logf("disk %s", d)
}
