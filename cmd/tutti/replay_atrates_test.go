package main

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// --at-rates gives every row the timeline at each rate: every request's
// TTFT, the percentiles of them, and the workload's description; at the
// workload's own rate it is the row's own timeline.
func TestReplayAtRates(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"replay", "--workload", "docqa", "--docqa-docs", "3", "--docqa-questions", "3",
		"--docqa-min-doc-tokens", "1024", "--docqa-max-doc-tokens", "2048", "--docqa-rate", "2", "--json", "--no-ceiling", "--no-ebpf",
		"--dir", t.TempDir(), "--out", t.TempDir(), "--backends", "dram,recompute", "--compute", "sim", "--at-rates", "2,8"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rows []struct {
		Backend  string  `json:"backend"`
		Requests int     `json:"requests"`
		P50      float64 `json:"ttft_ms_p50"`
		P90      float64 `json:"ttft_ms_p90"`
		Workload string  `json:"workload"`
		AtRates  []struct {
			Rate   float64   `json:"rate_per_s"`
			P50    float64   `json:"ttft_ms_p50"`
			P90    float64   `json:"ttft_ms_p90"`
			P99    float64   `json:"ttft_ms_p99"`
			TTFTms []float64 `json:"ttft_ms"`
		} `json:"at_rates"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if len(rows) != 2 {
		t.Fatalf("rows %+v", rows)
	}
	for _, r := range rows {
		if !strings.HasPrefix(r.Workload, "docqa (") || !strings.Contains(r.Workload, "3 documents of 1024-2048 tokens") {
			t.Fatalf("%s: workload %q", r.Backend, r.Workload)
		}
		if len(r.AtRates) != 2 || r.AtRates[0].Rate != 2 || r.AtRates[1].Rate != 8 {
			t.Fatalf("%s: at_rates %+v", r.Backend, r.AtRates)
		}
		for _, a := range r.AtRates {
			if len(a.TTFTms) != r.Requests || a.P50 <= 0 || a.P50 > a.P90 || a.P90 > a.P99 {
				t.Fatalf("%s at %g: %+v (requests %d)", r.Backend, a.Rate, a, r.Requests)
			}
		}
		// At the workload's own rate (--docqa-rate 2) the arrivals are the row's own.
		if math.Abs(r.AtRates[0].P50-r.P50) > 1e-9 || math.Abs(r.AtRates[0].P90-r.P90) > 1e-9 {
			t.Fatalf("%s: at 2 req/s p50/p90 %g/%g, the row's %g/%g", r.Backend, r.AtRates[0].P50, r.AtRates[0].P90, r.P50, r.P90)
		}
	}
}

func TestReplayAtRatesErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--workload", "docqa", "--at-rates", "2,x"}, `rate "x"`},
		{[]string{"--workload", "docqa", "--at-rates", "0"}, `rate "0"`},
		{[]string{"--workload", "conversation", "--at-rates", "2"}, "needs --workload docqa"},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"replay", "--no-ceiling", "--no-ebpf", "--dir", t.TempDir(), "--out", t.TempDir()}, tc.args...)
		if code := run(args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), tc.want) {
			t.Fatalf("%v: exit %d, want an error naming %q: %s", tc.args, code, tc.want, stderr.String())
		}
	}
}

// FuzzParseAtRates: any input is a list of at most maxAtRates rates, each
// > 0 and finite, or an error; never a panic.
func FuzzParseAtRates(f *testing.F) {
	for _, s := range []string{"", "2,3,4", "0", "x", "1e9", "NaN", "+Inf", "2,,3", strings.Repeat("1,", 40) + "1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		rates, err := parseAtRates(s)
		if err != nil {
			return
		}
		if len(rates) > maxAtRates || (s != "" && len(rates) == 0) {
			t.Fatalf("%q: %d rates", s, len(rates))
		}
		for _, r := range rates {
			if !(r > 0) || math.IsInf(r, 0) {
				t.Fatalf("%q: rate %v", s, r)
			}
		}
	})
}
