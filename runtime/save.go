package runtime

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/admission"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/runtime/internal/savewrite"
	"golang.org/x/sys/unix"
)

// SkipCause says why blocks of a Save were not stored.
type SkipCause uint8

const (
	SkipCached  SkipCause = iota // already cached, being saved by another Save, or its parent left the index
	SkipNoSpace                  // the index or the pool had no room (partial admission)
	SkipBudget                   // the scheduler's pending save bytes or op table cut the save (partial admission)
	SkipENOSPC                   // a write failed with ENOSPC
	SkipIOError                  // a write, sync or commit failed otherwise
	SkipClosed                   // the store was closing
	SkipBound                    // the device cannot write more within the save bound (partial admission)
	numSkipCauses
)

func (c SkipCause) String() string {
	switch c {
	case SkipCached:
		return "cached"
	case SkipNoSpace:
		return "no-space"
	case SkipBudget:
		return "budget"
	case SkipENOSPC:
		return "enospc"
	case SkipIOError:
		return "io-error"
	case SkipClosed:
		return "closed"
	case SkipBound:
		return "bound"
	}
	return fmt.Sprintf("SkipCause(%d)", uint8(c))
}

// skipCauses names admission's causes as the store counts them (a
// Failure by its error: skipCauseOf).
var skipCauses = [...]SkipCause{admission.Cached: SkipCached, admission.NoSpace: SkipNoSpace,
	admission.Budget: SkipBudget, admission.Bound: SkipBound}

// skipCauseOf is the cause of blocks lost to err.
func skipCauseOf(err error) SkipCause {
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, objmap.ErrNoSpace):
		return SkipENOSPC
	case errors.Is(err, ring.ErrClosed), errors.Is(err, objmap.ErrClosed):
		return SkipClosed
	}
	return SkipIOError
}

// Save is one asynchronous save. The pages it names must stay unchanged until
// Gathered is closed (their bytes are then in staging or on disk); Done is
// closed when the save ended, after which Saved and Skipped are final.
type Save struct {
	s        *Store
	txn      *admission.Txn // its reservations; the driver's until done
	sess     *session       // a connected store's: the connection txn's reservations are of
	gathered chan struct{}
	done     chan struct{}
	startNs  int64      // the scheduler's clock at Save's call
	timing   SaveTiming // written by save and its driver, read after done

	mu      sync.Mutex
	saved   int
	skipped [numSkipCauses]int
}

// Gathered is closed once the save no longer reads the engine's pages.
func (sv *Save) Gathered() <-chan struct{} { return sv.gathered }

// Done is closed when the save ended (committed, or skipped in part or whole).
func (sv *Save) Done() <-chan struct{} { return sv.done }

// Wait blocks until the save ended.
func (sv *Save) Wait() { <-sv.done }

// SaveTiming is where a save's time went, each figure from Save's call.
type SaveTiming struct {
	AdmittedNs   int64 // Save returned: blocks reserved, pool allocated, writes enqueued
	FirstWriteNs int64 // its first write went to a stage worker (0: none did)
	WritesNs     int64 // its last write was retired (completed, or given up)
	DoneNs       int64 // it ended: its last commit durable
	// DeviceWritesNs is, per device (directory), its span from its first write's
	// submission to its last completion (0: the device wrote nothing); the
	// save's writes end with the slowest.
	DeviceWritesNs []int64
}

// Timing is the save's SaveTiming: final after Done, the zero value before.
func (sv *Save) Timing() SaveTiming {
	select {
	case <-sv.done:
		return sv.timing
	default:
		return SaveTiming{}
	}
}

// Saved is the number of leading blocks of the uncached part committed
// (final after Done).
func (sv *Save) Saved() int {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.saved
}

// Skipped is the number of blocks of the chain not stored for cause (final
// after Done); blocks already cached count as SkipCached.
func (sv *Save) Skipped(cause SkipCause) int {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.skipped[cause]
}

// save is SaveWith with the blocks' KV-event metadata copied (nil: none),
// kept from their reservation on: it admits the save (admission.Admit) and
// hands its writes to the pipeline's driver, on a goroutine of the save's
// own.
func (s *Store) save(chain []uint64, pages []int32, meta []kvmeta.Meta, afterEvent uintptr) (*Save, error) {
	if err := s.checkRequest("save", chain, pages); err != nil {
		return nil, err
	}
	if err := s.begin(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.savesLive++
	s.mu.Unlock()
	sv := &Save{s: s, gathered: make(chan struct{}), done: make(chan struct{}), startNs: s.sched.NowNs()}
	s.stats.saves.Add(1)
	s.stats.saveBlocks.Add(int64(len(chain)))
	ctl := admission.Control(s.ctl)
	if s.remote != nil { // the transaction's reservations are one connection's
		sv.sess = s.remote.bind()
		ctl = sv.sess
	}
	txn := admission.Admit(&admission.Store{Ctl: ctl, Sched: s.sched, Geo: s.geo,
		Dirs: len(s.cfg.Dirs), MaxWriteIOBytes: s.maxWriteIOBytes}, chain, meta, s.journalReady,
		admission.Events{Skip: sv.skip, Saved: sv.commit})
	sv.txn = txn
	sv.timing.AdmittedNs = s.sched.NowNs() - sv.startNs
	if txn.Writes() == 0 {
		sv.finish()
		return sv, nil
	}
	go func() {
		t := s.writes.Drive(savewrite.Save{Txn: txn, Pages: pages, AfterEvent: afterEvent, Gathered: sv.gathered, StartNs: sv.startNs})
		sv.timing.FirstWriteNs, sv.timing.WritesNs, sv.timing.DeviceWritesNs = t.FirstWriteNs, t.WritesNs, t.DeviceWritesNs
		sv.finish()
	}()
	return sv, nil
}

// journalReady is nil unless the object map's journal had no room for its
// last group and still has none: then Sync retries it (its queued records,
// or a probe), and its error says the disk is still full. Saves resume by
// themselves once a retry succeeds.
func (s *Store) journalReady() error {
	return s.ctl.journalReady()
}

// skip counts blocks not stored for cause (admission's); a failure's error
// is kept for WaitSaves and Stats.
func (sv *Save) skip(cause admission.Cause, blocks int, err error) {
	if blocks <= 0 {
		return
	}
	c := SkipCause(0)
	if cause == admission.Failure {
		c = skipCauseOf(err)
		sv.s.fails.note(err)
	} else {
		c = skipCauses[cause]
	}
	sv.mu.Lock()
	sv.skipped[c] += blocks
	sv.mu.Unlock()
	sv.s.stats.skippedBlocks[c].Add(int64(blocks))
}

// commit counts blocks committed and served.
func (sv *Save) commit(blocks int) {
	s := sv.s
	sv.mu.Lock()
	sv.saved += blocks
	sv.mu.Unlock()
	s.stats.savedBlocks.Add(int64(blocks))
	s.stats.savedBytes.Add(int64(blocks) * s.geo.ChunkBytes())
	s.stats.committedRuns.Add(1)
}

func (sv *Save) finish() {
	s := sv.s
	sv.timing.DoneNs = s.sched.NowNs() - sv.startNs
	select {
	case <-sv.gathered:
	default:
		close(sv.gathered)
	}
	if sv.sess != nil {
		sv.sess.io.Add(-1)
	}
	close(sv.done)
	s.endOp()
	s.mu.Lock()
	s.savesLive--
	s.mu.Unlock()
	s.savesCond.Broadcast()
}
