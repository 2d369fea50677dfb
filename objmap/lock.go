package objmap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DirLock is a flock on dir/LOCK, the lock every Open of a store directory
// takes: exclusive for a writer (LockDir), shared for a read-only checker
// (LockDirShared). flock belongs to the open file description, so a second
// LockDir in the same process conflicts too. Anything that deletes,
// truncates or reuses a store directory takes the exclusive lock first and
// holds it until the directory is gone or rebuilt; Unlock releases it.
type DirLock struct {
	dir     string
	fd      int
	created bool // LockDir created the LOCK file (a failed Open removes it)
}

// LockDir takes dir's exclusive lock without waiting, creating dir/LOCK if
// needed and writing this pid into it. A held lock returns an error
// wrapping ErrLocked that names dir and the holder (a writer's pid, or a
// read-only checker).
func LockDir(dir string) (*DirLock, error) {
	path := filepath.Join(dir, lockName)
	created := true
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.EEXIST) {
		created = false
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("objmap: opening lock file %s: %w", path, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := lockHolder(path, fd)
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is in use by %s", ErrLocked, dir, holder)
		}
		return nil, fmt.Errorf("objmap: locking %s: %w", path, err)
	}
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if err := unix.Ftruncate(fd, 0); err == nil {
		_ = pwriteAll(fd, pid, 0) // the pid is only for the error message of a second opener
	}
	return &DirLock{dir: dir, fd: fd, created: created}, nil
}

// LockDirShared takes a shared lock on an existing dir/LOCK without
// waiting and without writing anything (it works on a read-only mount):
// any number of read-only checkers may hold it together, and it excludes a
// writer (LockDir fails while it is held, and it fails while a writer holds
// LockDir, with an error wrapping ErrLocked that names the writer's pid). A
// directory without a LOCK file was never opened for writing: the result
// is then a lock that holds nothing, and Unlock is a no-op.
func LockDirShared(dir string) (*DirLock, error) {
	path := filepath.Join(dir, lockName)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return &DirLock{dir: dir, fd: -1}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("objmap: opening lock file %s: %w", path, err)
	}
	if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err != nil {
		holder := lockHolder(path, fd)
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is being written by %s", ErrLocked, dir, holder)
		}
		return nil, fmt.Errorf("objmap: locking %s (shared): %w", path, err)
	}
	return &DirLock{dir: dir, fd: fd}, nil
}

// lockHolder names who holds path's lock for an error message: the pid in
// the file when a writer holds it exclusively, "read-only checkers" when a
// shared lock (which writes no pid) is what blocks.
func lockHolder(path string, fd int) string {
	if probe, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		shared := unix.Flock(probe, unix.LOCK_SH|unix.LOCK_NB) == nil
		unix.Close(probe)
		if shared {
			return "a read-only checker (fsck; shared lock, no pid recorded)"
		}
	}
	holder := "unknown pid"
	var buf [32]byte
	if n, err := unix.Pread(fd, buf[:], 0); err == nil && n > 0 {
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(buf[:n]))); perr == nil {
			holder = fmt.Sprintf("pid %d", pid)
			if pid == os.Getpid() {
				holder += " (this process)"
			}
		}
	}
	return holder
}

// Unlock releases the lock; a nil or released lock is a no-op.
func (l *DirLock) Unlock() error {
	if l == nil || l.fd < 0 {
		return nil
	}
	err := unix.Close(l.fd) // closing the last descriptor releases the flock
	l.fd = -1
	return err
}

// unlockRemove releases the lock and, if LockDir created the LOCK file,
// removes it (a failed Open leaves the directory as it found it). The file
// is unlinked while the lock is held, so no other opener can have locked it.
func (l *DirLock) unlockRemove() error {
	if l == nil || l.fd < 0 {
		return nil
	}
	var err error
	if l.created {
		err = os.Remove(filepath.Join(l.dir, lockName))
	}
	if uerr := l.Unlock(); err == nil {
		err = uerr
	}
	return err
}
