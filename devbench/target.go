package devbench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/tutti-io/tutti/uring"
	"github.com/tutti-io/tutti/uring/blockdev"
	"golang.org/x/sys/unix"
)

// target is the file or device under test, opened with O_DIRECT.
type target struct {
	path      string
	file      *uring.File
	sizeBytes int64 // bytes of the target that I/O covers
	created   bool  // a test file this run wrote (removed at close unless keep)
	keep      bool
	// dev is the block device's number; zero for a file.
	dev blockdev.Dev
}

func directErr(path string, err error) error {
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("opening %s with O_DIRECT: %w (the file system does not support O_DIRECT, e.g. tmpfs: use a loop device, `losetup -f --show FILE`, or a disk-backed path)", path, err)
	}
	return err
}

// wholeMiB rounds n up to a whole number of MiB: test files are written
// and read in 1 MiB pieces.
func wholeMiB(n int64) int64 { return (n + 1<<20 - 1) / (1 << 20) * (1 << 20) }

func openTarget(ctx context.Context, path string, sizeBytes int64, writes, keep bool, seed uint64) (*target, error) {
	sizeBytes = wholeMiB(sizeBytes)
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return createTarget(ctx, path, sizeBytes, keep, seed)
	case err != nil:
		return nil, fmt.Errorf("checking %s: %w", path, err)
	case st.IsDir():
		return createTarget(ctx, filepath.Join(path, fmt.Sprintf("tutti-devbench-%d.dat", os.Getpid())), sizeBytes, keep, seed)
	case st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0:
		flags := unix.O_RDONLY | unix.O_DIRECT
		if writes {
			flags = unix.O_RDWR | unix.O_DIRECT
		}
		f, err := uring.OpenFile(path, flags, 0)
		if err != nil {
			return nil, directErr(path, err)
		}
		end, err := unix.Seek(int(f.FD), 0, io.SeekEnd)
		if err != nil || end < 1<<20 {
			f.Close()
			return nil, fmt.Errorf("block device %s: size %d (%v): need at least 1 MiB", path, end, err)
		}
		var dev blockdev.Dev
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			dev = blockdev.Dev{Major: unix.Major(sys.Rdev), Minor: unix.Minor(sys.Rdev)}
		}
		return &target{path: path, file: f, sizeBytes: end / (1 << 20) * (1 << 20), dev: dev}, nil
	case st.Mode().IsRegular():
		if st.Size() < sizeBytes {
			return nil, fmt.Errorf("%s exists with %d bytes, less than --size %d: remove it, or pass a smaller --size", path, st.Size(), sizeBytes)
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Blocks*512 < sizeBytes {
			return nil, fmt.Errorf("%s is sparse (%d of %d bytes allocated): reads of holes do not touch the device; remove it and let devbench write it", path, sys.Blocks*512, st.Size())
		}
		flags := unix.O_RDONLY | unix.O_DIRECT
		if writes {
			flags = unix.O_RDWR | unix.O_DIRECT
		}
		f, err := uring.OpenFile(path, flags, 0)
		if err != nil {
			return nil, directErr(path, err)
		}
		return &target{path: path, file: f, sizeBytes: sizeBytes}, nil
	default:
		return nil, fmt.Errorf("%s is neither a regular file, a directory nor a block device", path)
	}
}

// createTarget writes a new file of sizeBytes of pseudo-random data (real
// blocks, not sparse, not compressible) with O_DIRECT, then fsyncs it.
func createTarget(ctx context.Context, path string, sizeBytes int64, keep bool, seed uint64) (*target, error) {
	if _, err := os.Stat(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("creating test file %s: %w", path, err)
	}
	if err := checkRoom(filepath.Dir(path), sizeBytes); err != nil {
		return nil, fmt.Errorf("creating test file %s: %w", path, err)
	}
	f, err := uring.OpenFile(path, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_DIRECT, 0o644)
	if err != nil {
		os.Remove(path)
		return nil, directErr(path, err)
	}
	t := &target{path: path, file: f, sizeBytes: sizeBytes, created: true, keep: keep}
	if err := t.fill(ctx, seed); err != nil {
		t.keep = false
		t.close()
		return nil, fmt.Errorf("writing test file %s: %w", path, err)
	}
	return t, nil
}

// ErrNoRoom is a test file larger than the free space of its file system:
// refused before anything is written (a write until the disk is full would
// fill it for every other user).
var ErrNoRoom = errors.New("larger than the free space")

// checkRoom fails with ErrNoRoom when sizeBytes exceeds what dir's file
// system has available to unprivileged users (statfs), naming both.
func checkRoom(dir string, sizeBytes int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("free space of %s: %w", dir, err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if sizeBytes > free {
		return fmt.Errorf("%w: %d bytes (%d MiB) wanted, %d bytes (%d MiB) free in %s", ErrNoRoom,
			sizeBytes, sizeBytes>>20, free, free>>20, dir)
	}
	return nil
}

func (t *target) fill(ctx context.Context, seed uint64) error {
	const chunk = 1 << 20
	buf, err := uring.AllocBuffer(chunk)
	if err != nil {
		return err
	}
	defer buf.Free()
	x := seed*0x9e3779b97f4a7c15 | 1
	b := buf.Bytes()
	for off := int64(0); off < t.sizeBytes; off += chunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		for i := 0; i < chunk; i += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			binary.LittleEndian.PutUint64(b[i:], x)
		}
		n, err := uring.Pwrite(t.file, buf.Addr(), chunk, uint64(off))
		if err != nil {
			return err
		}
		if n != chunk {
			return fmt.Errorf("short write at %d: %d bytes", off, n)
		}
	}
	return unix.Fsync(int(t.file.FD))
}

func (t *target) close() error {
	err := t.file.Close()
	if t.created && !t.keep {
		if rerr := os.Remove(t.path); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

// checkReads is what both Run and the ceilings check of an opened target
// before reading it: its first t.sizeBytes written (checkWritten; unless
// holes are allowed), and every block size fitting it.
func (t *target) checkReads(blockSizes []int, allowHoles bool) error {
	if !allowHoles {
		if err := t.checkWritten(t.sizeBytes); err != nil {
			return err
		}
	}
	for _, bs := range blockSizes {
		if err := t.fits(bs); err != nil {
			return err
		}
	}
	return nil
}

// fits reports whether I/Os of bs bytes can be made on t: a multiple of its
// O_DIRECT alignment, within its measured range.
func (t *target) fits(bs int) error {
	if uint32(bs)%t.file.DirectAlign != 0 {
		return fmt.Errorf("block size %d is not a multiple of %s's O_DIRECT alignment %d", bs, t.path, t.file.DirectAlign)
	}
	if int64(bs) > t.sizeBytes {
		return fmt.Errorf("block size %d exceeds the target size %d", bs, t.sizeBytes)
	}
	return nil
}

// errHoles is a target whose measured range is not all written: a read of a
// hole never reaches the medium (on a loop device over a sparse file in
// /dev/shm it is a memset, far faster than a read of data).
var errHoles = errors.New("reads would fall in unwritten blocks")

// checkWritten fails with errHoles when the first n bytes of t, a loop device
// over a sparse file, are not all allocated in that file (SEEK_HOLE on it,
// from the loop's offset). Other block devices, and a loop whose backing file
// cannot be asked, pass: nothing is known about their blocks.
func (t *target) checkWritten(n int64) error {
	backing, off, ok := loopBacking(t.dev)
	if !ok {
		return nil
	}
	f, err := os.Open(backing)
	if err != nil {
		return nil
	}
	defer f.Close()
	hole, err := unix.Seek(int(f.Fd()), off, unix.SEEK_HOLE)
	if err != nil || hole >= off+n {
		return nil
	}
	return fmt.Errorf("%s: %w: it is a loop device over %s, which has a hole at byte %d of the %d to be read; write the device first (dd if=/dev/urandom of=%s bs=1M oflag=direct) or measure a written file",
		t.path, errHoles, backing, hole-off, n, t.path)
}

// loopBacking is the backing file and offset of block device dev when it is
// a loop device (ok false for anything else, a file's zero dev included, or
// a backing file that was deleted). The device number, not the path's name,
// picks the sysfs entry, so a file named like a loop device is not taken
// for one.
func loopBacking(dev blockdev.Dev) (file string, offset int64, ok bool) {
	if dev == (blockdev.Dev{}) {
		return "", 0, false
	}
	loop := filepath.Join("/sys/dev/block", dev.String(), "loop")
	b, err := os.ReadFile(filepath.Join(loop, "backing_file"))
	if err != nil {
		return "", 0, false
	}
	file = strings.TrimSpace(string(b))
	if file == "" || strings.HasSuffix(file, " (deleted)") {
		return "", 0, false
	}
	if o, err := os.ReadFile(filepath.Join(loop, "offset")); err == nil {
		offset, _ = strconv.ParseInt(strings.TrimSpace(string(o)), 10, 64)
	}
	return file, offset, true
}
