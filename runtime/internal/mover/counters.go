package mover

import "sync/atomic"

// StageCause says why a PathCPU I/O went through staging with a copy
// instead of the engine's pages.
type StageCause uint8

const (
	StageNone      StageCause = iota // none was staged
	StageNoIovecs                    // the iovecs for a direct I/O could not be allocated
	StageUnaligned                   // a page plane's address or length is not a multiple of the pool file's O_DIRECT alignment
	StageIovecCap                    // an I/O needs more page planes than one I/O's iovecs hold
)

// Staged is why the first staged I/O of a kind was.
type Staged struct {
	Cause  StageCause
	Reason string
}

// Counters are what a store's mover counts, read by its Stats. The store
// owns them and gives them to its mover.
type Counters struct {
	// DirectReads, DirectWrites: PathCPU I/Os with payload that went
	// straight between the pages and the file; StagedReads, StagedWrites
	// those copied through staging, FirstStagedRead and FirstStagedWrite
	// why the first of them was.
	DirectReads, StagedReads   atomic.Int64
	DirectWrites, StagedWrites atomic.Int64
	FirstStagedRead            atomic.Pointer[Staged]
	FirstStagedWrite           atomic.Pointer[Staged]
	// CopyNs is the time save writes spent getting their bytes into
	// staging, ChecksumNs the checksums of writes not copied, summed over
	// the stage workers (runtime.SaveStats says more).
	CopyNs, ChecksumNs atomic.Int64
	// ReadBytes and WriteBytes are the bytes restores read and saves wrote
	// (as submitted: O_DIRECT rounding included) on each device, by
	// objmap.Layout's device index; the store sizes them.
	ReadBytes, WriteBytes []atomic.Int64
	// SlotWaits counts PathGPU restores that waited for one of the GPU's
	// request slots (its restores live at once) before they were submitted.
	SlotWaits atomic.Int64
}

// Count adds n to device dev's entry of perDev (ReadBytes, WriteBytes),
// where the store sized it.
func Count(perDev []atomic.Int64, dev int, n int64) {
	if dev >= 0 && dev < len(perDev) {
		perDev[dev].Add(n)
	}
}

// CountStaged counts a staged I/O in n, keeping the first one's cause and
// reason in first (the reason is made only for the first).
func CountStaged(n *atomic.Int64, first *atomic.Pointer[Staged], cause StageCause, reason func() string) {
	if first.Load() == nil {
		first.CompareAndSwap(nil, &Staged{Cause: cause, Reason: reason()})
	}
	n.Add(1) // after the reason: a reader that sees the count sees why
}
