package objmap

import (
	"fmt"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// The metadata journal is an append-only file of records (see record.go)
// written with plain pwrite into the page cache and made durable with
// fdatasync, not with O_DIRECT. Records are small and of any length; with
// O_DIRECT every group commit would rewrite the partly filled last block,
// and a torn rewrite of that block could destroy records that were already
// durable. Buffered appends never touch durable bytes, and fdatasync covers
// the new file size. The cost, one fdatasync per group, is shared by every
// record appended while the previous group was syncing (group commit).
//
// LSNs number records from 1 in append order; durable is the highest LSN
// known to be on disk (in a synced segment or a checkpoint).

func segmentName(seq uint64) string { return fmt.Sprintf("journal-%016x.log", seq) }

const (
	checkpointName    = "checkpoint"
	checkpointTmpName = "checkpoint.tmp"
)

type pendEnd struct {
	end int // offset in pending just after the record
	lsn uint64
}

// journal is safe for concurrent use. Lock order: Map.mu before journal.mu;
// the leader holds neither while doing I/O or calling back into the Map.
type journal struct {
	dir           string
	maxGroupBytes int
	maxPendBytes  int
	segmentBytes  int64

	// owned by the current leader (or by Open/Close when no one leads)
	fd   int
	seq  uint64
	size int64
	tmp  []byte

	mu       sync.Mutex
	cond     sync.Cond
	pending  []byte
	ends     []pendEnd
	nextLSN  uint64
	durable  uint64
	leading  bool
	err      error // sticky: after a failed write or fdatasync nothing more is trusted
	syncs    int64
	records  int64
	bytes    int64 // journal bytes in the current segment, for Stats
	segments int64

	// onDurable is called by the leader, with no lock held, after records up
	// to lsn became durable (releases quarantined space).
	onDurable func(lsn uint64)
	// checkpoint is called by the leader, with no lock held, when the segment
	// outgrew segmentBytes; it returns the LSN its snapshot covers.
	checkpoint func() (uint64, error)
}

func newJournal(dir string, fd int, seq uint64, size int64, segmentBytes int64, maxGroupBytes int) *journal {
	j := &journal{dir: dir, fd: fd, seq: seq, size: size, segmentBytes: segmentBytes,
		maxGroupBytes: maxGroupBytes, maxPendBytes: 8 * maxGroupBytes, nextLSN: 1, bytes: size}
	j.cond.L = &j.mu
	return j
}

// append queues r and returns its LSN; it does not wait. overfull reports
// that the queue is past its bound: the caller must then waitDurable(lsn)
// before going on (after releasing Map.mu), which bounds queued memory.
func (j *journal) append(r *Record) (lsn uint64, overfull bool, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err != nil {
		return 0, false, j.err
	}
	j.pending, err = AppendRecord(j.pending, r)
	if err != nil {
		return 0, false, err
	}
	lsn = j.nextLSN
	j.nextLSN++
	j.ends = append(j.ends, pendEnd{end: len(j.pending), lsn: lsn})
	j.records++
	return lsn, len(j.pending) > j.maxPendBytes, nil
}

// lastLSN is the LSN of the last appended record.
func (j *journal) lastLSN() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.nextLSN - 1
}

// waitDurable returns once every record up to lsn is durable. The first
// waiter that finds no write in progress becomes the leader: it writes the
// queued records (at most maxGroupBytes, whole records) and fdatasyncs once
// for all of them; the others wait for it.
func (j *journal) waitDurable(lsn uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.durable < lsn {
		if j.err != nil {
			return j.err
		}
		if j.leading {
			j.cond.Wait()
			continue
		}
		if len(j.ends) == 0 {
			return fmt.Errorf("objmap: waiting for journal LSN %d, only %d appended", lsn, j.nextLSN-1)
		}
		j.leading = true
		k := 0
		for k+1 < len(j.ends) && j.ends[k+1].end <= j.maxGroupBytes {
			k++
		}
		cut := j.ends[k]
		j.tmp = append(j.tmp[:0], j.pending[:cut.end]...)
		j.pending = j.pending[:copy(j.pending, j.pending[cut.end:])]
		j.ends = j.ends[:copy(j.ends, j.ends[k+1:])]
		for i := range j.ends {
			j.ends[i].end -= cut.end
		}
		j.mu.Unlock()

		done := cut.lsn
		err := j.writeSync(j.tmp)
		if err == nil && j.size > j.segmentBytes && j.checkpoint != nil {
			var covered uint64
			covered, err = j.checkpoint()
			done = max(done, covered)
		}
		if err == nil && j.onDurable != nil {
			j.onDurable(done)
		}

		j.mu.Lock()
		j.leading = false
		if err != nil {
			j.err = fmt.Errorf("objmap: journal %s: %w", filepath.Join(j.dir, segmentName(j.seq)), err)
		} else {
			j.durable = max(j.durable, done)
		}
		j.cond.Broadcast()
	}
	return nil
}

// writeSync appends b to the segment and fdatasyncs it (leader only).
func (j *journal) writeSync(b []byte) error {
	for off := 0; off < len(b); {
		n, err := unix.Pwrite(j.fd, b[off:], j.size+int64(off))
		if err != nil {
			return fmt.Errorf("appending %d bytes at %d: %w", len(b)-off, j.size+int64(off), err)
		}
		off += n
	}
	if err := unix.Fdatasync(j.fd); err != nil {
		return fmt.Errorf("fdatasync: %w", err)
	}
	j.size += int64(len(b))
	j.mu.Lock()
	j.syncs++
	j.bytes = j.size
	j.mu.Unlock()
	return nil
}

// takeAllPending drops every queued record and returns the last LSN; the
// checkpoint calls it (with Map.mu held) because its snapshot covers them.
func (j *journal) takeAllPending() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.pending = j.pending[:0]
	j.ends = j.ends[:0]
	return j.nextLSN - 1
}

// failed reports the sticky error, if any.
func (j *journal) failed() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.err
}

// fail makes err sticky (used when a checkpoint outside the leader fails).
func (j *journal) fail(err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err == nil {
		j.err = err
	}
	j.cond.Broadcast()
}

// createSegment creates segment seq in dir holding its marker record,
// fdatasynced, and fsyncs dir. It returns the open fd and its size.
func createSegment(dir string, seq uint64) (int, int64, error) {
	path := filepath.Join(dir, segmentName(seq))
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, 0, fmt.Errorf("objmap: creating journal segment %s: %w", path, err)
	}
	b, _ := AppendRecord(nil, &Record{Type: RecSegment, Seq: seq})
	err = pwriteAll(fd, b, 0)
	if err == nil {
		err = unix.Fdatasync(fd)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("objmap: creating journal segment %s: %w", path, err)
	}
	return fd, int64(len(b)), nil
}

func pwriteAll(fd int, b []byte, off int64) error {
	for done := 0; done < len(b); {
		n, err := unix.Pwrite(fd, b[done:], off+int64(done))
		if err != nil {
			return err
		}
		done += n
	}
	return nil
}

func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening directory %s to sync it: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("fsync of directory %s: %w", dir, err)
	}
	return nil
}
