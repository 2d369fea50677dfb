package runtime

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/sched"
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

// saveRun is one run of a save: chain positions [chainPos, chainPos+chunks)
// written into one objmap reservation.
type saveRun struct {
	res      objmap.Reservation
	reqID    uint64 // scheduler request
	chainPos int
	writes   int  // writes the scheduler will dispatch for it
	admitted bool // false: cut at admission, nothing is ever written
	skip     bool // its dispatched writes are retired without I/O
	mapAbort bool // its objmap reservation is aborted once no write is in flight
	resGone  bool // it holds no objmap reservation (a failed shrink)
	failed   error
	crcs     []uint32  // CRC32C per (layer, chunk), layer-major: objmap's chunk table
	parts    []crcPart // the completed writes' chunk pieces, folded into crcs at commit (driver only)
	done     bool      // committed or aborted
}

// Save is one asynchronous save. The pages it names must stay unchanged until
// Gathered is closed (their bytes are then in staging or on disk); Done is
// closed when the save ended, after which Saved and Skipped are final.
type Save struct {
	s     *Store
	chain []uint64
	pages []int32
	runs  []*saveRun

	ios      chan sched.IO
	sink     chan *wbuf // completions of the save's writes; room for every wbuf it can hold
	gathered chan struct{}
	done     chan struct{}

	writesLeft int          // dispatched writes not yet retired (driver only)
	gatherLeft atomic.Int64 // writes not yet gathered (driver and stage workers)
	// The save's writes, one batch per device for the device models
	// (driver only): each device is credited with the writes it served.
	batches   []ioBatch
	withReads bool
	startNs   int64      // the scheduler's clock at Save's call
	timing    SaveTiming // written by save and the driver, read after done

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

func (sv *Save) skip(cause SkipCause, blocks int) {
	if blocks <= 0 {
		return
	}
	sv.mu.Lock()
	sv.skipped[cause] += blocks
	sv.mu.Unlock()
	sv.s.stats.skippedBlocks[cause].Add(int64(blocks))
}

// fail counts blocks lost to err (by its SkipCause) and, for a failed
// write, sync or journal append, keeps err for WaitSaves and Stats.
func (sv *Save) fail(err error, blocks int) {
	if blocks <= 0 {
		return
	}
	sv.skip(skipCauseOf(err), blocks)
	sv.s.fails.note(err)
}

// journalReady is nil unless the object map's journal had no room for its
// last group and still has none: then Sync retries it (its queued records,
// or a probe), and its error says the disk is still full. Saves resume by
// themselves once a retry succeeds.
func (s *Store) journalReady() error {
	if s.m.Failing() == nil {
		return nil
	}
	if err := s.m.Sync(); err != nil {
		return err
	}
	return s.m.Failing()
}

func skipCauseOf(err error) SkipCause {
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, objmap.ErrNoSpace):
		return SkipENOSPC
	case errors.Is(err, ring.ErrClosed), errors.Is(err, objmap.ErrClosed):
		return SkipClosed
	}
	return SkipIOError
}

// Save stores the blocks of chain that are not cached yet, reading their KV
// from the pages of the block table (pages[i*ChunkPages+j] is page j of chain
// block i). It returns at once: the scheduler defers the writes into the
// slack of loads, within Config.SaveBoundMs. What does not fit (pool, index,
// scheduler budget, what the device can write within the bound) is not
// admitted and counted by cause, never waited for; a write
// error skips the run and everything after it, counted. The pages must stay
// unchanged until Gathered.
func (s *Store) Save(chain []uint64, pages []int32) (*Save, error) {
	return s.save(chain, pages, nil)
}

// save is Save with the blocks' KV-event metadata (SaveWithMeta; nil:
// none), kept from their reservation on.
func (s *Store) save(chain []uint64, pages []int32, meta []kvmeta.Meta) (*Save, error) {
	if err := s.checkRequest("save", chain, pages); err != nil {
		return nil, err
	}
	if err := s.begin(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.savesLive++
	s.mu.Unlock()
	startNs := s.sched.NowNs()
	sv := &Save{s: s, chain: chain, pages: pages, gathered: make(chan struct{}), done: make(chan struct{}), startNs: startNs}
	s.stats.saves.Add(1)
	s.stats.saveBlocks.Add(int64(len(chain)))

	from := s.idx.Lookup(chain)
	sv.skip(SkipCached, from)
	if err := s.journalReady(); err != nil {
		// Nothing can commit: skip before reserving (which would evict
		// blocks for a save that cannot stay) or writing.
		sv.fail(err, len(chain)-from)
		sv.finish()
		return sv, nil
	}
	res, err := s.idx.Reserve(chain, from, s.cat.BytesPerBlock(), meta)
	if err != nil { // only bad arguments, which checkRequest excludes
		panic(fmt.Sprintf("runtime: reserving a save: %v", err))
	}
	s.cat.Release(res.Evicted)
	rest := len(chain) - from - res.N
	switch res.Stop {
	case prefix.StopCapacity, prefix.StopMaxBlocks:
		sv.skip(SkipNoSpace, rest)
	default:
		sv.skip(SkipCached, rest)
	}
	if res.N > 0 {
		sv.admit(chain[from:from+res.N], from)
	}
	total := 0
	for _, r := range sv.runs {
		total += r.writes
	}
	sv.timing.AdmittedNs = s.sched.NowNs() - startNs
	if total == 0 {
		sv.finish()
		return sv, nil
	}
	go sv.drive()
	return sv, nil
}

// admit allocates runs for the reserved blocks ids (chain positions
// [from, from+len(ids))) and enqueues their writes. Whatever it cannot admit
// it aborts in the index and counts.
func (sv *Save) admit(ids []uint64, from int) {
	s := sv.s
	resv, err := sv.allocate(len(ids))
	if err != nil {
		sv.abortIDs(ids)
		if errors.Is(err, objmap.ErrNoSpace) {
			sv.skip(SkipNoSpace, len(ids)) // the pool is full: an admission shortfall, not a failed write
		} else {
			sv.fail(err, len(ids))
		}
		return
	}
	total := reservedChunks(resv)
	// Room for every write the scheduler can dispatch, so routing never blocks.
	bound := 0
	for _, r := range resv {
		bound += s.geo.Layers * int((objmap.ObjectBytes(s.geo, r.Chunks)+s.maxWriteIOBytes-1)/s.maxWriteIOBytes)
	}
	sv.ios = make(chan sched.IO, max(1, bound))
	pos := from
	cut := false
	cutCause := SkipBudget // why the scheduler cut the save (when cut)
	shrunkAt := -1         // chain position where a run cut by the scheduler was shrunk
	nwrites := 0
	for _, r := range resv {
		sr := &saveRun{res: r, chainPos: pos, crcs: make([]uint32, s.geo.Layers*r.Chunks)}
		pos += r.Chunks
		sv.runs = append(sv.runs, sr)
		if cut {
			sr.skip = true
			continue
		}
		id, t, err := s.sched.EnqueueSave(sched.SaveRequest{Device: s.cat.DeviceOf(r.File), Blocks: r.Chunks,
			BytesPerLayerPerBlock: s.geo.ChunkBytesPerLayer()}, sv.ios)
		if err != nil {
			panic(fmt.Sprintf("runtime: enqueueing a save: %v", err)) // only bad arguments
		}
		sr.reqID, sr.writes = id, t.Writes
		nwrites += t.Writes
		if t.Blocks < r.Chunks {
			// A run's layout depends on its chunk count: a run the scheduler
			// cut is reallocated for the blocks it admitted (its writes are
			// cut for that many), or not written at all; nothing after it is.
			cut = true
			if t.Reason == sched.ReasonSaveBound {
				cutCause = SkipBound
			}
			if t.Blocks > 0 && sv.shrink(sr, t.Blocks) {
				sr.admitted = true
				shrunkAt = sr.chainPos + t.Blocks
			} else {
				sr.skip = true
			}
			continue
		}
		sr.admitted = true
	}
	sv.sink = make(chan *wbuf, s.saveSlots*s.wbufsPerSlot())
	sv.writesLeft = nwrites
	for _, r := range sv.runs {
		if r.admitted {
			sv.gatherLeft.Add(int64(r.writes))
		}
	}
	// Abort the reserved blocks past the allocation and the runs cut.
	if total < len(ids) {
		sv.abortIDs(ids[total:])
		sv.skip(SkipNoSpace, len(ids)-total)
	}
	if shrunkAt >= 0 {
		// The shrunk run's tail and every run after it (none admitted).
		for _, r := range sv.runs {
			if !r.admitted && !r.done {
				_ = s.m.Abort(r.res)
				r.done = true
			}
		}
		tail := sv.chain[shrunkAt : from+total]
		sv.abortIDs(tail)
		sv.skip(cutCause, len(tail))
		return
	}
	for i, r := range sv.runs {
		if !r.admitted {
			sv.abortRuns(i, cutCause, nil, nil)
			break
		}
	}
}

// shrink replaces sr's reservation by one of k chunks (k < its chunks),
// for a run the scheduler admitted in part. On false sr holds no
// reservation any more and must not be written.
func (sv *Save) shrink(sr *saveRun, k int) bool {
	s := sv.s
	if err := s.m.Abort(sr.res); err != nil {
		return false
	}
	got, err := s.m.Allocate(k)
	if err != nil || len(got) != 1 || got[0].Chunks != k {
		for _, r := range got {
			_ = s.m.Abort(r)
		}
		sr.resGone = true
		return false
	}
	// The index reservation keeps the run's original blocks; the caller
	// aborts the ones past k.
	sr.res = got[0]
	sr.crcs = sr.crcs[:s.geo.Layers*k]
	return true
}

// allocate reserves pool space for n blocks (objmap cuts it into runs of at
// most MaxRunChunks); a shortfall returns what fit (partial admission). When
// the pool has less room than the index had (quarantined frees, headers,
// padding, fragmentation), it gives back what fit and tries again, at most
// twice: first after making the frees durable (which releases their
// quarantine: a save right after an eviction or a Discard finds the space
// those freed), then after evicting runs that hold the shortfall too.
func (sv *Save) allocate(n int) ([]objmap.Reservation, error) {
	s := sv.s
	ways := s.saveWays(n)
	resv, err := s.m.AllocateStriped(n, ways)
	for try := 0; try < 2; try++ {
		got := reservedChunks(resv)
		if got == n || (err != nil && !errors.Is(err, objmap.ErrNoSpace)) {
			break
		}
		if try == 0 && s.m.Stats().QuarantinedBytes == 0 {
			continue // nothing to release: go on to evicting
		}
		for _, r := range resv {
			_ = s.m.Abort(r)
		}
		if try == 1 {
			s.cat.EvictRuns(objmap.RunBytes(s.geo, n-got))
		}
		if serr := s.m.Sync(); serr != nil {
			return nil, serr
		}
		resv, err = s.m.AllocateStriped(n, ways)
	}
	return resv, err
}

// reservedChunks is the blocks a set of reservations holds.
func reservedChunks(resv []objmap.Reservation) int {
	n := 0
	for _, r := range resv {
		n += r.Chunks
	}
	return n
}

// minStripeLayerBytes is the smallest per-layer object a save is cut into
// runs for: a restore reads each (layer, run) with one read, which must stay
// large for the devices to run at their rate.
const minStripeLayerBytes = 1 << 20

// saveWays is how many runs a save of chunks blocks is cut into: one per
// directory (a run is written and read on one device, so a save in one run
// moves at one device's rate however many there are), fewer when the runs'
// per-layer objects would fall below minStripeLayerBytes.
func (s *Store) saveWays(chunks int) int {
	byBytes := int64(chunks) * s.geo.ChunkBytesPerLayer() / minStripeLayerBytes
	return int(max(1, min(int64(len(s.cfg.Dirs)), int64(chunks), byBytes)))
}

// deviceOf maps a pool file to its device: file i lies in directory i%dirs.
func (s *Store) deviceOf(file int) int { return file % len(s.cfg.Dirs) }

func (sv *Save) abortIDs(ids []uint64) {
	if len(ids) == 0 {
		return
	}
	dropped, err := sv.s.idx.Abort(ids)
	if err != nil {
		panic(fmt.Sprintf("runtime: aborting a save's reservation: %v", err))
	}
	sv.s.cat.Release(dropped)
}

// abortRuns gives up runs[i:] that are not done: their index reservations
// are aborted at once (nothing of them is ever served), their objmap
// reservations once no write of theirs is left (remaining and inflight per
// run; nil when none was ever dispatched).
func (sv *Save) abortRuns(i int, cause SkipCause, remaining, inflight []int) {
	var ids []uint64
	blocks := 0
	for j, r := range sv.runs[i:] {
		if r.done || r.mapAbort {
			continue
		}
		r.skip = true
		ids = append(ids, sv.chain[r.chainPos:r.chainPos+r.res.Chunks]...)
		blocks += r.res.Chunks
		if r.resGone {
			r.done = true
		} else if remaining == nil || (remaining[i+j] == 0 && inflight[i+j] == 0) {
			_ = sv.s.m.Abort(r.res)
			r.done = true
		} else {
			r.mapAbort = true
		}
	}
	sv.abortIDs(ids)
	sv.skip(cause, blocks)
}

func (sv *Save) runOf(reqID uint64) int {
	for i, r := range sv.runs {
		if r.reqID == reqID {
			return i
		}
	}
	panic(fmt.Sprintf("runtime: write for unknown save request %d", reqID))
}
