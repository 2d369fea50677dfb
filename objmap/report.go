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
	// Objects is the runs named by the checkpoint and the journal.
	Objects int `json:"objects"`
	// Recovered is the runs whose header verified: they are served.
	Recovered int `json:"recovered"`
	// Dropped is the runs not served (header missing, overwritten, from
	// another generation or shape, extent invalid); their space is free again.
	Dropped int `json:"dropped"`
	// Corrupt is the recovered runs whose payload failed its per-layer CRC or
	// could not be read; only Check (fsck) reads payloads, so Open reports 0.
	Corrupt int `json:"corrupt"`

	DroppedRuns []Problem `json:"dropped_runs,omitempty"`
	CorruptRuns []Problem `json:"corrupt_runs,omitempty"`

	Layers           int    `json:"layers"`
	Epoch            uint64 `json:"epoch"`
	CheckpointRuns   int    `json:"checkpoint_runs"`
	JournalSegment   uint64 `json:"journal_segment"`
	JournalRecords   int    `json:"journal_records"`
	JournalTailBytes int64  `json:"journal_tail_dropped_bytes"` // a torn tail: normal after a crash
	JournalTail      string `json:"journal_tail_reason,omitempty"`
	UnknownFrees     int    `json:"unknown_frees"`
	PayloadChecked   bool   `json:"payload_checked"`
}

func (r RecoveryReport) clone() RecoveryReport {
	r.DroppedRuns = slices.Clone(r.DroppedRuns)
	r.CorruptRuns = slices.Clone(r.CorruptRuns)
	return r
}

func (r RecoveryReport) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "objects %d recovered %d dropped %d corrupt %d (runs of %d layer objects; epoch %d, checkpoint %d runs, journal segment %d: %d records",
		r.Objects, r.Recovered, r.Dropped, r.Corrupt, r.Layers, r.Epoch, r.CheckpointRuns, r.JournalSegment, r.JournalRecords)
	if r.JournalTailBytes > 0 {
		fmt.Fprintf(&sb, ", torn tail of %d bytes dropped", r.JournalTailBytes)
	}
	sb.WriteString(")")
	for _, p := range r.DroppedRuns {
		fmt.Fprintf(&sb, "\n  dropped run %d (file %d offset %d): %s", p.Run, p.File, p.Offset, p.Reason)
	}
	for _, p := range r.CorruptRuns {
		fmt.Fprintf(&sb, "\n  corrupt run %d (file %d offset %d): %s", p.Run, p.File, p.Offset, p.Reason)
	}
	return sb.String()
}
