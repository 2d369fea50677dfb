package faultfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FileName is the name of the one file a mounted faultfs serves.
const FileName = "disk"

// maxRequestBytes bounds one read or write request (the kernel splits
// larger ones).
const maxRequestBytes = 1 << 20

// diskNode is the served file: a fixed-size window onto the backing file,
// opened with FOPEN_DIRECT_IO so that the kernel keeps no page cache of it
// and every read, write and fsync reaches the injector.
type diskNode struct {
	fs.Inode
	backing *os.File
	size    int64
	inj     *Injector
}

var (
	_ fs.NodeOpener    = (*diskNode)(nil)
	_ fs.NodeGetattrer = (*diskNode)(nil)
	_ fs.NodeSetattrer = (*diskNode)(nil)
	_ fs.NodeReader    = (*diskNode)(nil)
	_ fs.NodeWriter    = (*diskNode)(nil)
	_ fs.NodeFsyncer   = (*diskNode)(nil)
	_ fs.NodeFlusher   = (*diskNode)(nil)
	_ fs.NodeAllocater = (*diskNode)(nil)
	_ fs.NodeOnAdder   = (*rootNode)(nil)
	_ fs.NodeGetattrer = (*rootNode)(nil)
)

// fails asks the injector about a request; a stalled one returns once the
// fault is disarmed or the kernel gave the request up (an interrupt, an
// aborted connection).
func (n *diskNode) fails(ctx context.Context, op Op, off, size int64) bool {
	fail, stall := n.inj.decide(op, off, size)
	if stall != nil {
		select {
		case <-stall:
		case <-ctx.Done():
		}
	}
	return fail
}

func (n *diskNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (n *diskNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o600
	out.Size = uint64(n.size)
	out.Blocks = uint64(n.size) / 512
	out.Blksize = 4096
	out.Nlink = 1
	return 0
}

// Setattr refuses a change of size: the file is a device of fixed size.
func (n *diskNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok && int64(sz) != n.size {
		return syscall.EPERM
	}
	return n.Getattr(ctx, fh, out)
}

func (n *diskNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off < 0 || off >= n.size {
		return fuse.ReadResultData(nil), 0
	}
	dest = dest[:min(int64(len(dest)), n.size-off, maxRequestBytes)]
	if n.fails(ctx, Read, off, int64(len(dest))) {
		return nil, syscall.EIO
	}
	got, err := n.backing.ReadAt(dest, off)
	if err != nil && got < len(dest) {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:got]), 0
}

// Write stores data at off; a write past the end of the device fails with
// ENOSPC, as a block device refuses it.
func (n *diskNode) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if off < 0 || off+int64(len(data)) > n.size {
		return 0, syscall.ENOSPC
	}
	if n.fails(ctx, Write, off, int64(len(data))) {
		return 0, syscall.EIO
	}
	if _, err := n.backing.WriteAt(data, off); err != nil {
		return 0, syscall.EIO
	}
	return uint32(len(data)), 0
}

// Fsync makes the backing file durable, or fails as the injector says.
func (n *diskNode) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if n.fails(ctx, Fsync, 0, 0) {
		return syscall.EIO
	}
	if err := unix.Fdatasync(int(n.backing.Fd())); err != nil {
		return syscall.EIO
	}
	return 0
}

func (n *diskNode) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno { return 0 }

// Allocate refuses: every byte of the device exists already.
func (n *diskNode) Allocate(ctx context.Context, fh fs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	return syscall.EOPNOTSUPP
}

// rootNode is the mount's directory, holding only FileName.
type rootNode struct {
	fs.Inode
	disk *diskNode
}

func (r *rootNode) OnAdd(ctx context.Context) {
	ch := r.NewPersistentInode(ctx, r.disk, fs.StableAttr{Mode: syscall.S_IFREG, Ino: 2})
	r.AddChild(FileName, ch, false)
}

func (r *rootNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o700
	out.Nlink = 2
	return 0
}

// Server is a mounted faultfs.
type Server struct {
	Dir  string // mount point; the file is Dir/FileName
	srv  *fuse.Server
	conn string // the connection's abort file under fusectl, "" when unknown
}

// Path is the served file's path.
func (s *Server) Path() string { return filepath.Join(s.Dir, FileName) }

// Mount serves backing's first size bytes as dir/FileName through FUSE,
// failing requests as inj says. It mounts with mount(2) directly (root; no
// fusermount). The caller must Unmount; backing must stay open until then.
func Mount(dir string, backing *os.File, size int64, inj *Injector) (*Server, error) {
	if size <= 0 || size%4096 != 0 {
		return nil, fmt.Errorf("faultfs: mount: size %d, want a positive multiple of 4096", size)
	}
	root := &rootNode{disk: &diskNode{backing: backing, size: size, inj: inj}}
	timeout := time.Second
	srv, err := fs.Mount(dir, root, &fs.Options{
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
		MountOptions: fuse.MountOptions{
			DirectMountStrict: true,
			AllowOther:        true, // the loop driver's worker threads are not this process
			FsName:            "tutti-faultfs",
			Name:              "faultfs",
			MaxWrite:          maxRequestBytes,
			DisableXAttrs:     true,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("faultfs: mounting on %s: %w", dir, err)
	}
	s := &Server{Dir: dir, srv: srv}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err == nil {
		s.conn = fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", unix.Minor(st.Dev))
	}
	return s, nil
}

// Abort ends the FUSE connection: every request in flight and every later
// one fails (ENOTCONN), so nothing above the file can hang on it. It needs
// fusectl mounted on /sys/fs/fuse/connections.
func (s *Server) Abort() error {
	if s.conn == "" {
		return fmt.Errorf("faultfs: abort %s: connection unknown", s.Dir)
	}
	if err := os.WriteFile(s.conn, []byte("1"), 0); err != nil {
		return fmt.Errorf("faultfs: abort %s: %w", s.Dir, err)
	}
	return nil
}

// Unmount unmounts the file system, lazily (and after aborting the
// connection) when it is busy or does not go within timeout, and waits up
// to timeout for the server to stop.
func (s *Server) Unmount(timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- s.srv.Unmount() }()
	select {
	case err := <-done:
		if err == nil {
			return nil
		}
		abortErr := s.Abort()
		if lerr := unix.Unmount(s.Dir, unix.MNT_DETACH); lerr != nil {
			return fmt.Errorf("faultfs: unmount %s: %v; lazy unmount: %v (abort: %v)", s.Dir, err, lerr, abortErr)
		}
		return fmt.Errorf("faultfs: unmount %s: %v (unmounted lazily)", s.Dir, err)
	case <-time.After(timeout):
		abortErr := s.Abort()
		lerr := unix.Unmount(s.Dir, unix.MNT_DETACH)
		return fmt.Errorf("faultfs: unmount %s: not done after %v (abort: %v, lazy unmount: %v)", s.Dir, timeout, abortErr, lerr)
	}
}
