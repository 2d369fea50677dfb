package runtime

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/prewrite"
	"github.com/tutti-io/tutti/sched"
)

// Stats is what Store.Stats returns: the store's counters since Open and
// its states, nested by subsystem. Blocks are chain blocks; misses and
// skips are counted by cause; every fallback is counted. A state is an
// enum (statsenum.go) with its reason in a field beside it, never a
// sentence to parse.
//
// The json tags are the one naming of every field outside Go: the C ABI's
// tutti_get_stats_json and the Python binding carry this struct as JSON,
// so a field added here (with its tag, snake_case) reaches both with no
// other change. Enums are their String, cause counts objects keyed by
// cause, lists never null.
type Stats struct {
	Path     PathStats     `json:"path"`
	Lookups  LookupStats   `json:"lookups"`
	Holds    HoldStats     `json:"holds"`
	Loads    LoadStats     `json:"loads"`
	Saves    SaveStats     `json:"saves"`
	Index    prefix.Stats  `json:"index"` // the prefix index: what is stored, pinned, evicted
	Map      objmap.Stats  `json:"map"`   // the pool's space and runs, its journal and that journal's failures
	Sched    sched.Stats   `json:"sched"` // the scheduler's plans, dispatches and cuts
	Events   KVEventsStats `json:"events"`
	GPU      GPUStats      `json:"gpu"`
	Devices  DeviceStats   `json:"devices"`
	Prewrite PrewriteStats `json:"prewrite"`
	Service  ServiceLink   `json:"service"` // a connected store's link to its node's service (Connect)
}

// ServiceLink is a connected store's link to the node's service; all zero
// on an opened store.
type ServiceLink struct {
	Socket string `json:"socket"`
	// ControlErrors counts control calls that failed: their lookups and
	// loads were misses, their saves skipped (SkipIOError), never waited
	// for; LastError is the last one's.
	ControlErrors int64  `json:"control_errors"`
	LastError     string `json:"last_error"`
	// Connected says whether the current connection is up; Reconnects
	// counts connections made again after one was lost; ReconnectError
	// says why the store stopped dialing (the service serves another
	// store now: the engine must connect again), empty while it dials.
	Connected      bool   `json:"connected"`
	Reconnects     int64  `json:"reconnects"`
	ReconnectError string `json:"reconnect_error"`
	// DialFailures counts redials that found no service while the link
	// was down (one per attempt, ReconnectMinDelay to ReconnectMaxDelay
	// apart); LastDialError is the last one's.
	DialFailures  int64  `json:"dial_failures"`
	LastDialError string `json:"last_dial_error"`
}

// PathStats is the data path the store runs on.
type PathStats struct {
	Used Path `json:"used"`
	// Fallbacks counts opens on PathCPU after PathGPU could not run
	// (OpenWithFallback); FallbackReason is why (the GPU path's error).
	Fallbacks      int64  `json:"fallbacks"`
	FallbackReason string `json:"fallback_reason"`
}

// LookupStats counts Lookup and Match calls.
type LookupStats struct {
	Calls       int64 `json:"calls"`
	AskedBlocks int64 `json:"asked_blocks"`
	HitBlocks   int64 `json:"hit_blocks"` // found stored
}

// HoldStats counts the holds of Match.
type HoldStats struct {
	Live int `json:"live"`
	// Expired counts holds ended by their time to live (a worker that
	// never loaded or released what the scheduler was promised).
	Expired int64 `json:"expired"`
}

// LoadStats counts restores.
type LoadStats struct {
	Calls          int64 `json:"calls"`           // Load calls that started a restore
	CachedBlocks   int64 `json:"cached_blocks"`   // stored at Load (pinned)
	PlannedBlocks  int64 `json:"planned_blocks"`  // the scheduler chose to load (the rest: recompute)
	RestoredBlocks int64 `json:"restored_blocks"` // restored and verified
	RestoredBytes  int64 `json:"restored_bytes"`  // payload scattered into KV memory (restored blocks only)
	ReadIOs        int64 `json:"read_ios"`        // reads submitted
	SplitIOs       int64 `json:"split_ios"`       // reads beyond the first of a (layer, run): a staging slot smaller than the object
	OverreadBytes  int64 `json:"overread_bytes"`  // read beyond the loaded chunks (O_DIRECT rounding of each read)
	// MissBlocks counts cached and planned blocks not restored, by cause.
	MissBlocks MissCounts `json:"miss_blocks"`
	// CorruptDroppedRuns counts runs dropped from the index after a CRC
	// mismatch.
	CorruptDroppedRuns int64 `json:"corrupt_dropped_runs"`
	// DirectReads counts PathCPU's reads with payload that went straight
	// into the engine's pages (O_DIRECT vectored reads, no copy);
	// StagedReads those read into staging and copied because the pages did
	// not allow it, StagedCause and StagedReason why the first of them was.
	// PathGPU's reads are counted in neither.
	DirectReads  int64      `json:"direct_reads"`
	StagedReads  int64      `json:"staged_reads"`
	StagedCause  StageCause `json:"staged_cause"`
	StagedReason string     `json:"staged_reason"`
	// GPUSlotWaits counts PathGPU restores that waited for a GPU request
	// slot (the kernels take 4 restores live at once) before they started.
	GPUSlotWaits int64 `json:"gpu_slot_waits"`
}

// SaveStats counts saves.
type SaveStats struct {
	Calls         int64 `json:"calls"`
	AskedBlocks   int64 `json:"asked_blocks"`
	SavedBlocks   int64 `json:"saved_blocks"` // committed
	SavedBytes    int64 `json:"saved_bytes"`  // payload written for committed blocks
	WriteIOs      int64 `json:"write_ios"`    // payload writes submitted
	CommittedRuns int64 `json:"committed_runs"`
	// SkippedBlocks counts blocks asked for and not stored, by cause.
	SkippedBlocks SkipCounts `json:"skipped_blocks"`
	// LastFailure is the last error that cost a save blocks (a write, sync
	// or journal append that failed: SkipENOSPC, SkipIOError); "" if none.
	// Map says more of the journal (JournalFailures, JournalError).
	LastFailure string `json:"last_failure"`
	// CopyNs is the time save writes spent getting their bytes into
	// staging (PathGPU: the HBM gathers, waiting for a free gather lane
	// included; PathCPU: the copies of staged writes from host KV memory,
	// checksummed in the same pass), ChecksumNs the checksums of writes not
	// copied (PathGPU: folding the plane CRCs its gathers computed on the
	// GPU into chunk CRCs; PathCPU: the CRC32C of writes sent from the
	// engine's pages), both summed over the stage workers (so they can
	// exceed the wall time): where a save's time goes.
	CopyNs     int64 `json:"copy_ns"`
	ChecksumNs int64 `json:"checksum_ns"`
	// DirectWrites counts PathCPU's payload writes sent from the engine's
	// pages (O_DIRECT vectored writes, no staging copy); StagedWrites those
	// copied into staging first because the pages did not allow it,
	// StagedCause and StagedReason why the first of them was. PathGPU's
	// writes are always gathered into staging and counted in neither.
	DirectWrites int64      `json:"direct_writes"`
	StagedWrites int64      `json:"staged_writes"`
	StagedCause  StageCause `json:"staged_cause"`
	StagedReason string     `json:"staged_reason"`
}

// GPUStats is the GPU path's reads and its ring.
type GPUStats struct {
	// Reads is what Open sized for PathGPU (on either path): the window,
	// largest read and lookahead used, explicit values included, and each
	// device fact that could not be read.
	Reads GPUReads `json:"reads"`
	// ReadMode is whether reads go to registered staging (READ_FIXED) or
	// not; ReadModeReason why not where they were asked to
	// (kernels.Restorer.FixedBuffers: the ring refused the registration).
	// The bytes are the same; the CPU cost is higher.
	ReadMode       GPUReadMode `json:"read_mode"`
	ReadModeReason string      `json:"read_mode_reason"`
	// Ring is how the ring's helper is woken; RingReason why it is woken
	// by every completion (kernels.NewKickRing: the kernel refused
	// DEFER_TASKRUN). Same bytes, more CPU.
	Ring       GPURing `json:"ring"`
	RingReason string  `json:"ring_reason"`
	// HelperWakeups and HelperBatchTimeouts are the ring helper's kernel
	// entries and the waits of them that ran the whole batch wait with
	// reads in flight (kernels.Restorer.Wakeups, BatchTimeouts): many of the
	// latter per restore mean layers waited for the timeout.
	HelperWakeups       int64 `json:"helper_wakeups"`
	HelperBatchTimeouts int64 `json:"helper_batch_timeouts"`
}

// DeviceStats is what seeds and corrects the scheduler's device models.
type DeviceStats struct {
	// Dirs are the store's directories in its own order (the order of the
	// Config.Dirs that created it; a reopen may list them in any order):
	// the order of every per-device list here.
	Dirs []string `json:"dirs"`
	// ReadBytes and WriteBytes are the bytes loads read and saves wrote on
	// each device since Open (as submitted, O_DIRECT rounding included):
	// how evenly the store's layout spreads them (objmap.Layout).
	ReadBytes  []int64 `json:"read_bytes"`
	WriteBytes []int64 `json:"write_bytes"`
	// Probes is what Open did for each directory.
	Probes []DeviceProbe `json:"probes"`
	// ProbeFailures counts the directories seeded without a measurement
	// (their first large saves may be cut below what the device can write
	// within the bound, until the model learns).
	ProbeFailures int64 `json:"probe_failures"`
	// Reprobes counts the read re-measurements of probed devices whose
	// model had seen no reads while plans recomputed their cached blocks
	// (runtime/internal/devprobe); ReprobeFailures those that failed (ReprobeError: the
	// last failure), ReprobeSkips the plans that would have re-probed a run
	// too short to measure bandwidth on.
	Reprobes        int64  `json:"reprobes"`
	ReprobeFailures int64  `json:"reprobe_failures"`
	ReprobeSkips    int64  `json:"reprobe_skips"`
	ReprobeError    string `json:"reprobe_error"`
}

// DeviceProbe is one directory's device model seed (Config.Device's doc).
type DeviceProbe struct {
	State  ProbeState `json:"state"`
	Reason string     `json:"reason"` // ProbeSeeded: why there is no measurement
	// The bandwidths the model starts from: measured, the seed's, or
	// Config.Device's.
	WriteBytesPerSec float64 `json:"write_bytes_per_sec"`
	ReadBytesPerSec  float64 `json:"read_bytes_per_sec"`
	// ProbeBytes were written and read back in ProbeNs (ProbeMeasured).
	ProbeBytes int64 `json:"probe_bytes"`
	ProbeNs    int64 `json:"probe_ns"`
}

func (p DeviceProbe) String() string {
	s := p.State.String()
	if p.Reason != "" {
		s += " (" + p.Reason + ")"
	}
	s += fmt.Sprintf(": write %.2g B/s, read %.2g B/s", p.WriteBytesPerSec, p.ReadBytesPerSec)
	if p.State == ProbeMeasured {
		s += fmt.Sprintf(" (%d MiB in %v)", p.ProbeBytes>>20, time.Duration(p.ProbeNs).Round(time.Millisecond))
	}
	return s
}

// PrewriteStats is the background prewrite (package prewrite).
type PrewriteStats struct {
	State  PrewriteState `json:"state"`
	Reason string        `json:"reason"` // why off, done or stopped
	// WrittenBytes is what it wrote; LeftBytes the pool's unwritten bytes
	// still known (those under runs included until it reaches them).
	WrittenBytes int64 `json:"written_bytes"`
	LeftBytes    int64 `json:"left_bytes"`
	// Errors counts its failed writes; LastError is the last one's.
	Errors    int64  `json:"errors"`
	LastError string `json:"last_error"`
}

// snapshot is Store.Stats.
func (s *Store) snapshot() Stats {
	st := s.stats.snapshot(&s.moved)
	st.Path = PathStats{Used: s.cfg.Path, Fallbacks: s.stats.fallbacks.Load(), FallbackReason: s.fallbackReason}
	st.Saves.LastFailure = s.fails.lastError()
	s.mu.Lock()
	st.Holds.Live = s.holds
	s.mu.Unlock()
	st.Holds.Expired = s.holdsExpired.Load()
	if s.remote == nil {
		st.Index, st.Map = s.idx.Stats(), s.m.Stats()
	}
	st.Sched = s.sched.Stats()
	st.Events = s.kvEventsStats()
	st.GPU = s.gpuStats()
	st.Devices.Probes = append([]DeviceProbe{}, s.devProbes...)
	st.Devices.Dirs = s.storeDirs()
	st.Devices.ReadBytes, st.Devices.WriteBytes = make([]int64, len(s.moved.ReadBytes)), make([]int64, len(s.moved.WriteBytes))
	for i := range st.Devices.ReadBytes {
		st.Devices.ReadBytes[i], st.Devices.WriteBytes[i] = s.moved.ReadBytes[i].Load(), s.moved.WriteBytes[i].Load()
	}
	for _, p := range s.devProbes {
		if p.State == ProbeSeeded {
			st.Devices.ProbeFailures++
		}
	}
	st.Devices.Reprobes, st.Devices.ReprobeFailures, st.Devices.ReprobeSkips, st.Devices.ReprobeError = s.reprobe.Stats()
	st.Prewrite = s.prewriteStats()
	if rc := s.remote; rc != nil {
		st.Service = rc.link()
	}
	return st
}

// gpuStats is Stats.GPU: the sized reads on either path, the bound GPU's
// state on PathGPU once RegisterKV bound it.
func (s *Store) gpuStats() GPUStats {
	st := GPUStats{Reads: s.gpuReads}
	st.Reads.Unread = append([]string{}, s.gpuReads.Unread...)
	if s.gpu == nil || !s.kvSet.Load() {
		return st
	}
	g, ok := s.gpu.Status()
	if !ok {
		return st
	}
	st.ReadMode = GPUReadsPlain
	if g.Fixed {
		st.ReadMode = GPUReadsFixed
	} else if g.FixedErr != nil {
		st.ReadModeReason = g.FixedErr.Error()
	}
	switch {
	case s.cfg.GPU.SQPoll:
		st.Ring = GPURingSQPoll
	case g.KickFallback != "":
		st.Ring, st.RingReason = GPURingKickEach, g.KickFallback
	default:
		st.Ring = GPURingKickBatched
	}
	st.HelperWakeups, st.HelperBatchTimeouts = g.Wakeups, g.BatchTimeouts
	return st
}

// prewriteStats is Stats.Prewrite.
func (s *Store) prewriteStats() PrewriteStats {
	p := s.pre.Stats()
	return PrewriteStats{State: prewriteStates[p.State], Reason: p.Reason, WrittenBytes: p.WrittenBytes, LeftBytes: p.LeftBytes,
		Errors: p.Errors, LastError: p.LastError}
}

// prewriteStates names package prewrite's states as Stats does.
var prewriteStates = [...]PrewriteState{prewrite.Off: PrewriteOff, prewrite.Running: PrewriteRunning,
	prewrite.Done: PrewriteDone, prewrite.Stopped: PrewriteStopped}

// MissCounts counts blocks by MissCause, indexed by it. In JSON it is an
// object keyed by each cause's String with '-' as '_' (io_error, crc, ...).
type MissCounts [numMissCauses]int64

// SkipCounts counts blocks by SkipCause, indexed by it; in JSON as
// MissCounts.
type SkipCounts [numSkipCauses]int64

// Total is the blocks of every cause.
func (c MissCounts) Total() int64 { return sum(c[:]) }

// Total is the blocks of every cause.
func (c SkipCounts) Total() int64 { return sum(c[:]) }

func sum(v []int64) int64 {
	var n int64
	for _, x := range v {
		n += x
	}
	return n
}

// MissCauses lists the causes indexing MissCounts.
func MissCauses() []MissCause {
	out := make([]MissCause, numMissCauses)
	for i := range out {
		out[i] = MissCause(i)
	}
	return out
}

// SkipCauses lists the causes indexing SkipCounts.
func SkipCauses() []SkipCause {
	out := make([]SkipCause, numSkipCauses)
	for i := range out {
		out[i] = SkipCause(i)
	}
	return out
}

func (s Stats) String() string {
	return fmt.Sprintf("lookups=%d hit=%d/%d loads=%d restored=%d blocks/%d bytes reads=%d split=%d misses=%v saves=%d saved=%d skipped=%v fallbacks=%d",
		s.Lookups.Calls, s.Lookups.HitBlocks, s.Lookups.AskedBlocks, s.Loads.Calls, s.Loads.RestoredBlocks, s.Loads.RestoredBytes,
		s.Loads.ReadIOs, s.Loads.SplitIOs, s.Loads.MissBlocks, s.Saves.Calls, s.Saves.SavedBlocks, s.Saves.SkippedBlocks, s.Path.Fallbacks)
}

// counters are the live atomics behind Stats.
type counters struct {
	lookups, lookupBlocks, hitBlocks                         atomic.Int64
	loads, cachedBlocks, plannedBlocks                       atomic.Int64
	restoredBlocks, restoredBytes, readIOs, splitIOs, overrd atomic.Int64
	missBlocks                                               [numMissCauses]atomic.Int64
	saves, saveBlocks, savedBlocks, savedBytes, writeIOs     atomic.Int64
	committedRuns, corruptDropped                            atomic.Int64
	skippedBlocks                                            [numSkipCauses]atomic.Int64
	fallbacks                                                atomic.Int64
}

// stageCauses names the movers' stage causes as Stats does.
var stageCauses = [...]StageCause{mover.StageNone: StageNone, mover.StageNoIovecs: StageNoIovecs,
	mover.StageUnaligned: StageUnaligned, mover.StageIovecCap: StageIovecCap}

func (c *counters) snapshot(m *mover.Counters) Stats {
	var s Stats
	s.Lookups = LookupStats{Calls: c.lookups.Load(), AskedBlocks: c.lookupBlocks.Load(), HitBlocks: c.hitBlocks.Load()}
	s.Loads = LoadStats{Calls: c.loads.Load(), CachedBlocks: c.cachedBlocks.Load(), PlannedBlocks: c.plannedBlocks.Load(),
		RestoredBlocks: c.restoredBlocks.Load(), RestoredBytes: c.restoredBytes.Load(),
		ReadIOs: c.readIOs.Load(), SplitIOs: c.splitIOs.Load(), OverreadBytes: c.overrd.Load(),
		CorruptDroppedRuns: c.corruptDropped.Load(),
		DirectReads:        m.DirectReads.Load(), StagedReads: m.StagedReads.Load(), GPUSlotWaits: m.SlotWaits.Load()}
	s.Saves = SaveStats{Calls: c.saves.Load(), AskedBlocks: c.saveBlocks.Load(), SavedBlocks: c.savedBlocks.Load(),
		SavedBytes: c.savedBytes.Load(), WriteIOs: c.writeIOs.Load(), CommittedRuns: c.committedRuns.Load(),
		CopyNs: m.CopyNs.Load(), ChecksumNs: m.ChecksumNs.Load(),
		DirectWrites: m.DirectWrites.Load(), StagedWrites: m.StagedWrites.Load()}
	if f := m.FirstStagedWrite.Load(); f != nil {
		s.Saves.StagedCause, s.Saves.StagedReason = stageCauses[f.Cause], f.Reason
	}
	if f := m.FirstStagedRead.Load(); f != nil {
		s.Loads.StagedCause, s.Loads.StagedReason = stageCauses[f.Cause], f.Reason
	}
	for i := range s.Loads.MissBlocks {
		s.Loads.MissBlocks[i] = c.missBlocks[i].Load()
	}
	for i := range s.Saves.SkippedBlocks {
		s.Saves.SkippedBlocks[i] = c.skippedBlocks[i].Load()
	}
	return s
}

// saveFailures keeps what WaitSaves and Stats report of saves that lost
// blocks to a failure: the last error, and the failed blocks counted when
// WaitSaves last reported.
type saveFailures struct {
	mu       sync.Mutex
	last     error
	reported int64
}

// note keeps err as the last failure when it is one (a failed write, sync
// or journal append; not a store closing).
func (f *saveFailures) note(err error) {
	if c := skipCauseOf(err); c != SkipENOSPC && c != SkipIOError {
		return
	}
	f.mu.Lock()
	f.last = err
	f.mu.Unlock()
}

func (f *saveFailures) lastError() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil {
		return ""
	}
	return f.last.Error()
}

// take reports the blocks lost to failures since the last take (nil when
// none), with the last failure.
func (f *saveFailures) take(c *counters) error {
	enospc, ioerr := c.skippedBlocks[SkipENOSPC].Load(), c.skippedBlocks[SkipIOError].Load()
	f.mu.Lock()
	defer f.mu.Unlock()
	n := enospc + ioerr - f.reported
	if n == 0 {
		return nil
	}
	f.reported = enospc + ioerr
	last := f.last
	if last == nil {
		last = errors.New("no error kept")
	}
	return fmt.Errorf("%w: %d blocks lost to failures since the last WaitSaves (%d enospc, %d io-error in all); the last: %w",
		ErrSavesFailed, n, enospc, ioerr, last)
}
