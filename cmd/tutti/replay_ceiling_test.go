package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/harness"
)

// The summary prints the striped ceiling and, over several dirs, the sum
// beside it; each backend row has both fractions.
func TestSummaryCeiling(t *testing.T) {
	for _, tc := range []struct {
		name         string
		dirs         []string
		striped, sum float64
		want         string
	}{
		{"not measured", []string{"/a"}, 0, 0, "ceiling not measured"},
		{"one dir", []string{"/a"}, 2.5e9, 2.5e9, "ceiling 2.50 GB/s\n"},
		{"striped", []string{"/a", "/b", "/c"}, 9.42e9, 10e9, "ceiling 9.42 GB/s striped over 3 dirs (timed to the slowest), their own ceilings sum to 10.00 GB/s\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := &harness.Result{Model: "tiny", Dirs: tc.dirs, CeilingBytesPS: tc.striped, CeilingSumBytesPS: tc.sum,
				Backends: []harness.BackendResult{{Backend: "dram", BytesPerS: 1e9, CeilingFraction: 0.25, CeilingSumFraction: 0.125}}}
			var out bytes.Buffer
			printSummary(&out, res)
			if !strings.Contains(out.String(), tc.want) {
				t.Fatalf("summary %q lacks %q", out.String(), tc.want)
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			head, row := strings.Fields(lines[len(lines)-2]), strings.Fields(lines[len(lines)-1])
			if len(head) != len(row)+2 { // "p50 ms" and "p99 ms" are two words each
				t.Fatalf("header %q, row %q", head, row)
			}
			for h, want := range map[string]string{"ceiling": "0.25", "sum": "0.12"} {
				i := slices.Index(head, h) - 2 // the row's fields lack the two "ms"
				if i < 0 || row[i] != want {
					t.Errorf("column %s: at %d of header %q, row %q; want %s", h, i, head, row, want)
				}
			}
		})
	}
}
