package sched

import (
	"errors"
	"fmt"
)

// IOKind says which way an IO goes.
type IOKind uint8

const (
	IORead    IOKind = iota + 1 // restore part of a cached prefix
	IOWrite                     // save part of a new run
	IORestore                   // a whole restore (LoadRequest.Whole): every read of the plan
)

func (k IOKind) String() string {
	switch k {
	case IORead:
		return "read"
	case IOWrite:
		return "write"
	case IORestore:
		return "restore"
	}
	return fmt.Sprintf("IOKind(%d)", uint8(k))
}

// IO is one operation for the runtime to submit. It is a value: the planner
// keeps its own record, keyed by ID, until Complete(ID).
type IO struct {
	ID     uint64 // planner handle; pass to Complete
	Kind   IOKind
	ReqID  uint64 // LoadRequest.ID or SaveRequest.ID
	Device int    // IORestore: -1 (it reads from every device of Plan.Segments)
	Layer  int
	// Reads: Run indexes LoadRequest.Runs; the read covers the run's first
	// Blocks blocks of this layer's object (one contiguous range).
	Run    int
	Blocks int
	// Writes: OffsetBytes is where in the layer's object (of the admitted
	// blocks) this write starts; Bytes its length.
	OffsetBytes int64
	Bytes       int64
	// DeadlineNs: reads, when compute needs the layer (the latest compute
	// start of the layer that does not delay the request's first token);
	// writes, the save's bound.
	DeadlineNs int64
	Promoted   bool // a write dispatched because its bound came near, not into slack
}

// Reason says why part of a request was not admitted.
type Reason uint8

const (
	ReasonNone            Reason = iota
	ReasonRecomputeFaster        // loading these blocks would not make the first token earlier
	ReasonReadBudget             // the device's pending read bytes (MaxPendingReadBytes) are full
	ReasonQueueFull              // the planner's op table (MaxPendingIOs) is full
	ReasonSaveBudget             // the device's pending save bytes (MaxPendingSaveBytes) are full
	ReasonSaveBound              // the device cannot write more within the save bound
)

func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonRecomputeFaster:
		return "recompute-faster"
	case ReasonReadBudget:
		return "read-budget"
	case ReasonQueueFull:
		return "queue-full"
	case ReasonSaveBudget:
		return "save-budget"
	case ReasonSaveBound:
		return "save-bound"
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Rejection names cached blocks [FromBlock, ToBlock) that the plan does not
// load (they are recomputed) and why.
type Rejection struct {
	FromBlock, ToBlock int
	Reason             Reason
}

// Run is a stretch of the cached prefix stored as one run: its blocks are
// consecutive in the prefix and a leading part of it is one read per layer,
// each on the device its layer's object lies on.
type Run struct {
	// Device is the device of every layer's object (index into
	// Config.Devices) when LayerDevices is nil.
	Device int
	// LayerDevices, when not nil, is the device of each layer's object (len
	// Config.Layers): a run spread over several devices. The caller's
	// placement rule fills it (objmap.Layout.LayerDevices); the planner
	// only reads it, and keeps it no longer than the plan.
	LayerDevices          []int
	Blocks                int   // chain blocks in the run (≥ 1)
	BytesPerLayerPerBlock int64 // bytes of one block of one layer (K and V together)
}

// DeviceOf is the device of layer l's object of r.
func (r Run) DeviceOf(l int) int { return layerDevice(r.LayerDevices, r.Device, l) }

// layerDevice is layer l's device: devs[l], or dev when devs is nil.
func layerDevice(devs []int, dev, l int) int {
	if devs != nil {
		return devs[l]
	}
	return dev
}

// LoadRequest describes one prefill that may restore a cached prefix.
type LoadRequest struct {
	ID    uint64
	NowNs int64
	// ComputeReadyNs is the engine's estimate of when this request's prefill
	// can start computing (its turn on the GPU); ≤ NowNs means now. Reads
	// overlap the wait, so a later start makes loading cheaper.
	ComputeReadyNs int64
	Runs           []Run // the cached prefix, in prefix order
	UncachedTokens int   // tokens after the cached prefix, always computed (≥ 0)
	// SegmentsOnly leaves Plan.Reads nil: callers that use Plan.Segments save
	// the O(layers × runs) list (the planner itself never needs it).
	SegmentsOnly bool
	// Whole: the caller cannot issue the plan's reads one by one (a GPU
	// restore is one request to the GPU, which drives its own queue), so
	// Dispatch hands the plan out as one IO of Kind IORestore, once every
	// device it reads from can take all of its reads (see Dispatch). Its
	// reads stay pending on their devices, with their deadlines and slack,
	// until CompleteLayers retires them layer by layer (and Complete the
	// rest): queued saves wait behind them in slack as behind IORead.
	Whole bool
	// QueueUnknown: the caller cannot tell when the GPU is free for this
	// prefill (an engine that gives no ComputeReadyNs). The split then
	// charges a recomputed block its whole GPU time (every layer's compute),
	// so a cached block is recomputed only where loading it would delay the
	// first token by more than recomputing it costs the GPU: under load that
	// GPU time delays every queued prefill, while reads overlap them.
	QueueUnknown bool
}

// Plan is what PlanLoad decided. Blocks [0, LoadBlocks) are loaded; blocks
// [LoadBlocks, CachedBlocks) are recomputed together with the uncached suffix:
// prefill computes ComputeTokens tokens from position ComputeStartPos, and
// layer l's compute may start once its reads completed (Load.WaitLayer).
type Plan struct {
	ID              uint64
	CachedBlocks    int
	LoadBlocks      int
	ComputeStartPos int
	ComputeTokens   int

	LayerComputeNs   int64 // predicted compute time of one layer
	ComputeStartNs   int64 // predicted start of layer 0's compute
	FirstTokenNs     int64 // predicted end of the last layer (the first token, less sampling)
	RecomputeAllNs   int64 // prediction with LoadBlocks = 0
	LoadAdmissibleNs int64 // prediction when loading everything admissible

	// Segments are the reads of every layer: for each layer l and segment s,
	// one read of s.Bytes from layer l's object of run s.Run (its first
	// s.Blocks blocks). The planner keeps them (O(1) per plan and device, not
	// per read) and hands them out through Dispatch in least-slack order.
	Segments []Segment
	// Reads lists the same reads, layer-major (all segments of layer 0, then
	// layer 1, ...), for callers that count them per layer; ID is 0 here (the
	// planner assigns IDs at Dispatch). len(Reads) == Layers × len(Segments).
	Reads []IO
	// Per layer (nil when LoadBlocks == 0): the reads' deadline and their
	// predicted completion (of the layer's reads and every earlier
	// layer's); LayerReadDoneNs[l] ≤ LayerDeadlineNs[l], both non-decreasing.
	LayerDeadlineNs []int64
	LayerReadDoneNs []int64

	// NotAdmitted covers [LoadBlocks, CachedBlocks) exactly, in order.
	NotAdmitted []Rejection
}

// Segment is the part of one run that a plan loads, read once per layer, on
// the device of the run's layer (Device and LayerDevices as in Run).
type Segment struct {
	Run          int // index into LoadRequest.Runs
	Device       int
	LayerDevices []int
	Blocks       int   // the run's first Blocks blocks
	Bytes        int64 // per layer
}

// DeviceOf is the device of the segment's read of layer l.
func (s Segment) DeviceOf(l int) int { return layerDevice(s.LayerDevices, s.Device, l) }

// SaveRequest asks to save a new run of Blocks chain blocks: every layer's
// object (Blocks × BytesPerLayerPerBlock bytes) is written, on Device, or
// on LayerDevices[l] for layer l when that is not nil (as in Run); the
// writes are cut at Config.MaxWriteIOBytes.
type SaveRequest struct {
	ID                    uint64
	NowNs                 int64
	Device                int
	LayerDevices          []int
	Blocks                int
	BytesPerLayerPerBlock int64
}

// SaveTicket is what EnqueueSave admitted: the leading Blocks blocks (0 =
// nothing; the caller then drops the save and counts it). Admitted writes are
// dispatched by DeadlineNs at the latest.
type SaveTicket struct {
	Blocks     int
	Writes     int
	DeadlineNs int64
	Reason     Reason // why blocks were cut; ReasonNone when all were admitted
}

// Stats are counters since NewPlanner.
type Stats struct {
	Plans            int64 `json:"plans"`
	CachedBlocks     int64 `json:"cached_blocks"`
	LoadedBlocks     int64 `json:"loaded_blocks"`
	BudgetCutBlocks  int64 `json:"budget_cut_blocks"`
	ReadsDispatched  int64 `json:"reads_dispatched"`
	WritesDispatched int64 `json:"writes_dispatched"`
	WritesPromoted   int64 `json:"writes_promoted"`
	// ReadHolds counts Dispatch rounds in which a device's next read waited
	// so that its queued saves keep their bound (their writes then run
	// promoted).
	ReadHolds          int64 `json:"read_holds"`
	RestoresDispatched int64 `json:"restores_dispatched"` // IORestore handed out (their reads count in ReadsDispatched)
	Saves              int64 `json:"saves"`
	SaveBlocks         int64 `json:"save_blocks"`
	SaveCutBlocks      int64 `json:"save_cut_blocks"`
	Cancelled          int64 `json:"cancelled"`
}

// ErrUnknownIO is returned by Complete for an ID that is not in flight.
var ErrUnknownIO = errors.New("sched: unknown or not-in-flight io")

// ErrBadRequest reports a malformed LoadRequest or SaveRequest.
var ErrBadRequest = errors.New("sched: bad request")

// Planner is the scheduler's state: models, per-device queues and budgets.
// Single goroutine: not safe for concurrent use (the runtime's I/O goroutine
// owns it, or guards it with one mutex). It never blocks, starts no
// goroutines and reads no clock: time comes in as nanosecond values, which
// must not go backwards between calls.
type Planner struct {
	cfg     Config
	compute ComputeModel
	devs    []devState
	entries []entry
	free    []int32
	cursors []cursor
	cfree   []int32
	jobs    []restoreJob // Whole plans (restorejob.go)
	jfree   []int32
	jobQ    []int32 // jobs not dispatched yet, in admission order
	seq     uint64
	stats   Stats

	// PlanLoad's scratch: each run's share of each device (runShares),
	// the devices a split touches and a run's reads' busy time so far
	// (chooseSplit).
	shares     []share
	shareIdx   []int32
	devLayer   []int32
	activeDevs []int
	prevNs     []float64
}

// NewPlanner validates cfg and fills defaults.
func NewPlanner(cfg Config) (*Planner, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("new planner: %w", err)
	}
	p := &Planner{cfg: c, compute: c.Compute, devs: make([]devState, len(c.Devices))}
	for i, dc := range c.Devices {
		m, err := NewDeviceModel(dc.Profile)
		if err != nil {
			return nil, fmt.Errorf("new planner: device %d: %w", i, err)
		}
		p.devs[i] = devState{cfg: dc, model: m}
	}
	return p, nil
}

// Config returns the configuration with defaults filled in.
func (p *Planner) Config() Config { return p.cfg }

// Compute returns the current compute model (profile and online correction).
func (p *Planner) Compute() ComputeModel { return p.compute }

// Device returns device d's current model.
func (p *Planner) Device(d int) DeviceModel { return p.devs[d].model }

// Stats returns the counters.
func (p *Planner) Stats() Stats { return p.stats }

// ObserveLayer feeds one measured layer compute time (tokens computed from
// startPos) to the compute model; see ComputeModel.Observe.
func (p *Planner) ObserveLayer(tokens, startPos int, measuredNs int64) {
	p.compute.Observe(tokens, startPos, measuredNs)
}

// ObserveReads feeds a batch of completed reads on device d; see
// DeviceModel.ObserveReads. Out-of-range devices are ignored.
func (p *Planner) ObserveReads(d int, bytes int64, ops int, busyNs int64, withWrites bool) {
	if d >= 0 && d < len(p.devs) {
		p.devs[d].model.ObserveReads(bytes, ops, busyNs, withWrites)
	}
}

// RemeasureReads sets device d's read bandwidth to a fresh measurement; see
// DeviceModel.RemeasureReads.
func (p *Planner) RemeasureReads(d int, readBytesPerSec float64) error {
	if d < 0 || d >= len(p.devs) {
		return fmt.Errorf("remeasure reads of device %d of %d: %w", d, len(p.devs), ErrBadRequest)
	}
	return p.devs[d].model.RemeasureReads(readBytesPerSec)
}

// ObserveWrites feeds a batch of completed writes on device d.
func (p *Planner) ObserveWrites(d int, bytes int64, ops int, busyNs int64, withReads bool) {
	if d >= 0 && d < len(p.devs) {
		p.devs[d].model.ObserveWrites(bytes, ops, busyNs, withReads)
	}
}

// Pending returns the records the planner holds (bounded by MaxPendingIOs):
// ops in flight, queued save writes, and one per plan and device with reads
// still queued.
func (p *Planner) Pending() int {
	return len(p.entries) - len(p.free) + len(p.cursors) - len(p.cfree)
}
