package runtime

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tutti-io/tutti/objmap"
	"golang.org/x/sys/unix"
)

// The parent log records, for every run, the chain id its first block hangs
// under (the prefix index is a forest keyed by chained ids, and a run's
// header holds only its own ids). A record is made durable before the run's
// commit, so every committed run has one; records of runs that never
// committed are ignored. Open rewrites the log with the live runs only.
//
// Record (24 bytes, little endian): run id u64, parent id u64, flags u32
// (bit 0: has a parent), CRC32C of the first 20 bytes u32. A torn or
// corrupt tail record ends the log.

const (
	parentLogName    = "runtime-parents.log"
	parentLogTmpName = "runtime-parents.log.tmp"
	parentRecBytes   = 24
)

type parentRef struct {
	id  uint64
	has bool
}

type parentLog struct {
	dir string
	fd  int
	off int64
	buf []byte
}

func encodeParent(b []byte, run objmap.RunID, p parentRef) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], uint64(run))
	le.PutUint64(b[8:], p.id)
	var flags uint32
	if p.has {
		flags = 1
	}
	le.PutUint32(b[16:], flags)
	le.PutUint32(b[20:], objmap.CRC32C(b[:20]))
}

// readParents parses a log image; it stops at the first bad record.
func readParents(b []byte) map[objmap.RunID]parentRef {
	out := make(map[objmap.RunID]parentRef)
	le := binary.LittleEndian
	for len(b) >= parentRecBytes {
		r := b[:parentRecBytes]
		if le.Uint32(r[20:]) != objmap.CRC32C(r[:20]) {
			break
		}
		flags := le.Uint32(r[16:])
		if flags > 1 {
			break
		}
		out[objmap.RunID(le.Uint64(r[0:]))] = parentRef{id: le.Uint64(r[8:]), has: flags == 1}
		b = b[parentRecBytes:]
	}
	return out
}

// loadParentLog reads the log in dir.
func loadParentLog(dir string) (map[objmap.RunID]parentRef, error) {
	b, err := os.ReadFile(filepath.Join(dir, parentLogName))
	if errors.Is(err, os.ErrNotExist) {
		return map[objmap.RunID]parentRef{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the parent log: %w", err)
	}
	return readParents(b), nil
}

// rewriteParentLog atomically replaces the log with live's records and
// opens it for appending.
func rewriteParentLog(dir string, live map[objmap.RunID]parentRef) (*parentLog, error) {
	b := make([]byte, 0, len(live)*parentRecBytes)
	var rec [parentRecBytes]byte
	for id, p := range live {
		encodeParent(rec[:], id, p)
		b = append(b, rec[:]...)
	}
	tmp := filepath.Join(dir, parentLogTmpName)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return nil, fmt.Errorf("writing the parent log: %w", err)
	}
	f, err := os.OpenFile(tmp, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("writing the parent log: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("syncing the parent log: %w", err)
	}
	f.Close()
	if err := os.Rename(tmp, filepath.Join(dir, parentLogName)); err != nil {
		return nil, fmt.Errorf("replacing the parent log: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	fd, err := unix.Open(filepath.Join(dir, parentLogName), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the parent log: %w", err)
	}
	return &parentLog{dir: dir, fd: fd, off: int64(len(b))}, nil
}

// append writes one record per run and makes them durable with one
// fdatasync. Not safe for concurrent use (the store serialises commits).
func (l *parentLog) append(runs []objmap.RunID, parents []parentRef) error {
	l.buf = l.buf[:0]
	var rec [parentRecBytes]byte
	for i, id := range runs {
		encodeParent(rec[:], id, parents[i])
		l.buf = append(l.buf, rec[:]...)
	}
	n, err := unix.Pwrite(l.fd, l.buf, l.off)
	if err == nil && n != len(l.buf) {
		err = unix.EIO
	}
	if err == nil {
		err = unix.Fdatasync(l.fd)
	}
	if err != nil {
		return fmt.Errorf("appending to the parent log: %w", err)
	}
	l.off += int64(len(l.buf))
	return nil
}

func (l *parentLog) close() error { return unix.Close(l.fd) }
