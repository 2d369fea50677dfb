package runtime

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tutti-io/tutti/runtime/internal/devprobe"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/sched"
)

// ErrNotGPU is returned by GPU-only calls (Load.StreamWaitLayer) on PathCPU.
var ErrNotGPU = errors.New("runtime: not on the GPU path")

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

// missCauses names the movers' misses as the store counts them.
var missCauses = [...]MissCause{mover.MissIOError: MissIOError, mover.MissShortRead: MissShortRead,
	mover.MissCRC: MissCRC, mover.MissClosed: MissClosed, mover.MissGPU: MissGPU}

// LoadOptions are what an engine that schedules ahead of its loads (vLLM)
// tells a Load beyond the chain and its block table.
type LoadOptions struct {
	// Skip is how many leading blocks of the chain the engine already has
	// (its local prefix-cache hits): they are not restored, their pages are
	// not touched, and the block table covers chain[Skip:] only.
	Skip int
	// Promised: the engine already counted these blocks as computed (Match
	// said so), so the planner does not trade any of them for recompute: it
	// loads every cached block it can admit. A promised block not restored
	// is a load error for the engine, where an unpromised one is a recompute.
	Promised bool
}

// promisedReadyNs is a compute start far enough ahead that every finish time
// the planner compares is dominated by compute: it then loads every block it
// admits (each loaded block shortens the compute that follows).
const promisedReadyNs = int64(1) << 40

func (o LoadOptions) computeReadyNs() int64 {
	if o.Promised {
		return promisedReadyNs
	}
	return 0
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
	// runs are the runs of the loaded prefix, as the mover reads them;
	// pin is the control path's pin of them (to drop a run when corrupt).
	runs []mover.Run
	pin  *pinned

	pinned  int // chain[:pinned] is pinned in the index until the load ends
	skip    int // chain[:skip] are the engine's own blocks (LoadOptions.Skip)
	planned int // blocks the plan chose to load (≤ cached)
	plan    sched.Plan
	ios     chan sched.IO      // where the scheduler routes the plan's I/O
	stream  mover.StreamWaiter // the restore's, where the mover has one

	mu         sync.Mutex
	cond       sync.Cond
	ready      int // layers complete
	finished   bool
	validRuns  int // runs[:validRuns] are good so far
	err        error
	failure    error                // the first cause of a miss
	missBlocks [numMissCauses]int64 // resolve fills it before the restore starts
	result     mover.Result         // the restore's, set at its end
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
		n += r.K
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

// Done reports, without blocking, whether the load ended: Wait would return
// at once and Blocks is final. On the GPU path the restored pages are then
// written on the device, so work the engine enqueues afterwards sees them.
func (l *Load) Done() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.finished
}

// StreamWaitLayer makes a CUDA stream wait until layer is in the KV tensors,
// with no host round trip (PathGPU only; ErrNotGPU otherwise). A failed
// entry leaves its pages unwritten; Blocks after Wait says how far the load
// really got. For a layer far ahead it first blocks the host until the
// layer is on the GPU's streams (kernels enqueues layer l once layer
// l-EnqueueLayers, 16 to 48 layers back, is scattered), so call it layer by
// layer, as the engine computes. A restore the scheduler still holds back
// (queued saves would otherwise miss their bound) blocks the host until it
// is on the GPU.
func (l *Load) StreamWaitLayer(layer int, stream uintptr) error {
	if l.s.cfg.Path != PathGPU {
		return ErrNotGPU
	}
	if l.stream == nil {
		return nil // nothing to restore: the layer is as done as it gets
	}
	return l.stream.StreamWaitLayer(layer, stream)
}

// startLoad pins what the index has of chain, plans the load of it and
// hands the plan to the mover (begin was called).
func (s *Store) startLoad(chain []uint64, pages []int32, opts LoadOptions) (*Load, error) {
	l := &Load{s: s, chain: chain, pages: pages, skip: opts.Skip}
	l.cond.L = &l.mu
	l.pin = s.ctl.pin(chain, opts.Skip, &l.missBlocks)
	l.pin.ioBegin()
	l.pinned, l.runs = l.pin.n, l.pin.runs
	cached := 0
	for _, r := range l.runs {
		cached += r.K
	}
	s.stats.loads.Add(1)
	s.stats.cachedBlocks.Add(int64(l.Cached()))
	if cached > 0 {
		if err := l.planReads(cached, opts); err != nil {
			l.runs = nil
			l.finish()
			return nil, err
		}
	}
	s.stats.plannedBlocks.Add(int64(l.planned))
	l.validRuns = len(l.runs)
	if len(l.runs) == 0 {
		l.mu.Lock()
		l.ready = s.geo.Layers
		l.mu.Unlock()
		l.finish()
		return l, nil
	}
	l.stream = s.mv.Restore(&mover.Restore{Runs: l.runs, Pages: l.pages, Plan: l.plan, IOs: l.ios, Load: (*loader)(l)})
	return l, nil
}

// planReads has the scheduler plan the load of its cached blocks and keeps
// the runs the plan loads. The request is cut first to what one restore of
// the mover takes (the rest is computed like an uncached suffix); a mover
// whose restore is one job (Whole) has it planned so: the scheduler
// dispatches it as one IORestore that holds its devices' reads until the
// mover reports the layers done.
func (l *Load) planReads(cached int, opts LoadOptions) error {
	s := l.s
	n := s.mv.Cut(l.runs, cached)
	runs := keepBlocks(l.runs, n)
	req := s.loadRequest(runs, len(l.chain)-opts.Skip)
	req.ComputeReadyNs = opts.computeReadyNs()
	req.QueueUnknown = req.ComputeReadyNs == 0 // the store never sees the engine's GPU queue
	req.Whole, req.SegmentsOnly = s.mv.Whole(), s.mv.Whole()
	l.ios = make(chan sched.IO, max(1, s.geo.Layers*len(runs)))
	plan, err := s.sched.PlanLoad(req, l.ios)
	if err != nil {
		return err
	}
	l.plan, l.planned = plan, plan.LoadBlocks
	s.maybeReprobe(runs, plan)
	l.runs = keepBlocks(runs, plan.LoadBlocks)
	return nil
}

// loadRequest is the scheduler's request for runs of a chain of blocks
// blocks (those after the runs are computed).
func (s *Store) loadRequest(runs []mover.Run, blocks int) sched.LoadRequest {
	req := sched.LoadRequest{}
	for _, r := range runs {
		blocks -= r.K
		req.Runs = append(req.Runs, s.schedRun(r.Info.File, r.K))
	}
	req.UncachedTokens = blocks * s.geo.ChunkPages * s.geo.PageTokens
	return req
}

// keepBlocks is the leading runs that hold n blocks, the last one cut to
// them (in place).
func keepBlocks(runs []mover.Run, n int) []mover.Run {
	kept, k := runs[:0], 0
	for _, r := range runs {
		if k >= n {
			break
		}
		r.K = min(r.K, n-k)
		k += r.K
		kept = append(kept, r)
	}
	return kept
}

// schedRun is the scheduler's view of k blocks of the run whose home is
// pool file file: where the store's layout puts each layer (nil where a
// run lies on one device: every layer on the home file's).
func (s *Store) schedRun(file, k int) sched.Run {
	lay := s.layout()
	r := sched.Run{Device: lay.Device(file), Blocks: k, BytesPerLayerPerBlock: s.geo.ChunkBytesPerLayer()}
	if lay.Width() > 1 {
		r.LayerDevices = lay.LayerDevices(file)
	}
	return r
}

// maybeReprobe is called after every plan of runs: when the plan
// recomputes cached blocks because loading would not be faster, it asks
// for a re-probe of the device of the first block left out (its layer 0's;
// devprobe's Reprober decides whether that device's model is stale),
// reading the run's extent there. It never blocks.
func (s *Store) maybeReprobe(runs []mover.Run, plan sched.Plan) {
	if s.reprobe == nil || !devprobe.Wanted(plan) {
		return
	}
	loaded := plan.LoadBlocks
	for _, r := range runs {
		if loaded < r.K {
			loc, f := s.pool().Object(r, 0, 0)
			s.reprobe.Maybe(devprobe.Target{Device: loc.Device, FD: int(f.FD), Path: f.Path, Offset: r.Info.Offset, Length: r.Info.Length},
				s.begin, s.endOp)
			return
		}
		loaded -= r.K
	}
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
		l.failure = fmt.Errorf("run %d of the load (chain block %d): %s: %w", r, l.runs[r].ChainPos, cause, why)
	}
	for _, x := range l.runs[r:l.validRuns] {
		l.missBlocks[cause] += int64(x.K)
	}
	l.validRuns = r
}

// finish accounts the load, unpins its blocks and wakes its waiters.
func (l *Load) finish() {
	s := l.s
	l.mu.Lock()
	blocks := l.blocksLocked()
	l.mu.Unlock()
	// Account and unpin before Wait returns, so the caller's next Stats or
	// Lookup sees this load whole.
	if l.pin != nil {
		l.pin.ioEnd()
		s.ctl.unpin(l.pin)
	}
	st := &s.stats
	st.restoredBlocks.Add(int64(blocks))
	st.restoredBytes.Add(int64(blocks) * s.geo.ChunkBytes())
	st.readIOs.Add(l.result.IOs)
	st.splitIOs.Add(l.result.SplitIOs)
	st.overrd.Add(l.result.OverreadBytes)
	l.mu.Lock()
	for i, n := range l.missBlocks {
		st.missBlocks[i].Add(n)
	}
	l.finished = true
	l.mu.Unlock()
	l.cond.Broadcast()
	<-s.loadN
	s.endOp()
}

// loader is a Load as its restore sees it (mover.Loader): its methods are
// the load's, kept off Load's API.
type loader Load

func (x *loader) LayersDone(n int) {
	l := (*Load)(x)
	l.mu.Lock()
	advanced := n > l.ready
	l.ready = max(l.ready, n)
	l.mu.Unlock()
	if advanced {
		l.cond.Broadcast()
	}
}

func (x *loader) Fail(i int, cause mover.Miss, why error) {
	(*Load)(x).failRuns(i, missCauses[cause], why)
}

func (x *loader) Valid(i int) bool {
	l := (*Load)(x)
	l.mu.Lock()
	defer l.mu.Unlock()
	return i < l.validRuns
}

func (x *loader) Corrupt(i int) {
	l := (*Load)(x)
	if l.s.ctl.corrupt(l.pin, i) {
		l.s.stats.corruptDropped.Add(1)
	}
}

func (x *loader) Done(res mover.Result) {
	l := (*Load)(x)
	l.mu.Lock()
	l.result, l.err = res, res.Err
	l.mu.Unlock()
	l.finish()
}
