package objmap

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Undoing a group the file system had no room for, and the simulated kill
// of crash tests.
//
// A failed append may have left part of the group in the segment (a short
// pwrite, or a whole one whose fdatasync failed): a torn record that replay
// would drop, followed by nothing, or worse, followed by the next group
// written after it. So the leader truncates the segment back to its last
// durable byte and makes that durable before anything else is appended;
// replay then finds exactly the records written before. Only when that
// truncation fails does the journal fail closed.

// truncateBack cuts the segment back to its durable size (leader only).
func (j *journal) truncateBack() error {
	if err := unix.Ftruncate(j.fd, j.size); err != nil {
		return fmt.Errorf("truncating %s back to %d bytes: %w", segmentName(j.seq), j.size, err)
	}
	if err := jsync("truncate", j.fd); err != nil {
		return fmt.Errorf("fdatasync of %s after truncating it: %w", segmentName(j.seq), err)
	}
	return nil
}

// undo is the end of a group that was not written and was truncated away
// (leader; no lock held on entry, j.mu held on return): with the Map locked
// (so no Commit appends meanwhile, and no checkpoint snapshots a run being
// abandoned), every commit record of the group and of the queue is
// abandoned and the Map forgets their runs; every other record is queued
// again, in LSN order, ahead of the rest. Waiters learn of it by the
// failure count.
func (j *journal) undo(cause error) {
	if j.mapMu != nil {
		j.mapMu.Lock()
	}
	j.mu.Lock()
	var lost []RunID
	keep := make([]byte, 0, len(j.tmp)+len(j.pending))
	var ends []pendEnd
	sift := func(b []byte, list []pendEnd) {
		start := 0
		for _, e := range list {
			if e.commit {
				lost = append(lost, e.run)
			} else {
				keep = append(keep, b[start:e.end]...)
				ends = append(ends, pendEnd{end: len(keep), lsn: e.lsn})
			}
			start = e.end
		}
	}
	sift(j.tmp, j.groupEnds)
	sift(j.pending, j.ends)
	j.pending, j.ends = keep, ends
	j.failures++
	j.abandoned += int64(len(lost))
	j.lastFail = fmt.Errorf("objmap: journal %s: %w (the group was undone: %d commits abandoned, the other records queued again)",
		filepath.Join(j.dir, segmentName(j.seq)), cause, len(lost))
	j.lastUndo = j.lastFail
	j.leading = false
	j.cond.Broadcast()
	j.mu.Unlock()
	if j.abandon != nil {
		j.abandon(lost)
	}
	if j.mapMu != nil {
		j.mapMu.Unlock()
	}
	j.mu.Lock()
}

// testHookJournalIO, when set, is consulted before each write (n bytes)
// and sync (n = 0) of the journal and the checkpoint (op: "append",
// "segment", "checkpoint", "truncate"): a non-nil error fails the call
// after the first k of the n bytes were written (fault tests: ENOSPC).
var testHookJournalIO func(op string, n int) (k int, err error)

// jwrite writes all of b at off.
func jwrite(op string, fd int, b []byte, off int64) error {
	if testHookJournalIO != nil {
		if k, err := testHookJournalIO(op, len(b)); err != nil {
			if k > 0 {
				_ = pwriteAll(fd, b[:min(k, len(b))], off)
			}
			return err
		}
	}
	return pwriteAll(fd, b, off)
}

// jsync fdatasyncs fd.
func jsync(op string, fd int) error {
	if testHookJournalIO != nil {
		if _, err := testHookJournalIO(op, 0); err != nil {
			return err
		}
	}
	return unix.Fdatasync(fd)
}

// ErrCrashed is what every write of a Map returns after SimulateCrash fired.
var ErrCrashed = errors.New("objmap: simulated crash")

// crashPlan is an armed SimulateCrash (journal.mu).
type crashPlan struct {
	groups int           // group writes left before the crash
	tear   func(int) int // bytes of the crashing group that reach the file
}

// dueNow counts a group write against the plan and returns its tear when
// this write is the crash, nil otherwise (j.mu held; nil plan: never).
func (p *crashPlan) dueNow() func(int) int {
	if p == nil || p.groups < 0 {
		return nil
	}
	p.groups--
	if p.groups >= 0 {
		return nil
	}
	return p.tear
}

// crashWrite is the group write at the crash: the first tear(len(b)) bytes
// reach the file, unsynced, and the journal fails with ErrCrashed.
func (j *journal) crashWrite(b []byte, tear func(int) int) error {
	if n := min(max(tear(len(b)), 0), len(b)); n > 0 {
		_ = pwriteAll(j.fd, b[:n], j.size)
	}
	return ErrCrashed
}

// SimulateCrash arms a simulated process kill, for crash tests (the
// product never calls it): the journal's afterGroups-th group write from
// now (0: the next) is where the process dies, with tear(n) of that
// group's n bytes reaching the file (0: none, fewer than n: a torn record,
// n: the whole group, written but never acknowledged). With afterGroups < 0
// it dies now, and tear applies to the records queued but not yet written.
// From then on the Map writes nothing more to its journal: every operation
// that would fails with ErrCrashed, queued records are lost, and Close only
// closes the files. The disk then holds what a kill at that point leaves.
func (m *Map) SimulateCrash(afterGroups int, tear func(n int) int) {
	j := m.j
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err != nil {
		return
	}
	j.crash = &crashPlan{groups: afterGroups, tear: tear}
	if afterGroups >= 0 {
		return
	}
	for j.leading {
		j.cond.Wait()
	}
	if n := min(max(tear(len(j.pending)), 0), len(j.pending)); n > 0 {
		_ = pwriteAll(j.fd, j.pending[:n], j.size)
	}
	j.pending, j.ends = nil, nil
	j.err = ErrCrashed
	j.cond.Broadcast()
}
