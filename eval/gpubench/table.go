package gpubench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// Row is one path's result; --json writes one per line.
type Row struct {
	Path      string  `json:"path"`
	Storage   string  `json:"storage"`
	Model     string  `json:"model"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	BytesPerS float64 `json:"bytes_per_s"`
	// CeilingBytesPS is the striped ceiling around this path's restore
	// (the mean of devbench.CeilingStriped just before and just after it):
	// the devices reading this prefix's bytes, as they lie, with raw
	// O_DIRECT reads, timed to the slowest device. CeilingFraction is
	// BytesPerS over it.
	CeilingBytesPS  float64 `json:"ceiling_bytes_per_s"`
	CeilingFraction float64 `json:"ceiling_fraction"`
	// CeilingSumBytesPS is the sum of the devices' own ceilings over 2 s,
	// all at once (devbench.CeilingEachInto, sampled once per round), and
	// CeilingSumFraction BytesPerS over it: faster devices' extra reads
	// count there, which a read of evenly striped data cannot use.
	CeilingSumBytesPS  float64 `json:"ceiling_sum_bytes_per_s,omitempty"`
	CeilingSumFraction float64 `json:"ceiling_sum_fraction,omitempty"`
	// CeilingCachedBytesPS is the sum ceiling into devbench's own 32 MiB
	// per device, which a large CPU cache may hold (ceilingDestBytes).
	CeilingCachedBytesPS float64 `json:"ceiling_cached_bytes_per_s,omitempty"`
	CPUSPerGiB           float64 `json:"cpu_s_per_gib"`
	SQPollCPUS           float64 `json:"sqpoll_cpu_s,omitempty"`
	IOs                  int64   `json:"ios"`
	Mismatches           uint64  `json:"verify_mismatches"`
	FirstLayerMs         float64 `json:"first_layer_ms"`
	LayerMsP50           float64 `json:"layer_ms_p50"`
	LayerMsMax           float64 `json:"layer_ms_max"`
	// IOWQWorkers is how many io_uring io-wq worker threads (iou-wrk-*) of
	// this process ran during the path, and IOWQCPUS their CPU seconds: a
	// read the device could not take nonblocking (no free request tag, a
	// split) went to one. Workers that exited before the path ended are
	// not counted. Their CPU is also in CPUSPerGiB.
	IOWQWorkers int     `json:"io_wq_workers"`
	IOWQCPUS    float64 `json:"io_wq_cpu_s,omitempty"`
	Error       string  `json:"error,omitempty"`
	Note        string  `json:"note,omitempty"`
	// Stripe and RunPages are the data files' layout (--stripe,
	// --run-pages): "runs" with pages per run, or "layers" with 0.
	Stripe   string `json:"stripe"`
	RunPages int    `json:"run_pages"`
	// Rounds is how many rounds the row is the median of (--rounds);
	// PerRound their values.
	Rounds   int        `json:"rounds"`
	PerRound RoundStats `json:"per_round"`

	position int // where the path ran in its round (roundOrder); kept in PerRound
}

func rowSummary(r Row) string {
	if r.Error != "" && r.Bytes == 0 {
		return "error: " + r.Error
	}
	return fmt.Sprintf("%.2f GB/s (%.2f of the striped ceiling, %.2f of the sum), %.3f CPU s/GiB, %d I/Os, %d mismatches, %d io-wq workers (%.1f ms) %s",
		r.BytesPerS/1e9, r.CeilingFraction, r.CeilingSumFraction, r.CPUSPerGiB, r.IOs, r.Mismatches, r.IOWQWorkers, r.IOWQCPUS*1e3, r.Note)
}

func printTable(w io.Writer, rows []Row) {
	fmt.Fprintf(w, "%-28s %9s %8s %8s %10s %9s %9s %9s %9s %s\n", "path", "GB/s", "x ceil", "x sum", "CPU s/GiB", "I/Os", "mismatch", "layer p50", "layer max", "note")
	for _, r := range rows {
		if r.Error != "" {
			e := r.Error
			if len(e) > 400 {
				e = e[:400] + "..."
			}
			fmt.Fprintf(w, "%-28s FAILED (%d mismatched words, pages not restored keep the poison): %s\n", r.Path, r.Mismatches, strings.ReplaceAll(e, "\n", " | "))
			continue
		}
		fmt.Fprintf(w, "%-28s %9.2f %8.3f %8.3f %10.4f %9d %9d %8.2fms %8.2fms %s\n", r.Path, r.BytesPerS/1e9, r.CeilingFraction, r.CeilingSumFraction, r.CPUSPerGiB, r.IOs, r.Mismatches, r.LayerMsP50, r.LayerMsMax, r.Note)
	}
}

// writeJSONLines writes rows as JSON, one per line, to path ("-": stdout;
// "": nowhere): gpubench's --json.
func writeJSONLines[T any](path string, stdout io.Writer, rows []T) error {
	return writeJSONRows(path, stdout, rows, false)
}

// writeJSONRows is writeJSONLines, appending to the file when appendTo.
func writeJSONRows[T any](path string, stdout io.Writer, rows []T, appendTo bool) error {
	if path == "" {
		return nil
	}
	w := stdout
	if path != "-" {
		flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
		if appendTo {
			flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
		}
		f, err := os.OpenFile(path, flags, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	enc := json.NewEncoder(w)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
