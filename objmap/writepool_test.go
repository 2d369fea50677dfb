package objmap

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// unwrittenExtents counts the extents of the file at path that the file
// system reports unwritten (FIEMAP_EXTENT_UNWRITTEN: preallocated, never
// written); ok false where it cannot say (FIEMAP unsupported).
func unwrittenExtents(t *testing.T, path string) (n int, ok bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const extents, extentBytes, unwritten, fsIOCFiemap = 64, 56, 0x800, 0xC020660B
	type fiemap struct {
		Start, Length                               uint64
		Flags, MappedExtents, ExtentCount, Reserved uint32
		Extents                                     [extents * extentBytes]byte
	}
	var fm fiemap
	fm.Length, fm.ExtentCount = ^uint64(0), extents
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIOCFiemap, uintptr(unsafe.Pointer(&fm))); e != 0 {
		if errors.Is(e, unix.EOPNOTSUPP) || errors.Is(e, unix.ENOTTY) {
			return 0, false
		}
		t.Fatalf("FIEMAP %s: %v", path, e)
	}
	for i := 0; i < int(fm.MappedExtents); i++ {
		flags := *(*uint32)(unsafe.Pointer(&fm.Extents[i*extentBytes+40]))
		if flags&unwritten != 0 {
			n++
		}
	}
	return n, fm.MappedExtents > 0
}

// WritePool leaves no unwritten extent in the pool files (a fresh store's
// first saves overwrite written blocks); without it, fallocate leaves them
// unwritten, which is what the option is for. Buffered (tmpfs's way) writes
// too. Skipped where the file system does not report extents.
func TestWritePool(t *testing.T) {
	for _, tc := range []struct {
		name            string
		write, buffered bool
		wantUnwritten   bool
	}{{"fallocate only", false, false, true}, {"written", true, false, false}, {"written buffered", true, true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOpts(t, filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b"))
			o.CapacityBytes, o.WritePool, o.Buffered = 24<<20, tc.write, tc.buffered
			m := mustOpen(t, o)
			defer m.Close()
			for _, d := range o.Dirs {
				p := filepath.Join(d, poolFileName(0))
				if _, err := os.Stat(p); err != nil {
					p = filepath.Join(d, poolFileName(1))
				}
				st, err := os.Stat(p)
				if err != nil || st.Size() != 12<<20 {
					t.Fatalf("pool file in %s: %v, size %v", d, err, st)
				}
				n, ok := unwrittenExtents(t, p)
				if !ok {
					t.Skipf("the file system under %s does not report extents (FIEMAP)", d)
				}
				if (n > 0) != tc.wantUnwritten {
					t.Fatalf("%s: %d unwritten extents", p, n)
				}
			}
		})
	}
}
