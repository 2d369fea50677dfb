package harness

import (
	"errors"
	"fmt"
	"os"

	"github.com/tutti-io/tutti/objmap"
)

// The locks a replay takes before it deletes or reuses anything under its
// store roots (objmap.LockDir, the flock every store Open takes):
//
//   - root/LOCK of every root, from the start of Run to its return:
//     everything a replay writes under a root (ceiling.dat, root/<backend>)
//     is touched only while it is held, so a second replay on the same root
//     fails at once with objmap.ErrLocked naming the first's pid, before it
//     has removed anything.
//   - root/<backend>/LOCK before that directory is emptied: a store another
//     process has open there (a runtime, fsck) fails the replay, naming the
//     holder's pid, and is left as it is. The directory is emptied but for
//     its LOCK file (removing a held LOCK would let a second opener lock a
//     new file beside the first), and the lock is released just before the
//     backend's Open, which for a tutti store takes the same flock. In that
//     gap only a process that does not take the root's lock can come in,
//     and it finds an empty directory; the backend's Open then fails with
//     ErrLocked: nothing is destroyed.
//   - root/<backend>/LOCK again, after the backend closed, while the
//     directory is removed (a store opened there meanwhile is left alone).

// lockFileName is the file objmap.LockDir flocks (a test checks it).
const lockFileName = "LOCK"

// lockRoots takes the lock of every root; on an error it holds none.
func lockRoots(roots []string) ([]*objmap.DirLock, error) {
	locks := make([]*objmap.DirLock, 0, len(roots))
	for _, r := range roots {
		l, err := objmap.LockDir(r)
		if err != nil {
			unlockAll(locks)
			return nil, fmt.Errorf("replay: store root: %w", err)
		}
		locks = append(locks, l)
	}
	return locks, nil
}

func unlockAll(locks []*objmap.DirLock) {
	for _, l := range locks {
		l.Unlock()
	}
}

// emptyStoreDir creates dir or empties it under its lock (all but the
// LOCK file: removeTree, progress as there), then releases the lock for the
// backend's Open. A directory another process holds is an error wrapping
// objmap.ErrLocked.
func emptyStoreDir(dir string, progress func(done, total int)) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	l, err := objmap.LockDir(dir)
	if err != nil {
		return err
	}
	defer l.Unlock()
	return removeTree(dir, lockFileName, progress)
}

// removeStoreDir removes dir under its lock (removeTree, progress as
// there); a directory someone else holds is left (the error says who holds
// it).
func removeStoreDir(dir string, progress func(done, total int)) error {
	l, err := objmap.LockDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer l.Unlock()
	return removeTree(dir, "", progress)
}
