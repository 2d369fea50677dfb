package objmap

import (
	"errors"
	"fmt"
	"os"
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
// known to be on disk (in a synced segment or a checkpoint). The queue
// (pending) is always in LSN order, and a group is a prefix of it.
//
// A group that cannot be written for lack of space (ENOSPC, EDQUOT: a full
// file system) is undone instead of failing the journal (journalfail.go):
// the segment is truncated back to its last durable byte, the commit
// records still queued are abandoned (their Commit fails, their space is
// free again) and every other record stays queued, in order, for the next
// group, so a full disk costs the saves made while it is full and nothing
// after. Any other write or sync error is sticky: nothing more is trusted.

func segmentName(seq uint64) string { return fmt.Sprintf("journal-%016x.log", seq) }

const (
	checkpointName    = "checkpoint"
	checkpointTmpName = "checkpoint.tmp"
)

type pendEnd struct {
	end int // offset in pending just after the record
	lsn uint64
	// commit marks a commit record (of run): abandoned, never retried, when
	// its group is undone; any other record is retried.
	commit bool
	run    RunID
}

// journal is safe for concurrent use. Lock order: Map.mu before journal.mu;
// the leader holds neither while doing I/O or calling back into the Map.
type journal struct {
	dir           string
	maxGroupBytes int
	maxPendBytes  int
	segmentBytes  int64
	// hardBytes bounds the segment while its checkpoint cannot be written:
	// past it commits are refused (ENOSPC), so a segment stays within what
	// recovery reads.
	hardBytes int64

	// owned by the current leader (or by Open/Close when no one leads)
	fd        int
	seq       uint64
	size      int64
	tmp       []byte
	groupEnds []pendEnd
	// needSeg is the segment a written checkpoint names that could not be
	// created yet: it is created before the next group is written (the old
	// segment is stale once the checkpoint is in place).
	needSeg uint64

	mu       sync.Mutex
	cond     sync.Cond
	pending  []byte
	ends     []pendEnd
	nextLSN  uint64
	durable  uint64
	lastKeep uint64 // the last record that is not a commit (what Sync waits for)
	leading  bool
	err      error // sticky: after an error the journal cannot undo, nothing more is trusted
	// failures counts undone groups (a waiter that saw it change since it
	// started lost its group); lastFail is the last one's error, nil once a
	// group was written since.
	failures   uint64
	lastFail   error
	lastUndo   error // the last undone group's error, kept after later successes
	abandoned  int64 // commit records abandoned by undone groups
	cpFailures int64 // checkpoints not written for lack of space (retried by the next group)
	cpErr      error // the last of them
	crash      *crashPlan
	syncs      int64
	records    int64
	bytes      int64 // journal bytes in the current segment, for Stats
	segments   int64

	// onDurable is called by the leader, with no lock held, after records up
	// to lsn became durable (releases quarantined space).
	onDurable func(lsn uint64)
	// checkpoint is called by the leader, with no lock held, when the segment
	// outgrew segmentBytes; it returns the LSN its snapshot covers (0: none
	// written) and an error only when the journal must fail closed.
	checkpoint func() (uint64, error)
	// abandon is called by the leader with mapMu held (and no journal lock)
	// after it undid a group: the Map forgets the runs whose commit records
	// were abandoned.
	abandon func(runs []RunID)
	mapMu   sync.Locker
}

func newJournal(dir string, fd int, seq uint64, size int64, segmentBytes int64, maxGroupBytes int) *journal {
	j := &journal{dir: dir, fd: fd, seq: seq, size: size, segmentBytes: segmentBytes,
		hardBytes:     min(2*segmentBytes+2*int64(maxGroupBytes), MaxSegmentBytes+MaxGroupBytesLimit/2),
		maxGroupBytes: maxGroupBytes, maxPendBytes: 8 * maxGroupBytes, nextLSN: 1, bytes: size}
	j.cond.L = &j.mu
	return j
}

// append queues r and returns its LSN and the failure count it was queued
// under (waitDurable's since); it does not wait. overfull reports that the
// queue is past its bound: the caller must then waitDurable(lsn) before
// going on (after releasing Map.mu), which bounds queued memory.
func (j *journal) append(r *Record) (lsn, since uint64, overfull bool, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err != nil {
		return 0, 0, false, j.err
	}
	j.pending, err = AppendRecord(j.pending, r)
	if err != nil {
		return 0, 0, false, err
	}
	lsn = j.nextLSN
	j.nextLSN++
	e := pendEnd{end: len(j.pending), lsn: lsn}
	if r.Type == RecCommit {
		e.commit, e.run = true, r.Run.ID
	} else {
		j.lastKeep = lsn
	}
	j.ends = append(j.ends, e)
	j.records++
	return lsn, j.failures, len(j.pending) > j.maxPendBytes, nil
}

// commitRoom refuses commits (ENOSPC) while the segment is past hardBytes,
// which happens only while its checkpoint cannot be written.
func (j *journal) commitRoom() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.bytes+int64(len(j.pending)) > j.hardBytes {
		return j.segmentFull()
	}
	return nil
}

// segmentFull is commitRoom's refusal (j.mu held).
func (j *journal) segmentFull() error {
	return fmt.Errorf("objmap: journal segment of %d bytes (and %d queued) past its bound of %d while its checkpoint cannot be written (%v): %w",
		j.bytes, len(j.pending), j.hardBytes, j.cpErr, unix.ENOSPC)
}

// undoneErr is the last undone group's error (nil: none so far).
func (j *journal) undoneErr() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.lastUndo
}

// failureCount is the number of undone groups so far.
func (j *journal) failureCount() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.failures
}

// keepLSN is the LSN of the last record that is not a commit (0: none).
func (j *journal) keepLSN() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.lastKeep
}

// waitDurable returns nil once every record up to lsn is durable. The first
// waiter that finds no write in progress becomes the leader: it writes the
// queued records (at most maxGroupBytes, whole records) and fdatasyncs once
// for all of them; the others wait for it. It returns an error when the
// journal failed closed, or when a group was undone after the failure count
// since (from append, or read by the caller): a commit record queued then
// was abandoned; any other record is still queued and goes out with a later
// group.
func (j *journal) waitDurable(lsn, since uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.durable < lsn {
		switch {
		case j.err != nil:
			return j.err
		case j.failures != since:
			return j.lastFail
		case j.leading:
			j.cond.Wait()
		case len(j.ends) == 0:
			return fmt.Errorf("objmap: waiting for journal LSN %d, only %d appended and none queued", lsn, j.nextLSN-1)
		default:
			j.lead()
		}
	}
	return nil
}

// lead writes one group as the leader; j.mu is held on entry and on return
// (released during the I/O).
func (j *journal) lead() {
	j.leading = true
	k := 0
	for k+1 < len(j.ends) && j.ends[k+1].end <= j.maxGroupBytes {
		k++
	}
	cut := j.ends[k]
	j.tmp = append(j.tmp[:0], j.pending[:cut.end]...)
	j.groupEnds = append(j.groupEnds[:0], j.ends[:k+1]...)
	j.pending = j.pending[:copy(j.pending, j.pending[cut.end:])]
	j.ends = j.ends[:copy(j.ends, j.ends[k+1:])]
	for i := range j.ends {
		j.ends[i].end -= cut.end
	}
	tear := j.crash.dueNow()
	j.mu.Unlock()

	done := cut.lsn
	var err error
	if tear != nil {
		err = j.crashWrite(j.tmp, tear)
	} else {
		err = j.writeSync(j.tmp)
	}
	if err == nil && j.size > j.segmentBytes && j.needSeg == 0 && j.checkpoint != nil {
		var covered uint64
		covered, err = j.checkpoint()
		done = max(done, covered)
	}
	if err != nil && noSpace(err) {
		terr := j.truncateBack()
		if terr == nil {
			j.undo(err)
			return
		}
		err = fmt.Errorf("%w; undoing the group failed: %w", err, terr)
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
		// Still failing while commits are refused: Sync's probes retry the
		// checkpoint until it fits.
		j.lastFail = nil
		if j.bytes > j.hardBytes {
			j.lastFail = j.segmentFull()
		}
	}
	j.cond.Broadcast()
}

// writeSync appends b to the segment and fdatasyncs it (leader only),
// creating the segment a checkpoint named first.
func (j *journal) writeSync(b []byte) error {
	if j.needSeg != 0 {
		if err := j.switchSegment(); err != nil {
			return err
		}
	}
	if err := jwrite("append", j.fd, b, j.size); err != nil {
		return fmt.Errorf("appending %d bytes at %d: %w", len(b), j.size, err)
	}
	if err := jsync("append", j.fd); err != nil {
		return fmt.Errorf("fdatasync: %w", err)
	}
	j.size += int64(len(b))
	j.mu.Lock()
	j.syncs++
	j.bytes = j.size
	j.mu.Unlock()
	return nil
}

// switchSegment makes j.needSeg the segment records go to (leader only):
// created with its marker, durable, then the old one closed and deleted.
func (j *journal) switchSegment() error {
	fd, size, err := createSegment(j.dir, j.needSeg)
	if err != nil {
		return err
	}
	oldFD, oldSeq := j.fd, j.seq
	j.fd, j.seq, j.size, j.needSeg = fd, j.needSeg, size, 0
	j.mu.Lock()
	j.bytes = size
	j.segments++
	j.mu.Unlock()
	unix.Close(oldFD)
	// A segment left behind is deleted by the next Open.
	_ = os.Remove(filepath.Join(j.dir, segmentName(oldSeq)))
	return nil
}

// dropCovered drops the queued records up to lsn, which a checkpoint now
// covers (the queue is in LSN order).
func (j *journal) dropCovered(lsn uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	k := 0
	for k < len(j.ends) && j.ends[k].lsn <= lsn {
		k++
	}
	if k == 0 {
		return
	}
	cut := j.ends[k-1].end
	j.pending = j.pending[:copy(j.pending, j.pending[cut:])]
	j.ends = j.ends[:copy(j.ends, j.ends[k:])]
	for i := range j.ends {
		j.ends[i].end -= cut
	}
}

// failed reports the sticky error, if any.
func (j *journal) failed() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.err
}

// failing is the last undone group's error while no group was written
// since (nil otherwise, and nil once failed closed: see failed).
func (j *journal) failing() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.lastFail
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
	err = jwrite("segment", fd, b, 0)
	if err == nil {
		err = jsync("segment", fd)
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

// noSpace reports a failure for lack of space, which the journal undoes
// rather than failing closed.
func noSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}
