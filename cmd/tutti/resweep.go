package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/tutti-io/tutti/eval/harness"
	"github.com/tutti-io/tutti/eval/report"
)

func init() {
	register("resweep", "recompute TTFT and the rate at an SLO from a replay report's services.json, without re-running it", runResweep)
}

func runResweep(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("resweep", stderr)
	sloMs := fs.Float64("slo-ms", 0, "TTFT SLO on p90 in ms (0 = 2 × p90 of the recompute backend's unloaded TTFT, else the report's SLO)")
	jsonOut := fs.Bool("json", false, "print one JSON object per backend (an array)")
	spreadMs := fs.Float64("spread-ms", 0, "spread services that share an arrival time evenly over this many ms first (logs recorded with a window inside one timestamp bucket arrived all at once; the conversation trace's buckets are 3000 ms)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tutti resweep [--slo-ms X] [--json] REPORT_DIR_OR_SERVICES_JSON")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageErr(fs.Usage, fmt.Errorf("want one report directory or services.json, got %d arguments", fs.NArg()))
	}
	if *spreadMs < 0 {
		return usageErr(fs.Usage, fmt.Errorf("--spread-ms %v: must be ≥ 0", *spreadMs))
	}
	if *sloMs < 0 {
		return usageErr(fs.Usage, fmt.Errorf("--slo-ms %v: must be ≥ 0", *sloMs))
	}
	path := fs.Arg(0)
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, report.ServicesFile)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	log, err := harness.ReadServices(f)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	for i := range log.Backends {
		harness.SpreadArrivals(log.Backends[i].Services, *spreadMs)
	}
	if !isTerminal(stderr) {
		n := 0
		for _, b := range log.Backends {
			n += len(b.Services)
		}
		fmt.Fprintf(stderr, "resweeping %d services of %d backends from %s\n", n, len(log.Backends), path)
	}
	started := time.Now()
	rows, slo, source := harness.Resweep(log, *sloMs)
	if !isTerminal(stderr) {
		fmt.Fprintf(stderr, "swept in %.1f s\n", time.Since(started).Seconds())
	}
	if *jsonOut {
		return writeIndentedJSON(stdout, rows)
	}
	fmt.Fprintf(stdout, "model %s, SLO p90 ≤ %.2f ms (%s); the report used %.2f ms (%s)\n", log.Model, slo, source, log.SLOms, log.SLOSource)
	if *spreadMs > 0 {
		fmt.Fprintf(stdout, "arrivals that coincided spread over %.0f ms (--spread-ms); services as measured\n", *spreadMs)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\tp50 ms\tp90 ms\tp99 ms\trate@SLO req/s\t")
	for _, r := range rows {
		bound := ""
		if r.MaxRateIsLowerBound {
			bound = "≥ "
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%s%.3f\t\n", r.Backend, r.TTFTmsP50, r.TTFTmsP90, r.TTFTmsP99, bound, r.MaxRateAtSLO)
	}
	return tw.Flush()
}
