// Package fusefile serves one fixed-size file through FUSE (go-fuse,
// mounted with mount(2) as root), opened with FOPEN_DIRECT_IO so that the
// kernel keeps no page cache of it and every read, write and fsync reaches
// a Backend: the one home of a device emulated in user space, for the test
// devices that fail on command (internal/faultfs) and the emulated storage
// that keeps an exact rate (eval/emudev). A loop device with direct I/O
// over the file makes it a block device.
package fusefile

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

// FileName is the name of the one file a mount serves.
const FileName = "disk"

// MaxRequestBytes bounds one read or write request (the kernel splits
// larger ones).
const MaxRequestBytes = 1 << 20

// Backend moves the file's bytes. Requests arrive concurrently; off and
// len(p) lie within the file (the server checks). An error is what the
// caller of the request sees (EIO, say); ctx ends when the kernel gives the
// request up.
type Backend interface {
	ReadAt(ctx context.Context, p []byte, off int64) syscall.Errno
	WriteAt(ctx context.Context, p []byte, off int64) syscall.Errno
	Sync(ctx context.Context) syscall.Errno
}

type fileNode struct {
	fs.Inode
	size int64
	b    Backend
}

var (
	_ fs.NodeOpener    = (*fileNode)(nil)
	_ fs.NodeGetattrer = (*fileNode)(nil)
	_ fs.NodeSetattrer = (*fileNode)(nil)
	_ fs.NodeReader    = (*fileNode)(nil)
	_ fs.NodeWriter    = (*fileNode)(nil)
	_ fs.NodeFsyncer   = (*fileNode)(nil)
	_ fs.NodeFlusher   = (*fileNode)(nil)
	_ fs.NodeAllocater = (*fileNode)(nil)
	_ fs.NodeOnAdder   = (*rootNode)(nil)
	_ fs.NodeGetattrer = (*rootNode)(nil)
)

func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (n *fileNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o600
	out.Size = uint64(n.size)
	out.Blocks = uint64(n.size) / 512
	out.Blksize = 4096
	out.Nlink = 1
	return 0
}

// Setattr refuses a change of size: the file is a device of fixed size.
func (n *fileNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok && int64(sz) != n.size {
		return syscall.EPERM
	}
	return n.Getattr(ctx, fh, out)
}

// Read reads what lies within the file; past its end, nothing.
func (n *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off < 0 || off >= n.size {
		return fuse.ReadResultData(nil), 0
	}
	dest = dest[:min(int64(len(dest)), n.size-off, MaxRequestBytes)]
	if errno := n.b.ReadAt(ctx, dest, off); errno != 0 {
		return nil, errno
	}
	return fuse.ReadResultData(dest), 0
}

// Write stores data at off; a write past the end of the device fails with
// ENOSPC, as a block device refuses it.
func (n *fileNode) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if off < 0 || off+int64(len(data)) > n.size {
		return 0, syscall.ENOSPC
	}
	if errno := n.b.WriteAt(ctx, data, off); errno != 0 {
		return 0, errno
	}
	return uint32(len(data)), 0
}

func (n *fileNode) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	return n.b.Sync(ctx)
}

func (n *fileNode) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno { return 0 }

// Allocate refuses: every byte of the device exists already.
func (n *fileNode) Allocate(ctx context.Context, fh fs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	return syscall.EOPNOTSUPP
}

// rootNode is the mount's directory, holding only FileName.
type rootNode struct {
	fs.Inode
	file *fileNode
}

func (r *rootNode) OnAdd(ctx context.Context) {
	ch := r.NewPersistentInode(ctx, r.file, fs.StableAttr{Mode: syscall.S_IFREG, Ino: 2})
	r.AddChild(FileName, ch, false)
}

func (r *rootNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o700
	out.Nlink = 2
	return 0
}

// Server is a mounted file.
type Server struct {
	Dir  string // mount point; the file is Dir/FileName
	srv  *fuse.Server
	conn string // the connection's abort file under fusectl, "" when unknown
}

// Path is the served file's path.
func (s *Server) Path() string { return filepath.Join(s.Dir, FileName) }

// Options tune a mount.
type Options struct {
	// AsyncDIO lets the kernel keep several direct-I/O requests of one
	// caller in flight (FUSE_ASYNC_DIO): a loop device's requests then
	// overlap instead of waiting for each other.
	AsyncDIO bool
	// MaxBackground bounds the asynchronous requests in flight (0: the
	// library's default, 12).
	MaxBackground int
}

// Mount serves a file of size bytes as dir/FileName, its bytes moved by b.
// It mounts with mount(2) directly (root; no fusermount); name is the file
// system's name in /proc/mounts. The caller must Unmount.
func Mount(dir, name string, size int64, b Backend, o Options) (*Server, error) {
	if size <= 0 || size%4096 != 0 {
		return nil, fmt.Errorf("fusefile: mount: size %d, want a positive multiple of 4096", size)
	}
	root := &rootNode{file: &fileNode{size: size, b: b}}
	timeout := time.Second
	srv, err := fs.Mount(dir, root, &fs.Options{
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
		MountOptions: fuse.MountOptions{
			DirectMountStrict: true,
			AllowOther:        true, // the loop driver's worker threads are not this process
			FsName:            name,
			Name:              name,
			MaxWrite:          MaxRequestBytes,
			DisableXAttrs:     true,
			MaxBackground:     o.MaxBackground,
			ExtraCapabilities: asyncDIO(o.AsyncDIO),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("fusefile: mounting on %s: %w", dir, err)
	}
	s := &Server{Dir: dir, srv: srv}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err == nil {
		s.conn = fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", unix.Minor(st.Dev))
	}
	return s, nil
}

func asyncDIO(on bool) uint64 {
	if on {
		return fuse.CAP_ASYNC_DIO
	}
	return 0
}

// Abort ends the FUSE connection: every request in flight and every later
// one fails (ENOTCONN), so nothing above the file can hang on it. It needs
// fusectl mounted on /sys/fs/fuse/connections.
func (s *Server) Abort() error {
	if s.conn == "" {
		return fmt.Errorf("fusefile: abort %s: connection unknown", s.Dir)
	}
	if err := os.WriteFile(s.conn, []byte("1"), 0); err != nil {
		return fmt.Errorf("fusefile: abort %s: %w", s.Dir, err)
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
			return fmt.Errorf("fusefile: unmount %s: %v; lazy unmount: %v (abort: %v)", s.Dir, err, lerr, abortErr)
		}
		return fmt.Errorf("fusefile: unmount %s: %v (unmounted lazily)", s.Dir, err)
	case <-time.After(timeout):
		abortErr := s.Abort()
		lerr := unix.Unmount(s.Dir, unix.MNT_DETACH)
		return fmt.Errorf("fusefile: unmount %s: not done after %v (abort: %v, lazy unmount: %v)", s.Dir, timeout, abortErr, lerr)
	}
}
