package runtime

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/catalog"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/sched"
	"github.com/tutti-io/tutti/uring"
)

// MissCause says why a cached block was not restored.
type MissCause uint8

const (
	MissIOError   MissCause = iota // a read failed (EIO, ...)
	MissShortRead                  // a read returned fewer bytes than the object holds
	MissCRC                        // the restored object did not match its header's CRC32C
	MissNotFound                   // the index named a run the object map no longer has
	MissClosed                     // the store was closing
	MissGPU                        // the GPU refused or failed the restore as a whole
	numMissCauses
)

func (c MissCause) String() string {
	switch c {
	case MissIOError:
		return "io-error"
	case MissShortRead:
		return "short-read"
	case MissCRC:
		return "crc"
	case MissNotFound:
		return "not-found"
	case MissClosed:
		return "closed"
	case MissGPU:
		return "gpu"
	}
	return fmt.Sprintf("MissCause(%d)", uint8(c))
}

// loadRun is one run of the loaded prefix: its chunks [first, first+k) are
// restored into the pages of chain positions [chainPos, chainPos+k).
type loadRun struct {
	run      *catalog.Run
	first, k int
	chainPos int
}

// segment is what one staging slot holds: part of one (layer, run) read
// (a dispatched sched.IO). Saves stage in write buffers (wbuf) instead.
type segment struct {
	io   sched.IO
	span objmap.Span // the (layer, run) read this segment is part of
	// objOff is where the staged bytes start, relative to the span's read;
	// ioBytes are transferred (BlockBytes-aligned).
	objOff, ioBytes int64
	last            bool // last segment of its sched.IO
	// direct: the payload was read into the pages, not the slot
	// (loaddirect.go).
	direct bool
	// split is the read's verification state when it takes several
	// segments (nil when one slot holds it whole).
	split *splitRead
}

// Load is one restore in progress. WaitLayer(l) returns once layer l of the
// loaded blocks is in the KV memory (layers complete in order), Wait once all
// are. Blocks says how many leading chain blocks were restored: it only
// decreases while the load runs (a failed run turns it and every later run
// into a miss) and is final after Wait. The pages of blocks past Blocks()
// hold unspecified bytes and must be recomputed.
type Load struct {
	s     *Store
	chain []uint64
	pages []int32
	runs  []loadRun

	pinned  int // chain[:pinned] is pinned in the index until the load ends
	skip    int // chain[:skip] are the engine's own blocks (LoadOptions.Skip)
	planned int // blocks the plan chose to load (≤ cached)
	plan    sched.Plan

	ios      chan sched.IO // reads dispatched by the scheduler
	burst    []sched.IO    // scratch of takeReads (driver goroutine)
	consumed chan consumed // reads the consume pool finished; room for every read
	done     chan *slot    // completed reads; room for every slot

	mu        sync.Mutex
	cond      sync.Cond
	ready     int // layers complete
	finished  bool
	validRuns int // runs[:validRuns] are good so far
	err       error

	// Touched by the driver goroutine only.
	remaining                      []int // per layer: reads not finished
	readsLeft                      int
	overreadBytes, ioCount, splits int64
	firstNs                        int64     // GPU path: when the restore was submitted
	batches                        []ioBatch // CPU path: the reads per device, for the device models

	missBlocks [numMissCauses]int64 // mu (resolve fills it before the driver starts)

	// PathGPU: the scheduler's IORestore of the load (driver), the
	// restore on the GPU (mu; nil until submitted and after release),
	// gpuEnded once it will not be (mu), and the load's error (driver);
	// gpuPieces are the request's extents (gpuRequest).
	gpuIO     sched.IO
	gpuPieces []gpuPiece
	gpuX      gpuRestore
	gpuEnded  bool
	gpuErr    error
	failure   error // the first cause of a miss (mu)
}

// Blocks is the number of leading chain blocks restored (final after Wait).
func (l *Load) Blocks() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.blocksLocked()
}

func (l *Load) blocksLocked() int {
	n := 0
	for _, r := range l.runs[:l.validRuns] {
		n += r.k
	}
	return n
}

// Failure returns the first error that turned a run into a miss (nil when
// none did): for diagnostics; the misses themselves are in Blocks and Stats.
func (l *Load) Failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failure
}

// Planned is the number of leading blocks the scheduler chose to load; the
// cached blocks after them are cheaper to recompute than to load.
func (l *Load) Planned() int { return l.planned }

// Cached is the number of chain blocks after the skipped ones that the
// index had (and pinned) when the load started.
func (l *Load) Cached() int { return max(0, l.pinned-l.skip) }

// WaitLayer blocks until layer is restored (or the load ended). The error is
// about the load as a whole (store closing); a run that failed is not an
// error here but a shorter Blocks().
func (l *Load) WaitLayer(layer int) error {
	if layer < 0 || layer >= l.s.geo.Layers {
		return fmt.Errorf("runtime: WaitLayer(%d): layer out of range [0, %d)", layer, l.s.geo.Layers)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.ready <= layer && !l.finished {
		l.cond.Wait()
	}
	return l.err
}

// Wait blocks until the load ended; then Blocks is final.
func (l *Load) Wait() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for !l.finished {
		l.cond.Wait()
	}
	return l.err
}

// failRuns turns run index r and everything after it into a miss; why is
// kept for Failure.
func (l *Load) failRuns(r int, cause MissCause, why error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r >= l.validRuns {
		return
	}
	if l.failure == nil {
		l.failure = fmt.Errorf("run %d of the load (chain block %d): %s: %w", r, l.runs[r].chainPos, cause, why)
	}
	for _, x := range l.runs[r:l.validRuns] {
		l.missBlocks[cause] += int64(x.k)
	}
	l.validRuns = r
}

func (l *Load) runValid(r int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return r < l.validRuns
}

// finishRead retires one (layer, run) read and marks layers ready in order.
func (l *Load) finishRead(io sched.IO) {
	l.remaining[io.Layer]--
	l.readsLeft--
	l.s.sched.Complete(io, l.readsLeft == 0)
	l.mu.Lock()
	advanced := false
	for l.ready < len(l.remaining) && l.remaining[l.ready] == 0 {
		l.ready++
		advanced = true
	}
	l.mu.Unlock()
	if advanced {
		l.cond.Broadcast()
	}
}

// span is the one read of (layer, run): exactly the loaded chunks
// [first, first+k), rounded out to O_DIRECT blocks; each chunk is verified
// against its own CRC32C from the run's chunk table.
func (l *Load) span(r loadRun, layer int) objmap.Span {
	sp, err := objmap.ChunkSpan(l.s.geo, r.run.Chunks, layer, r.first, r.k)
	if err != nil {
		// resolve only builds runs inside their extent.
		panic(fmt.Sprintf("runtime: span of run %d layer %d chunks [%d,+%d): %v", r.run.ID, layer, r.first, r.k, err))
	}
	return sp
}

// drive is the load's goroutine: it stages and submits the reads the
// scheduler dispatches (as many as staging slots allow) by deadline and
// layer across devices (insertRead), hands completed segments to the
// store's consume pool (verified and scattered there, a split read's
// segments in any order: splitread.go), and marks layers ready. It holds at
// least one slot whenever it waits for one, and its oldest segment always
// completes, so loads never deadlock on staging.
func (l *Load) drive() {
	s := l.s
	slotBytes := s.staging.slotBytes
	queue := make([]sched.IO, 0, len(l.plan.Reads)) // dispatched, not yet fully submitted
	ring := make([]*slot, 0, len(s.staging.all))    // submitted, not yet handed to the pool
	var off int64                                   // progress within queue[0]
	var split *splitRead                            // queue[0]'s, when it is split
	segs := 0
	for _, io := range l.plan.Reads {
		segs += int((l.span(l.runs[io.Run], io.Layer).IOBytes + slotBytes - 1) / slotBytes)
	}
	l.consumed = make(chan consumed, segs) // room for every segment: workers never block
	inPool := 0                            // segments handed to the pool and not yet back
	for l.readsLeft > 0 {
		for len(queue) > 0 {
			io := queue[0]
			r := l.runs[io.Run].run
			if off == 0 && !l.runValid(io.Run) {
				queue = queue[1:]
				l.finishRead(io)
				continue
			}
			var sl *slot
			if len(ring) == 0 {
				sl = s.staging.acquire()
			} else if sl = s.staging.tryAcquire(); sl == nil {
				break
			}
			sp := l.span(l.runs[io.Run], io.Layer)
			seg := segment{io: io, span: sp, objOff: off, ioBytes: min(slotBytes, sp.IOBytes-off)}
			if sp.IOBytes > slotBytes {
				if off == 0 {
					split = l.newSplit(r, sp, int((sp.IOBytes+slotBytes-1)/slotBytes))
				}
				seg.split = split
			}
			off += seg.ioBytes
			if off == sp.IOBytes {
				seg.last = true
				queue, off, split = queue[1:], 0, nil
			}
			sl.sink, sl.completed = l.done, false
			l.prepRead(sl, &seg, l.runs[io.Run], r.File, uint64(r.Offset+sp.Off+seg.objOff))
			sl.tag = seg
			ring = append(ring, sl)
			l.ioCount++
			batchOf(&l.batches, l.runs[io.Run].run.Device).start(s.sched.NowNs(), seg.ioBytes)
			if seg.objOff > 0 {
				l.splits++
			}
			s.worker.Submit(&sl.req)
		}
		if len(ring) == 0 && len(queue) == 0 && inPool == 0 {
			if l.readsLeft == 0 {
				break
			}
			queue = l.takeReads(queue, false, <-l.ios)
			continue
		}
		if i := slices.IndexFunc(ring, func(sl *slot) bool { return sl.completed }); i >= 0 {
			// Any completed segment goes on at once (the pool verifies and
			// scatters in any order): waiting for the oldest left finished
			// slots idle behind a read still in flight on a slower device.
			sl := ring[i]
			ring = slices.Delete(ring, i, i+1)
			inPool++
			s.consumers.submit(consumeJob{l: l, sl: sl})
			continue
		}
		select {
		case io := <-l.ios:
			queue = l.takeReads(queue, off > 0, io)
		case sl := <-l.done:
			sl.completed = true
		case c := <-l.consumed:
			inPool--
			l.overreadBytes += c.overreadBytes
			if c.readDone {
				l.finishRead(c.io)
			}
		}
	}
	// One batch per device: busy time is the span in which its reads were
	// in flight, which is what the device model wants (not per-read
	// latencies, which include queueing behind each other).
	for dev, b := range l.batches {
		if b.ops > 0 {
			l.s.sched.ObserveReads(dev, b.bytes, int(b.ops), s.sched.NowNs()-b.firstNs)
		}
	}
	l.finish()
}

// newSplit starts the check of a split read of span sp of run r in segs
// segments.
func (l *Load) newSplit(r *catalog.Run, sp objmap.Span, segs int) *splitRead {
	sr, err := newSplitRead(r.Info.LayerChunkCRCs(sp.Layer), sp, segs)
	if err != nil {
		panic(fmt.Sprintf("runtime: run %d: %v", r.ID, err)) // recovery and commit keep every run's chunk CRCs
	}
	return sr
}

// takeReads adds io and every other read dispatched to the load so far (a
// dispatch round whole: the scheduler routes a round's reads one by one) to
// queue, so the order among them is decided before any is submitted.
func (l *Load) takeReads(queue []sched.IO, keepHead bool, io sched.IO) []sched.IO {
	queue = insertRead(queue, keepHead, io)
	l.burst = l.s.sched.TakeRouted(l.ios, l.burst[:0])
	for _, io := range l.burst {
		queue = insertRead(queue, keepHead, io)
	}
	return queue
}

// insertRead adds a dispatched read to the reads waiting for staging, in
// submission order: by deadline (the scheduler's least slack first), then
// layer, then run. The scheduler dispatches per device, each device's reads
// in deadline order but one device after another; submitted as they came,
// a load striped over several devices would read one device's share of many
// layers before the next device's first layer (layer 0 ready only after
// most of the load was read, the devices taking turns instead of reading
// together). keepHead holds queue[0] in place (it is partly submitted).
func insertRead(queue []sched.IO, keepHead bool, io sched.IO) []sched.IO {
	lo := 0
	if keepHead && len(queue) > 0 {
		lo = 1
	}
	i := lo + sort.Search(len(queue)-lo, func(j int) bool { return readBefore(io, queue[lo+j]) })
	queue = append(queue, sched.IO{})
	copy(queue[i+1:], queue[i:])
	queue[i] = io
	return queue
}

// readBefore orders reads for submission: deadline, layer, run.
func readBefore(a, b sched.IO) bool {
	if a.DeadlineNs != b.DeadlineNs {
		return a.DeadlineNs < b.DeadlineNs
	}
	if a.Layer != b.Layer {
		return a.Layer < b.Layer
	}
	return a.Run < b.Run
}

// consumeSegment verifies and scatters a completed segment on a consume
// pool worker, releases its slot and tells the driver, with readDone once
// the segment was its read's last to be consumed.
func (l *Load) consumeSegment(sl *slot) {
	var over int64
	done := true
	if sl.tag.split == nil {
		over = l.consumeWhole(sl)
	} else {
		over, done = l.consumeSplit(sl)
	}
	io := sl.tag.io // the slot is another request's once released
	l.s.staging.release(sl)
	l.consumed <- consumed{io: io, overreadBytes: over, readDone: done}
}

// consumeWhole checks a segment that holds its whole read, verifies its
// chunks and scatters its payload. It returns the read's overread bytes
// (alignment slack).
func (l *Load) consumeWhole(sl *slot) (overreadBytes int64) {
	seg := &sl.tag
	sp := &seg.span
	r := l.runs[seg.io.Run]
	ver, err := r.run.Info.NewChunkVerifier(*sp)
	if err != nil {
		panic(fmt.Sprintf("runtime: %v", err)) // recovery and commit keep every run's chunk CRCs
	}
	if !l.scatter(sl, &ver) {
		return 0
	}
	if err := ver.Done(); err != nil {
		l.failRuns(seg.io.Run, MissCRC, fmt.Errorf("run %d: %w", r.run.ID, err))
		return 0
	}
	return sp.IOBytes - sp.DataBytes
}

// consumeSplit checks one segment of a split read, scatters its payload and
// hands the CRCs of its chunk pieces to the read's check. done reports that
// it was the read's last segment to be consumed; the overread bytes are
// the read's, returned with done.
func (l *Load) consumeSplit(sl *slot) (overreadBytes int64, done bool) {
	seg := &sl.tag
	sp := &seg.span
	r := l.runs[seg.io.Run]
	lo := max(seg.objOff, sp.Skip)
	crcs := segCRCs{next: lo - sp.Skip, chunkBytes: sp.ChunkBytes}
	ok := l.scatter(sl, &crcs)
	done, err := seg.split.add(crcs.pieces, !ok)
	if err != nil {
		if ok {
			l.failRuns(seg.io.Run, MissCRC, fmt.Errorf("run %d: %w", r.run.ID, err))
			ok = false
		}
		// Whether or not this segment's run had failed already: the read
		// must not count as done before its bad run left the index.
		if errors.Is(err, objmap.ErrChunkCRC) {
			l.s.dropCorrupt(r.run)
		}
	}
	if done && ok && l.runValid(seg.io.Run) {
		return sp.IOBytes - sp.DataBytes, true
	}
	return 0, done
}

// chunkChecker takes a segment's payload bytes in order (a chunk verifier
// of a whole read, the piece CRCs of a split one).
type chunkChecker interface {
	Update(p []byte) error
}

// scatter checks that sl's read completed whole and copies its payload into
// the KV pages through ck. false: the run failed (now or before) and the
// segment's bytes were not used.
func (l *Load) scatter(sl *slot, ck chunkChecker) bool {
	seg := &sl.tag
	sp := &seg.span
	run := seg.io.Run
	r := l.runs[run]
	if !l.runValid(run) {
		return false
	}
	req := &sl.req
	switch {
	case req.Err != nil:
		l.failRuns(run, missCauseOf(req.Err), req.Err)
		return false
	case req.Result != seg.ioBytes:
		l.failRuns(run, MissShortRead, fmt.Errorf("read %d of %d bytes at span offset %d", req.Result, seg.ioBytes, seg.objOff))
		return false
	}
	// The payload inside this segment: [lo, hi) of the read.
	lo := max(seg.objOff, sp.Skip)
	hi := min(seg.objOff+seg.ioBytes, sp.Skip+sp.DataBytes)
	if lo < hi {
		pages := l.pages[r.chainPos*l.s.geo.ChunkPages:]
		var err error
		if seg.direct {
			err = l.s.kv.checkPages(seg.io.Layer, pages, lo-sp.Skip, hi-sp.Skip, ck)
		} else {
			err = l.s.kv.restorePages(seg.io.Layer, pages, lo-sp.Skip, hi-sp.Skip, sl.data[lo-seg.objOff:hi-seg.objOff], ck)
		}
		if err != nil {
			l.failRuns(run, MissCRC, fmt.Errorf("run %d: %w", r.run.ID, err))
			l.s.dropCorrupt(r.run)
			return false
		}
	}
	return true
}

func missCauseOf(err error) MissCause {
	if errors.Is(err, ring.ErrClosed) || errors.Is(err, uring.ErrClosed) {
		return MissClosed
	}
	return MissIOError
}

func (l *Load) finish() {
	l.mu.Lock()
	blocks := l.blocksLocked()
	l.mu.Unlock()
	// Account and unpin before Wait returns, so the caller's next Stats or
	// Lookup sees this load whole.
	l.s.loadFinished(l, blocks)
	l.mu.Lock()
	l.finished = true
	l.mu.Unlock()
	l.cond.Broadcast()
	<-l.s.loadN
	l.s.endOp()
}
