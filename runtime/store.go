package runtime

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/catalog"
	"github.com/tutti-io/tutti/runtime/internal/devprobe"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/kvmeta"
	"github.com/tutti-io/tutti/runtime/internal/lrufile"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu"
	"github.com/tutti-io/tutti/runtime/internal/prewrite"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/runtime/internal/savewrite"
	"github.com/tutti-io/tutti/runtime/internal/staging"
	"github.com/tutti-io/tutti/uring"
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

// Store is an open tutti store. All methods are safe for concurrent use.
type Store struct {
	cfg Config
	geo kvshape.Geometry
	// The store's parts, made by Open (open.go), each owning one job.
	m   *objmap.Map
	idx *kvmeta.Index    // the prefix index; publishes KV events with Config.KVEvents
	cat *catalog.Catalog // the runs the index serves, kept consistent with the map
	// ctl is the control path: m, idx and cat (localControl), or, with
	// m, idx and cat nil, a node service's (Connect: remoteControl).
	ctl     control
	remote  *remoteControl
	files   []*uring.File // the pool files this process reads and writes
	worker  *ring.Worker
	staging *staging.Pool
	sched   *iosched.Scheduler
	mv      mover.Mover // PathCPU's or PathGPU's
	gpu     *gpu.Mover  // mv on PathGPU (for Stats.GPU), else nil
	writes  *savewrite.Pipeline
	reprobe *devprobe.Reprober // re-measures probed devices (nil: Open did not probe them)
	pre     *prewrite.Prewriter
	kvSet   atomic.Bool

	mu     sync.Mutex
	closed bool
	ops    sync.WaitGroup // loads, saves and holds' calls in flight
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
	moved           mover.Counters
	fails           saveFailures
	maxWriteIOBytes int64         // the scheduler's write size: at most one staging slot
	fallbackReason  string        // set by OpenWithFallback before the store is shared
	gpuReads        GPUReads      // Stats.GPU.Reads, set by Open
	devProbes       []DeviceProbe // Stats.Devices.Probes, set by Open
}

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
	// only after a crash lost the earlier run's trim (see
	// runtime/internal/catalog); the run serves the blocks after them.
	// RefusedBlocks are blocks the index refused in the middle of a run (a
	// collision of ids); the run is trimmed before them.
	DuplicateBlocks, RefusedBlocks int
	// EvictedAtOpen are blocks evicted at Open because the recovered blocks
	// exceeded the index's capacity (only after a crash brought back
	// dropped blocks), least recently used first.
	EvictedAtOpen int
	// LRURestored is how many blocks took the eviction order saved by the
	// last Close (runtime/internal/lrufile); LRUNote says why none did, if
	// the file was there but unusable.
	LRURestored int
	LRUNote     string
}

// ResidentBlock is one block that is a hit, with its parent in the chain.
type ResidentBlock struct {
	ID        uint64
	Parent    uint64 // valid when HasParent
	HasParent bool
}

// CapacityForBlocks is a CapacityBytes with which the store holds at least
// blocks chain blocks of g however they are grouped into runs and however
// many directories it spreads them over: the index admits them (payload
// over the index's share of the pool's filled object slots) and the pool
// has room for them as runs of one block (the worst case for headers and
// padding: objmap.MaxFootprint), plus 1 MiB for rounding the pool files.
// CapacityForBlocksOn, for the directories a store is made over, is
// tighter.
func CapacityForBlocks(g kvshape.Geometry, blocks int) int64 {
	return capacityFor(g, blocks, objmap.MaxFootprint(g, 1), objmap.MinSlotFill(g))
}

// CapacityForBlocksOn is CapacityForBlocks for a new store of g over dirs
// directories (of the default run width there: objmap.RunWidth), whose
// runs take exactly what that layout gives them.
func CapacityForBlocksOn(g kvshape.Geometry, blocks, dirs int) int64 {
	lay, err := objmap.NewLayout(g, dirs, 1, 0)
	if err != nil {
		return CapacityForBlocks(g, blocks) // Open will say what is wrong
	}
	return capacityFor(g, blocks, lay.Footprint(1), lay.SlotFill())
}

// capacityFor is a capacity that holds blocks blocks whose runs of one take
// perBlock of the pool and whose layers fill the share fill of its object
// slots (catalog's index capacity).
func capacityFor(g kvshape.Geometry, blocks int, perBlock int64, fill float64) int64 {
	index := int64(float64(blocks) * float64(g.ChunkBytes()) / (catalog.IndexShare * fill))
	return max(index, int64(blocks)*perBlock) + 1<<20
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
	regions, err := kvRegions(s.geo, s.cfg.Layout, s.cfg.NumPages, kv)
	if err != nil {
		return err
	}
	if err := s.mv.Bind(moverRegions(regions)); err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	s.kvSet.Store(true)
	return nil
}

// Lookup returns how many leading blocks of chain are cached (resident). It
// does no I/O and pins nothing: a later Load may find fewer.
func (s *Store) Lookup(chain []uint64) int {
	n := s.ctl.Lookup(chain)
	s.stats.lookups.Add(1)
	s.stats.lookupBlocks.Add(int64(len(chain)))
	s.stats.hitBlocks.Add(int64(n))
	return n
}

// Resident returns how many leading blocks of chain are hits, like Lookup,
// but does not count the call in Stats (a group's bookkeeping, runtime/tp's,
// is not an engine lookup). It marks the hit blocks used, as Lookup does.
func (s *Store) Resident(chain []uint64) int { return s.ctl.Lookup(chain) }

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
	return s.startLoad(chain, pages, opts)
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
	return s.SaveWith(chain, pages, SaveOptions{})
}

// SaveWithMeta is Save with meta[i] for chain block i (SaveOptions.Meta).
func (s *Store) SaveWithMeta(chain []uint64, pages []int32, meta []BlockMeta) (*Save, error) {
	return s.SaveWith(chain, pages, SaveOptions{Meta: meta})
}

// SaveOptions are a save's optional inputs (SaveWith).
type SaveOptions struct {
	// Meta, if not nil, is chain block i's metadata at i, kept (bounded by
	// KVEvents.MaxTokenBytes) while the block is served and published
	// with it. Without Config.KVEvents it is checked and dropped. The
	// store copies it.
	Meta []BlockMeta
	// AfterEvent (PathGPU only, else ErrNotGPU), if not 0, is a
	// cudaEvent_t of the store's device, recorded on the engine's stream
	// where the pages' KV is written: the save's gathers copy the pages
	// only once it completed, so the engine's host need not wait for its
	// stream before saving. The caller keeps the event alive (not
	// destroyed; it may be recorded again only after) until Gathered.
	AfterEvent uintptr
}

// SaveWith is Save with opts.
func (s *Store) SaveWith(chain []uint64, pages []int32, opts SaveOptions) (*Save, error) {
	if opts.AfterEvent != 0 && s.cfg.Path != PathGPU {
		return nil, fmt.Errorf("runtime: save after a CUDA event: %w", ErrNotGPU)
	}
	var kept []kvmeta.Meta
	if opts.Meta != nil {
		var err error
		if kept, err = s.copyMeta(chain, opts.Meta); err != nil {
			return nil, err
		}
	}
	return s.save(chain, pages, kept, opts.AfterEvent)
}

// Match is the lookup of an engine that commits to a hit before it loads
// (vLLM's get_num_new_matched_tokens): it returns how many blocks after the
// first skip a promised load of chain restores, and holds them for ttl.
// Left out of the count, as blocks to compute rather than errors: blocks not
// cached, blocks the planner would rather recompute (it is asked as for a
// load now, nothing is read), and on PathGPU blocks past what one GPU
// restore takes (GPUMaxPages, GPUMaxRuns). The caller must Release the hold
// once the load started (the load pins for itself) or was dropped.
func (s *Store) Match(chain []uint64, skip int, ttl time.Duration) (*Hold, error) {
	if skip < 0 || skip > len(chain) {
		return nil, fmt.Errorf("runtime: match: skip %d of a %d-block chain: %w", skip, len(chain), ErrBadRequest)
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("runtime: match: ttl %v, want > 0: %w", ttl, ErrBadRequest)
	}
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.endOp()
	s.mu.Lock()
	if s.holds >= MaxHolds {
		s.mu.Unlock()
		return nil, fmt.Errorf("runtime: match: %d holds live: %w", MaxHolds, ErrBusy)
	}
	s.holds++
	s.mu.Unlock()
	return s.hold(chain, skip, ttl), nil
}

// Discard takes block id and every block cached below it (unreachable
// without it) out of service: from the return on, no Lookup or Load finds
// them. Blocks no load pins leave at once and their runs are freed once no
// block of theirs is indexed (a run of which only a tail was discarded stays
// on disk, serving its head; after a restart its tail is indexed again, which
// is correct data, so a group must re-check it: see runtime/tp). Pinned or
// pending blocks drain and are freed by the Unpin or Commit that releases
// them last. It returns the blocks that left at once; an error wrapping
// prefix.ErrNotFound when id is not in the index, ErrClosed after Close.
func (s *Store) Discard(id uint64) (int, error) {
	if err := s.begin(); err != nil {
		return 0, err
	}
	defer s.endOp()
	n, err := s.ctl.discard(id)
	if err != nil {
		return 0, fmt.Errorf("runtime: discarding block %#x: %w", id, err)
	}
	return n, nil
}

// ResidentBlocks lists every block that is a hit now (committed, not
// draining), each once, in no particular order. O(blocks); meant for
// recovery-time reconciliation (runtime/tp), not for the request path.
func (s *Store) ResidentBlocks() []ResidentBlock {
	return s.ctl.resident()
}

// TakeKVEvents hands the events of a store opened with KVEvents.Engine to
// the engine that publishes them (kvevents.Publisher.Take): appended to dst
// as one msgpack array of events in the configured format, as many as fit
// maxBytes (a *kvevents.TooSmallError when the next one alone does not),
// with how many it took and whether more wait. The first take lists what
// the store serves, after an AllBlocksCleared that speaks for this store
// only (see Publisher.Take).
func (s *Store) TakeKVEvents(dst []byte, maxBytes int) (out []byte, n int, more bool, err error) {
	if s.remote != nil {
		return dst, 0, false, fmt.Errorf("runtime: take KV events: %w: %w", errRemote, ErrBadRequest)
	}
	p := s.idx.Publisher()
	if p == nil {
		return dst, 0, false, fmt.Errorf("runtime: take KV events: the store publishes none (Config.KVEvents): %w", ErrBadRequest)
	}
	out, n, more, err = p.Take(dst, maxBytes)
	switch {
	case errors.Is(err, kvevents.ErrNotEngine):
		err = fmt.Errorf("runtime: take KV events: %w (%w)", ErrBadRequest, err)
	case err != nil:
		err = fmt.Errorf("runtime: take KV events: %w", err)
	}
	return out, n, more, err
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

// WaitPrewrite blocks until the background prewrite has ended (done,
// stopped, or never started) or timeout passed, and says whether it ended.
func (s *Store) WaitPrewrite(timeout time.Duration) bool { return s.pre.Wait(timeout) }

// Check verifies every stored run's header and payload (objmap's fsck) while
// the store is open.
// A connected store's is the service's (tutti fsck of its directories once
// it stopped).
func (s *Store) Check() (objmap.RecoveryReport, error) {
	if s.remote != nil {
		return objmap.RecoveryReport{}, fmt.Errorf("runtime: check: %w", errRemote)
	}
	return s.m.Check()
}

// Stats returns the counters and states.
func (s *Store) Stats() Stats { return s.snapshot() }

// Close waits for loads and saves in flight, then stops the scheduler and
// the I/O worker, frees staging, makes the journal durable, keeps the
// eviction order for the next Open (runtime/internal/lrufile) and closes
// the object map. A Close that returns nil leaves a store whose next Open
// serves exactly the blocks this one served (runtime/internal/catalog); an
// error says what may differ (a journal the disk had no room for: blocks
// dropped since its last durable write may come back). Registered KV memory
// is no longer referenced after Close.
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
	errs := s.closeParts()
	if s.remote != nil {
		// The service keeps what the store committed; closing the
		// connection releases whatever it still held.
		return errors.Join(append(errs, s.remote.close())...)
	}
	// The order is kept only with a durable journal: it then names the
	// blocks the next Open finds.
	if s.m.Sync() == nil {
		if err := lrufile.Write(s.m.Dirs()[0], s.idx.LRU()); err != nil {
			errs = append(errs, fmt.Errorf("runtime: close: keeping the eviction order: %w", err))
		}
	}
	errs = append(errs, s.m.Close(), s.idx.Close())
	return errors.Join(errs...)
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
