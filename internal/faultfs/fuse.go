package faultfs

import (
	"context"
	"os"
	"syscall"

	"github.com/tutti-io/tutti/internal/fusefile"
	"golang.org/x/sys/unix"
)

// FileName is the name of the one file a mounted faultfs serves.
const FileName = fusefile.FileName

// Server is a mounted faultfs.
type Server = fusefile.Server

// backend moves the served file's bytes to and from the backing file,
// failing requests as the injector says.
type backend struct {
	backing *os.File
	inj     *Injector
}

// fails asks the injector about a request; a stalled one returns once the
// fault is disarmed or the kernel gave the request up (an interrupt, an
// aborted connection).
func (b *backend) fails(ctx context.Context, op Op, off, size int64) bool {
	fail, stall := b.inj.decide(op, off, size)
	if stall != nil {
		select {
		case <-stall:
		case <-ctx.Done():
		}
	}
	return fail
}

func (b *backend) ReadAt(ctx context.Context, p []byte, off int64) syscall.Errno {
	if b.fails(ctx, Read, off, int64(len(p))) {
		return syscall.EIO
	}
	if got, err := b.backing.ReadAt(p, off); err != nil && got < len(p) {
		return syscall.EIO
	}
	return 0
}

func (b *backend) WriteAt(ctx context.Context, p []byte, off int64) syscall.Errno {
	if b.fails(ctx, Write, off, int64(len(p))) {
		return syscall.EIO
	}
	if _, err := b.backing.WriteAt(p, off); err != nil {
		return syscall.EIO
	}
	return 0
}

// Sync makes the backing file durable, or fails as the injector says.
func (b *backend) Sync(ctx context.Context) syscall.Errno {
	if b.fails(ctx, Fsync, 0, 0) {
		return syscall.EIO
	}
	if err := unix.Fdatasync(int(b.backing.Fd())); err != nil {
		return syscall.EIO
	}
	return 0
}

// Mount serves backing's first size bytes as dir/FileName through FUSE,
// failing requests as inj says. The caller must Unmount; backing must stay
// open until then.
func Mount(dir string, backing *os.File, size int64, inj *Injector) (*Server, error) {
	return fusefile.Mount(dir, "tutti-faultfs", size, &backend{backing: backing, inj: inj}, fusefile.Options{})
}
