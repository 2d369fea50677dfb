package runtime

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Stats are the store's counters since Open. Misses and skips are counted in
// blocks, by cause; every fallback is counted.
type Stats struct {
	Lookups      int64 // Lookup calls
	LookupBlocks int64 // blocks asked for by Lookup
	HitBlocks    int64 // blocks Lookup found cached

	Loads          int64 // Load calls that started a restore
	CachedBlocks   int64 // blocks cached at Load (pinned)
	PlannedBlocks  int64 // blocks the scheduler chose to load (the rest: recompute)
	RestoredBlocks int64 // blocks restored and verified
	RestoredBytes  int64 // payload bytes scattered into KV memory (restored blocks only)
	ReadIOs        int64 // reads submitted
	SplitIOs       int64 // reads beyond the first of a (layer, run) (staging slot smaller than the object)
	OverreadBytes  int64 // bytes read beyond the loaded chunks (O_DIRECT rounding of each read)
	// MissBlocks counts cached and planned blocks not restored, by MissCause.
	MissBlocks [numMissCauses]int64

	Saves          int64 // Save calls
	SaveBlocks     int64 // blocks asked to be saved
	SavedBlocks    int64 // blocks committed
	SavedBytes     int64 // payload bytes written for committed blocks
	WriteIOs       int64 // payload writes submitted
	CommittedRuns  int64
	CorruptDropped int64 // runs dropped from the index after a CRC mismatch
	// SkippedBlocks counts blocks of saves not stored, by SkipCause.
	SkippedBlocks [numSkipCauses]int64
	// SaveFailure is the last error that cost a save blocks (a write, sync
	// or journal append that failed: SkipENOSPC, SkipIOError); "" if none.
	// MapStats says more of the journal (JournalFailures, JournalError).
	SaveFailure string
	// SaveCopyNs is the time save writes spent getting their bytes into
	// staging (PathGPU: the HBM gathers, waiting for a free gather lane
	// included; PathCPU: the copies of staged writes from host KV memory,
	// checksummed in the same pass), SaveChecksumNs the checksums of
	// writes not copied (PathGPU: folding the plane CRCs its gathers
	// computed on the GPU into chunk CRCs, the CPU reads none of the
	// gathered bytes; PathCPU: the CRC32C of writes sent from the engine's
	// pages), both summed over the stage workers (so they can exceed the
	// wall time): where a save's time goes.
	SaveCopyNs, SaveChecksumNs int64
	// SaveDirectWrites counts PathCPU's payload writes sent from the
	// engine's pages (O_DIRECT vectored writes, no staging copy);
	// SaveStagedWrites those copied into staging first because the pages
	// did not allow it, SaveStagedReason why the first of them was
	// (alignment of a page plane against the pool file's O_DIRECT needs,
	// too many page planes for one write's iovecs). PathGPU's writes are
	// always gathered into staging and counted in neither.
	SaveDirectWrites, SaveStagedWrites int64
	SaveStagedReason                   string
	// LoadDirectReads counts PathCPU's reads with payload that went straight
	// into the engine's pages (O_DIRECT vectored reads, no copy);
	// LoadStagedReads those read into staging and copied because the pages
	// did not allow it, LoadStagedReason why the first of them was (as for
	// saves). PathGPU's reads are counted in neither.
	LoadDirectReads, LoadStagedReads int64
	LoadStagedReason                 string

	// Fallbacks counts stores opened on PathCPU after PathGPU failed
	// (OpenWithFallback); FallbackReason is the last such error.
	Fallbacks      int64
	FallbackReason string

	// GPUPlainReads says why the GPU path issues plain READ SQEs instead of
	// READ_FIXED into its registered staging (kernels.Restorer.FixedBuffers:
	// the ring refused the registration); empty when READ_FIXED is used or
	// the store is on PathCPU. The bytes are the same; the CPU cost is higher.
	GPUPlainReads string
	// GPUKickFallback says why the GPU ring's helper is woken by every
	// completion instead of once per batch (kernels.NewKickRing: the kernel
	// refused DEFER_TASKRUN); empty otherwise. Same bytes, more CPU.
	GPUKickFallback string
	// GPUHelperWakeups and GPUHelperBatchTimeouts are the GPU ring helper's
	// kernel entries and the waits of them that ran the whole batch wait
	// with reads in flight (kernels.Restorer.Wakeups, BatchTimeouts): many
	// of the latter per restore mean layers waited for the timeout.
	GPUHelperWakeups       int64
	GPUHelperBatchTimeouts int64
	// GPUReads is what Open sized for PathGPU (GPUConfig, on either path): the
	// window, largest read and lookahead used (explicit values included)
	// and, after "not read:", each device fact that could not be read and
	// what was assumed; empty when the option is off.
	GPUReads string
	// DeviceProbe says, per directory, what Open measured to seed the device
	// model (Config.Device's doc) or why it kept the seed profile;
	// DeviceProbeFailures counts the directories seeded without a
	// measurement (their first large saves may be cut below what the device
	// can write within the bound, until the model learns).
	DeviceProbe         string
	DeviceProbeFailures int64
	// DeviceReprobes counts the read re-measurements of probed devices
	// whose model had seen no reads while plans recomputed their cached
	// blocks (reprobe.go); DeviceReprobeFailures those that failed
	// (DeviceReprobeError: the last failure), DeviceReprobeSkips the plans
	// that would have re-probed a run too short to measure bandwidth on.
	DeviceReprobes, DeviceReprobeFailures, DeviceReprobeSkips int64
	DeviceReprobeError                                        string

	// Prewrite is the background prewrite's state (prewrite.go: "running",
	// "done", "off: why", "stopped after N failed writes");
	// PrewrittenBytes what it wrote, PrewriteLeftBytes the pool's unwritten
	// bytes still known (those under runs included until it reaches them),
	// PrewriteErrors its failed writes (PrewriteError: the last one's).
	Prewrite                           string
	PrewrittenBytes, PrewriteLeftBytes int64
	PrewriteErrors                     int64
	PrewriteError                      string
}

// MissCauses lists the causes indexing Stats.MissBlocks.
func MissCauses() []MissCause {
	out := make([]MissCause, numMissCauses)
	for i := range out {
		out[i] = MissCause(i)
	}
	return out
}

// SkipCauses lists the causes indexing Stats.SkippedBlocks.
func SkipCauses() []SkipCause {
	out := make([]SkipCause, numSkipCauses)
	for i := range out {
		out[i] = SkipCause(i)
	}
	return out
}

func (s Stats) String() string {
	return fmt.Sprintf("lookups=%d hit=%d/%d loads=%d restored=%d blocks/%d bytes reads=%d split=%d misses=%v saves=%d saved=%d skipped=%v fallbacks=%d",
		s.Lookups, s.HitBlocks, s.LookupBlocks, s.Loads, s.RestoredBlocks, s.RestoredBytes, s.ReadIOs, s.SplitIOs,
		s.MissBlocks, s.Saves, s.SavedBlocks, s.SkippedBlocks, s.Fallbacks)
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
	saveCopyNs, saveChecksumNs                               atomic.Int64
	saveDirectWrites, saveStagedWrites                       atomic.Int64
	saveStagedReason                                         atomic.Pointer[string]
	loadDirectReads, loadStagedReads                         atomic.Int64
	loadStagedReason                                         atomic.Pointer[string]
	fallbacks                                                atomic.Int64
}

// staged counts a PathCPU save write staged through a copy, keeping the
// first one's reason.
func (c *counters) staged(why stageWhy) { countStaged(&c.saveStagedWrites, &c.saveStagedReason, why) }

// stagedRead counts a PathCPU load read staged through a copy, keeping the
// first one's reason.
func (c *counters) stagedRead(why stageWhy) {
	countStaged(&c.loadStagedReads, &c.loadStagedReason, why)
}

func countStaged(n *atomic.Int64, reason *atomic.Pointer[string], why stageWhy) {
	if reason.Load() == nil {
		r := why.String()
		reason.CompareAndSwap(nil, &r)
	}
	n.Add(1) // after the reason: a reader that sees the count sees why
}

func (c *counters) snapshot() Stats {
	s := Stats{
		Lookups: c.lookups.Load(), LookupBlocks: c.lookupBlocks.Load(), HitBlocks: c.hitBlocks.Load(),
		Loads: c.loads.Load(), CachedBlocks: c.cachedBlocks.Load(), PlannedBlocks: c.plannedBlocks.Load(),
		RestoredBlocks: c.restoredBlocks.Load(), RestoredBytes: c.restoredBytes.Load(),
		ReadIOs: c.readIOs.Load(), SplitIOs: c.splitIOs.Load(), OverreadBytes: c.overrd.Load(),
		Saves: c.saves.Load(), SaveBlocks: c.saveBlocks.Load(), SavedBlocks: c.savedBlocks.Load(),
		SavedBytes: c.savedBytes.Load(), WriteIOs: c.writeIOs.Load(),
		CommittedRuns: c.committedRuns.Load(), CorruptDropped: c.corruptDropped.Load(),
		Fallbacks: c.fallbacks.Load(), SaveCopyNs: c.saveCopyNs.Load(), SaveChecksumNs: c.saveChecksumNs.Load(),
		SaveDirectWrites: c.saveDirectWrites.Load(), SaveStagedWrites: c.saveStagedWrites.Load(),
	}
	s.LoadDirectReads, s.LoadStagedReads = c.loadDirectReads.Load(), c.loadStagedReads.Load()
	if r := c.saveStagedReason.Load(); r != nil {
		s.SaveStagedReason = *r
	}
	if r := c.loadStagedReason.Load(); r != nil {
		s.LoadStagedReason = *r
	}
	for i := range s.MissBlocks {
		s.MissBlocks[i] = c.missBlocks[i].Load()
	}
	for i := range s.SkippedBlocks {
		s.SkippedBlocks[i] = c.skippedBlocks[i].Load()
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
