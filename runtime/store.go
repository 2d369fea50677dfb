package runtime

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/catalog"
	"github.com/tutti-io/tutti/runtime/internal/devprobe"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
	"github.com/tutti-io/tutti/runtime/internal/lrufile"
	"github.com/tutti-io/tutti/runtime/internal/prewrite"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/sched"
)

// Sentinel errors callers branch on.
var (
	// ErrClosed: the store is closed (or closing).
	ErrClosed = errors.New("runtime: store closed")
	// ErrNoKV: Load or Save before RegisterKV.
	ErrNoKV = errors.New("runtime: no KV memory registered")
	// ErrBusy: MaxLoads loads are in flight; the caller recomputes or retries.
	ErrBusy = errors.New("runtime: too many loads in flight")
	// ErrBadRequest: a chain or block table that does not fit the store.
	ErrBadRequest = errors.New("runtime: bad request")
	// ErrSavesFailed: WaitSaves found saves that lost blocks to a failed
	// write, sync or journal append (a full disk: unix.ENOSPC is in the
	// chain); the store stays usable.
	ErrSavesFailed = errors.New("runtime: saves failed")
)

// RecoveryReport is what Open found: objmap's report (runs recovered and
// dropped by the object map) plus what the runtime rebuilt into its index.
type RecoveryReport struct {
	Map objmap.RecoveryReport
	// IndexedRuns and IndexedBlocks were rebuilt into the prefix index.
	IndexedRuns, IndexedBlocks int
	// DroppedRuns were recovered by the object map but not served: their
	// parent is not stored, they carry no chunk CRCs, an earlier run serves
	// all their blocks, or the index refused them. Each is freed;
	// DroppedReasons says why.
	DroppedRuns    int
	DroppedReasons []string
	// TrimmedBlocks are blocks of recovered runs that left the index before
	// Close (evicted, discarded) and are not served again.
	TrimmedBlocks int
	// DuplicateBlocks are blocks a run holds that an earlier run serves:
	// only after a crash lost the earlier run's trim (see recover.go); the
	// run serves the blocks after them. RefusedBlocks are blocks the index
	// refused in the middle of a run (a collision of ids); the run is
	// trimmed before them.
	DuplicateBlocks, RefusedBlocks int
	// EvictedAtOpen are blocks evicted at Open because the recovered blocks
	// exceeded the index's capacity (only after a crash brought back
	// dropped blocks), least recently used first.
	EvictedAtOpen int
	// LRURestored is how many blocks took the eviction order saved by the
	// last Close (package lrufile); LRUNote says why none did, if the file was
	// there but unusable.
	LRURestored int
	LRUNote     string
}

// Store is an open tutti store. All methods are safe for concurrent use.
type Store struct {
	cfg     Config
	geo     kvshape.Geometry
	m       *objmap.Map
	idx     *kvmeta.Index // the prefix index; publishes KV events with Config.KVEvents
	worker  *ring.Worker
	staging *stagingPool
	// stager gathers, checksums and submits save writes; saveSlotTokens
	// holds one token per staging slot the saves hold (at most saveSlots).
	stager         *workerPool[stageJob]
	saveSlots      int
	saveSlotTokens chan struct{}
	// consumers verify and scatter completed load reads (PathCPU; nil on
	// PathGPU, which does not stage its reads here).
	consumers *workerPool[consumeJob]
	sched     *iosched.Scheduler
	kv        *kvViews // set once by RegisterKV (PathCPU)
	gpu       *gpuPath // set once by RegisterKV (PathGPU)
	kvSet     atomic.Bool

	cat *catalog.Catalog // the runs the index serves, kept consistent with the map

	mu     sync.Mutex
	closed bool
	ops    sync.WaitGroup // loads and saves in flight
	// savesLive counts saves not ended; savesCond (on mu) wakes WaitSaves.
	// (A WaitGroup would forbid a Save racing with WaitSaves.)
	savesLive int
	savesCond sync.Cond
	loadN     chan struct{} // MaxLoads tokens
	// holds counts live Holds (Match); holdsExpired those ended by their
	// time to live.
	holds        int
	holdsExpired atomic.Int64

	report          RecoveryReport
	stats           counters
	fails           saveFailures
	maxWriteIOBytes int64              // the scheduler's write size: at most one staging slot
	fallbackReason  string             // set by OpenWithFallback before the store is shared
	gpuReads        GPUReads           // Stats.GPU.Reads, set by Open
	devProbes       []DeviceProbe      // Stats.Devices.Probes, set by Open
	reprobe         *devprobe.Reprober // re-measures probed devices (nil: Open did not probe them)
	pre             *prewrite.Prewriter
}

// CapacityForBlocks is a CapacityBytes with which the store holds at least
// blocks chain blocks of g however they are grouped into runs: the index
// admits them (payload over the index's share of the pool) and the pool has
// room for them as runs of one block (the worst case for headers and
// padding), plus 1 MiB for rounding the pool files.
func CapacityForBlocks(g kvshape.Geometry, blocks int) int64 {
	index := int64(float64(blocks) * float64(g.ChunkBytes()) / catalog.IndexShare)
	pool := int64(blocks) * objmap.RunBytes(g, 1)
	return max(index, pool) + 1<<20
}

// Recovery returns the report of the recovery done by Open.
func (s *Store) Recovery() RecoveryReport { return s.report }

// Config returns the configuration in use (defaults filled in).
func (s *Store) Config() Config { return s.cfg }

// Geometry returns the store's KV shape.
func (s *Store) Geometry() kvshape.Geometry { return s.geo }

// RegisterKV gives the store the engine's KV memory; it must be called once,
// before the first Load or Save. The memory must stay valid until Close.
func (s *Store) RegisterKV(kv KVMemory) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.kvSet.Load() {
		return fmt.Errorf("%w: RegisterKV called twice", ErrKV)
	}
	if s.cfg.Path == PathGPU {
		gp, err := s.bindGPU(kv)
		if err != nil {
			return err
		}
		s.gpu = gp
	} else {
		v, err := newKVViews(s.geo, s.cfg.Layout, s.cfg.NumPages, kv)
		if err != nil {
			return err
		}
		s.kv = v
	}
	s.kvSet.Store(true)
	return nil
}

// checkRequest validates a chain and its block table: pages holds the
// engine's page ids of the chain's blocks, ChunkPages per block in order.
func (s *Store) checkRequest(op string, chain []uint64, pages []int32) error {
	if !s.kvSet.Load() {
		return fmt.Errorf("runtime: %s: %w", op, ErrNoKV)
	}
	if len(chain) == 0 {
		return fmt.Errorf("runtime: %s: empty chain: %w", op, ErrBadRequest)
	}
	if want := len(chain) * s.geo.ChunkPages; len(pages) != want {
		return fmt.Errorf("runtime: %s: %d chain blocks need %d page ids, got %d: %w", op, len(chain), want, len(pages), ErrBadRequest)
	}
	for i, p := range pages {
		if p < 0 || int(p) >= s.cfg.NumPages {
			return fmt.Errorf("runtime: %s: pages[%d] = %d out of range [0, %d): %w", op, i, p, s.cfg.NumPages, ErrKV)
		}
	}
	return nil
}

// begin registers an operation unless the store is closing.
func (s *Store) begin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.ops.Add(1)
	s.pre.Begin()
	return nil
}

// endOp ends an operation begin registered.
func (s *Store) endOp() {
	s.pre.End()
	s.ops.Done()
}

// WaitPrewrite blocks until the background prewrite has ended (done,
// stopped, or never started) or timeout passed, and says whether it ended.
func (s *Store) WaitPrewrite(timeout time.Duration) bool { return s.pre.Wait(timeout) }

// Lookup returns how many leading blocks of chain are cached (resident). It
// does no I/O and pins nothing: a later Load may find fewer.
func (s *Store) Lookup(chain []uint64) int {
	n := s.idx.Lookup(chain)
	s.stats.lookups.Add(1)
	s.stats.lookupBlocks.Add(int64(len(chain)))
	s.stats.hitBlocks.Add(int64(n))
	return n
}

// Load restores the cached prefix of chain into the pages of its block table
// (pages[i*ChunkPages+j] is page j of chain block i) and returns at once; the
// reads run in the background, layer by layer. The scheduler may load fewer
// blocks than are cached (Load.Planned) when recomputing the rest is faster.
// The pages of the loaded blocks must not be used before WaitLayer; the
// store holds no reference to chain or pages after Wait.
func (s *Store) Load(chain []uint64, pages []int32) (*Load, error) {
	return s.LoadWith(chain, pages, LoadOptions{})
}

// LoadWith is Load with options (see LoadOptions): with opts.Skip = k the
// first k blocks of chain are the engine's own (local hits) and are neither
// read nor written, pages holds the block table of chain[k:] only, and
// Blocks, Planned and Cached count blocks after the skipped ones.
func (s *Store) LoadWith(chain []uint64, pages []int32, opts LoadOptions) (*Load, error) {
	if opts.Skip != 0 && (opts.Skip < 0 || opts.Skip >= len(chain)) { // skip 0 of an empty chain: checkRequest names it
		return nil, fmt.Errorf("runtime: load: skip %d of a %d-block chain: %w", opts.Skip, len(chain), ErrBadRequest)
	}
	if err := s.checkRequest("load", chain[opts.Skip:], pages); err != nil {
		return nil, err
	}
	select {
	case s.loadN <- struct{}{}:
	default:
		return nil, ErrBusy
	}
	if err := s.begin(); err != nil {
		<-s.loadN
		return nil, err
	}
	l := &Load{s: s, chain: chain, pages: pages, skip: opts.Skip, done: make(chan *slot, len(s.staging.all))}
	l.cond.L = &l.mu
	var locs []uint64
	l.pinned, locs = s.idx.Pin(chain, nil)
	l.runs = s.resolveAfter(chain, locs, l.pinned, opts.Skip, &l.missBlocks)
	cached := 0
	for _, r := range l.runs {
		cached += r.k
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
	if s.gpu != nil && len(l.runs) > 0 {
		l.startGPU()
		return l, nil
	}
	if l.readsLeft == 0 {
		l.mu.Lock()
		l.ready = s.geo.Layers
		l.mu.Unlock()
		l.finish()
		return l, nil
	}
	go l.drive()
	return l, nil
}

// planReads has the scheduler plan the load of its cached blocks and keeps the
// runs the plan loads. On PathGPU the request is cut first to what one GPU
// restore takes (gpuCut; the rest is computed like an uncached suffix) and
// planned Whole: the scheduler dispatches the restore as one job that holds
// its devices' reads until the GPU reports the layers done.
func (l *Load) planReads(cached int, opts LoadOptions) error {
	s := l.s
	runs := l.runs
	if s.gpu != nil {
		runs = keepBlocks(runs, s.gpuCut(runs, cached))
	}
	req := s.loadRequest(runs, len(l.chain)-opts.Skip)
	req.ComputeReadyNs = opts.computeReadyNs()
	req.QueueUnknown = req.ComputeReadyNs == 0 // the store never sees the engine's GPU queue
	req.Whole, req.SegmentsOnly = s.gpu != nil, s.gpu != nil
	l.ios = make(chan sched.IO, max(1, s.geo.Layers*len(runs)))
	plan, err := s.sched.PlanLoad(req, l.ios)
	if err != nil {
		return err
	}
	l.plan, l.planned = plan, plan.LoadBlocks
	s.maybeReprobe(runs, plan)
	l.runs = keepBlocks(runs, plan.LoadBlocks)
	if s.gpu != nil {
		return nil
	}
	l.remaining = make([]int, s.geo.Layers)
	for _, io := range plan.Reads {
		l.remaining[io.Layer]++
	}
	l.readsLeft = len(plan.Reads)
	return nil
}

// loadRequest is the scheduler's request for runs of a chain of blocks
// blocks (those after the runs are computed).
func (s *Store) loadRequest(runs []loadRun, blocks int) sched.LoadRequest {
	req := sched.LoadRequest{}
	for _, r := range runs {
		blocks -= r.k
		req.Runs = append(req.Runs, sched.Run{Device: r.run.Device, Blocks: r.k, BytesPerLayerPerBlock: s.geo.ChunkBytesPerLayer()})
	}
	req.UncachedTokens = blocks * s.geo.ChunkPages * s.geo.PageTokens
	return req
}

// keepBlocks is the leading runs that hold n blocks, the last one cut to
// them (in place).
func keepBlocks(runs []loadRun, n int) []loadRun {
	kept, k := runs[:0], 0
	for _, r := range runs {
		if k >= n {
			break
		}
		r.k = min(r.k, n-k)
		k += r.k
		kept = append(kept, r)
	}
	return kept
}

// resolve maps the pinned blocks to runs (catalog.Resolve); a block whose
// run is unknown ends the prefix (counted as MissNotFound).
func (s *Store) resolve(chain, locs []uint64, miss *[numMissCauses]int64) []loadRun {
	spans, notFound := s.cat.Resolve(chain, locs)
	miss[MissNotFound] += int64(notFound)
	var runs []loadRun
	for _, sp := range spans {
		runs = append(runs, loadRun{run: sp.Run, first: sp.First, k: sp.K, chainPos: sp.ChainPos})
	}
	return runs
}

// loadFinished accounts a finished load and releases its pins.
func (s *Store) loadFinished(l *Load, blocks int) {
	if l.pinned > 0 {
		dropped, err := s.idx.Unpin(l.chain[:l.pinned])
		if err != nil {
			// Only a runtime bug gets here: pins are taken and released in pairs.
			panic(fmt.Sprintf("runtime: unpinning a finished load: %v", err))
		}
		s.cat.Release(dropped)
	}
	st := &s.stats
	st.restoredBlocks.Add(int64(blocks))
	st.restoredBytes.Add(int64(blocks) * s.geo.ChunkBytes())
	st.readIOs.Add(l.ioCount)
	st.splitIOs.Add(l.splits)
	st.overrd.Add(l.overreadBytes)
	l.mu.Lock()
	for i, n := range l.missBlocks {
		st.missBlocks[i].Add(n)
	}
	l.mu.Unlock()
}

// dropCorrupt takes a run whose payload failed its CRC out of service with
// everything cached below it (catalog.DropCorrupt), counted once.
func (s *Store) dropCorrupt(r *catalog.Run) {
	if s.cat.DropCorrupt(r) {
		s.stats.corruptDropped.Add(1)
	}
}

// WaitSaves blocks until every Save started so far ended. It returns an
// error wrapping ErrSavesFailed, and the last failure, when saves lost
// blocks to a failed write, sync or journal append (SkipENOSPC,
// SkipIOError) since the previous WaitSaves; blocks not admitted (cached,
// no room, budget, bound) are no error. Either way the store stays usable:
// saves resume by themselves once the disk has room again.
func (s *Store) WaitSaves() error {
	s.mu.Lock()
	for s.savesLive > 0 {
		s.savesCond.Wait()
	}
	s.mu.Unlock()
	return s.fails.take(&s.stats)
}

// Check verifies every stored run's header and payload (objmap's fsck) while
// the store is open.
func (s *Store) Check() (objmap.RecoveryReport, error) { return s.m.Check() }

// Close waits for loads and saves in flight, then stops the scheduler and
// the I/O worker, frees staging, makes the journal durable, keeps the
// eviction order for the next Open (package lrufile) and closes the object map.
// A Close that returns nil leaves a store whose next Open serves exactly
// the blocks this one served (recover.go); an error says what may differ
// (a journal the disk had no room for: blocks dropped since its last
// durable write may come back). Registered KV memory is no longer
// referenced after Close.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	s.mu.Unlock()
	s.ops.Wait()
	s.pre.Stop()
	s.sched.Close()
	var errs []error
	if s.gpu != nil {
		errs = append(errs, s.gpu.close())
	}
	if s.consumers != nil {
		s.consumers.close()
	}
	s.stager.close()
	errs = append(errs, s.worker.Close(), s.staging.close())
	// The order is kept only with a durable journal: it then names the
	// blocks the next Open finds.
	if s.m.Sync() == nil {
		if err := lrufile.Write(s.m.Dirs()[0], s.idx.LRU()); err != nil {
			errs = append(errs, fmt.Errorf("runtime: close: keeping the eviction order: %w", err))
		}
	}
	errs = append(errs, s.m.Close())
	errs = append(errs, s.idx.Close())
	return errors.Join(errs...)
}
