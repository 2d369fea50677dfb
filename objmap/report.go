package objmap

import (
	"fmt"
	"slices"
	"strings"
)

// Problem is one run that recovery dropped or that Check found corrupt.
type Problem struct {
	Run    RunID  `json:"run"`
	File   int    `json:"file"`
	Offset int64  `json:"offset"`
	Reason string `json:"reason"`
}

// RecoveryReport says what Open found and what it did with it. Counts are in
// runs; each run holds Layers objects, recovered or dropped together.
type RecoveryReport struct {
	// Objects is the runs named by the checkpoint and the journal (after a
	// rebuild: the run headers that verified and were not superseded).
	Objects int `json:"objects"`
	// Recovered is the runs whose header verified: they are served.
	Recovered int `json:"recovered"`
	// Dropped is the runs not served (header missing, overwritten, from
	// another generation or shape, extent invalid; after a rebuild, a payload
	// that fails its CRCs); their space is free again.
	Dropped int `json:"dropped"`
	// Unreadable is the runs whose header could not be read (an I/O error,
	// not a mismatch): not served, their space kept, retried by the next Open.
	Unreadable int `json:"unreadable"`
	// Corrupt is the recovered runs whose payload failed its per-layer CRC or
	// could not be read; only Check (fsck) reads payloads, so Open reports 0.
	Corrupt int `json:"corrupt"`

	DroppedRuns    []Problem `json:"dropped_runs,omitempty"`
	UnreadableRuns []Problem `json:"unreadable_runs,omitempty"`
	CorruptRuns    []Problem `json:"corrupt_runs,omitempty"`

	Layers int `json:"layers"`
	// Dirs is the store's directories and RunWidth the devices each run
	// spreads over (layout.go): RunWidth 1 with several directories is a
	// store made before manifest version 3, whose runs each lie on one
	// device (read as such; LayoutNote says what that costs).
	Dirs             int    `json:"dirs"`
	RunWidth         int    `json:"run_width"`
	Epoch            uint64 `json:"epoch"`
	CheckpointRuns   int    `json:"checkpoint_runs"`
	JournalSegment   uint64 `json:"journal_segment"`
	JournalRecords   int    `json:"journal_records"`
	JournalTailBytes int64  `json:"journal_tail_dropped_bytes"` // a torn tail: normal after a crash
	JournalTail      string `json:"journal_tail_reason,omitempty"`
	UnknownFrees     int    `json:"unknown_frees"`
	UnknownTrims     int    `json:"unknown_trims"`
	PayloadChecked   bool   `json:"payload_checked"`

	// JournalDamage says what is wrong with the checkpoint or the journal
	// (file, byte offset, what) when they cannot be trusted: missing, zeroed,
	// a bad record followed by valid ones. The run index is then rebuilt
	// from the run headers in the pool (Rebuilt).
	JournalDamage string `json:"journal_damage,omitempty"`
	// Rebuilt: the index was rebuilt from run headers: every pool block was
	// scanned for a header, later runs (generation, id) won over earlier
	// ones they overlap, and each winner's payload was verified against its
	// chunk CRCs. A writable Open then rewrote checkpoint and journal.
	Rebuilt bool `json:"rebuilt_from_headers"`
	// HeaderRuns is the runs a rebuild found and serves (verified headers
	// and payloads); HeaderCandidates the valid headers seen, Superseded
	// those overlapped by a later run's header (freed and reused space).
	HeaderRuns       int   `json:"header_runs"`
	HeaderCandidates int   `json:"header_candidates"`
	Superseded       int   `json:"superseded"`
	ScannedBytes     int64 `json:"scanned_bytes"`
	// ScanErrors names pool ranges a rebuild could not read.
	ScanErrors []string `json:"scan_errors,omitempty"`
}

func (r RecoveryReport) clone() RecoveryReport {
	r.DroppedRuns = slices.Clone(r.DroppedRuns)
	r.UnreadableRuns = slices.Clone(r.UnreadableRuns)
	r.CorruptRuns = slices.Clone(r.CorruptRuns)
	r.ScanErrors = slices.Clone(r.ScanErrors)
	return r
}

// Clean reports whether recovery (and Check, if it ran) found nothing wrong:
// no journal damage, no dropped, unreadable or corrupt run. A torn journal
// tail is not a problem (nothing in it was acknowledged).
func (r RecoveryReport) Clean() bool {
	return r.JournalDamage == "" && r.Dropped == 0 && r.Unreadable == 0 && r.Corrupt == 0 && len(r.ScanErrors) == 0
}

// LayoutNote says, for a store whose runs spread over fewer devices than
// it has, what that costs and what to do; empty otherwise.
func (r RecoveryReport) LayoutNote() string {
	switch {
	case r.RunWidth >= r.Dirs || r.RunWidth < 1:
		return ""
	case r.RunWidth == 1:
		return fmt.Sprintf("each run lies on one of the %d devices (a store made before manifest version 3): a restore of a few blocks reads them unevenly; "+
			"the store is a cache: remove its files (MANIFEST, pool-*.dat, journal-*.log, checkpoint in each directory) and reopen it to spread every run over all %d",
			r.Dirs, r.Dirs)
	}
	return fmt.Sprintf("each run spreads over %d of the %d devices (its %d layers cannot fill more)", r.RunWidth, r.Dirs, r.Layers)
}

func (r RecoveryReport) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "objects %d recovered %d dropped %d unreadable %d corrupt %d (runs of %d layer objects; epoch %d, checkpoint %d runs, journal segment %d: %d records",
		r.Objects, r.Recovered, r.Dropped, r.Unreadable, r.Corrupt, r.Layers, r.Epoch, r.CheckpointRuns, r.JournalSegment, r.JournalRecords)
	if r.JournalTailBytes > 0 {
		fmt.Fprintf(&sb, ", torn tail of %d bytes dropped", r.JournalTailBytes)
	}
	sb.WriteString(")")
	if n := r.LayoutNote(); n != "" {
		fmt.Fprintf(&sb, "\n  layout: %s", n)
	}
	if r.JournalDamage != "" {
		fmt.Fprintf(&sb, "\n  journal damaged: %s", r.JournalDamage)
	}
	if r.Rebuilt {
		fmt.Fprintf(&sb, "\n  index rebuilt from run headers: %d runs found (%d valid headers in %d bytes scanned, %d superseded by later runs)",
			r.HeaderRuns, r.HeaderCandidates, r.ScannedBytes, r.Superseded)
	}
	for _, e := range r.ScanErrors {
		fmt.Fprintf(&sb, "\n  scan error: %s", e)
	}
	for _, p := range r.DroppedRuns {
		fmt.Fprintf(&sb, "\n  dropped run %d (file %d offset %d): %s", p.Run, p.File, p.Offset, p.Reason)
	}
	for _, p := range r.UnreadableRuns {
		fmt.Fprintf(&sb, "\n  unreadable run %d (file %d offset %d): %s", p.Run, p.File, p.Offset, p.Reason)
	}
	for _, p := range r.CorruptRuns {
		fmt.Fprintf(&sb, "\n  corrupt run %d (file %d offset %d): %s", p.Run, p.File, p.Offset, p.Reason)
	}
	return sb.String()
}
