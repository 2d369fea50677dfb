package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tutti-io/tutti/devbench"
)

func init() {
	register("devbench", "measure a device: O_DIRECT reads/writes through io_uring and pread (the ceiling)", runDevbench)
}

func runDevbench(args []string, stdout, stderr io.Writer) (err error) {
	fs := newFlagSet("devbench", stderr)
	d := devbench.DefaultConfig()
	path := fs.String("path", "", "file, directory (a test file is created in it) or block device to measure (required)")
	bsFlag := fs.String("bs", "4k,16k,64k,256k,1m,4m", "block sizes, comma-separated (4k, 1m, 65536, ...)")
	qdFlag := fs.String("qd", "1,4,16,64,256", "queue depths (for pread: goroutines), comma-separated")
	engines := fs.String("engines", "uring,uring-sqpoll,pread", "engines: "+strings.Join(devbench.Engines, ","))
	ops := fs.String("ops", "randread,seqread", "ops: "+strings.Join(devbench.Ops, ",")+" (writes overwrite the target)")
	runtimeFlag := fs.Duration("runtime", d.Runtime, "measuring time per grid point")
	sizeFlag := fs.String("size", "1GiB", "test file size (a block device is used whole)")
	keep := fs.Bool("keep", false, "keep the test file this run wrote")
	bufFlag := fs.String("buffer", "", "uring engines: memory the I/Os rotate over (e.g. 1GiB; empty: one block per I/O in flight, which a large CPU cache may hold)")
	jsonOut := fs.Bool("json", false, "print rows as JSON (one array) instead of a table")
	holes := fs.Bool("allow-holes", false, "read a loop device even where its backing file has holes (refused otherwise: a read of a hole never reaches the medium)")
	striped := fs.Bool("striped", false, "the ceiling of the comma-separated --path list as one striped array: each reads --size (1 MiB O_DIRECT random reads, QD 32, a ring each, into --buffer), all at once, timed to the slowest (devbench.CeilingStriped); with --ops seqwrite the write ceiling by the same rule: each overwrites --size with 1 MiB O_DIRECT sequential writes, QD 32, then fdatasyncs (devbench.CeilingStripedWrite); --bs, --qd, --engines and --runtime do not apply")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tutti devbench --path FILE_OR_DEVICE [flags]")
		fmt.Fprintln(stderr, "\nfio-style O_DIRECT measurement: IOPS, bytes/s, latency p50/p99, CPU s per GiB per (engine, op, block size, queue depth).")
		fmt.Fprintln(stderr, "example: tutti devbench --path /tmp --bs 4k,1m --qd 8,64 --engines uring,pread --ops randread --runtime 2s --size 1GiB")
		fmt.Fprintln(stderr, "striped array: tutti devbench --striped --path /dev/nvme0n1,/dev/nvme1n1 --size 4GiB --buffer 256MiB")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr(fs.Usage, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if *path == "" {
		return usageErr(fs.Usage, errors.New("--path is required"))
	}
	cfg := devbench.Config{Path: *path, Runtime: *runtimeFlag, Keep: *keep, Seed: 1, AllowHoles: *holes}
	if cfg.SizeBytes, err = devbench.ParseBytes(*sizeFlag); err != nil {
		return usageErr(fs.Usage, fmt.Errorf("--size: %w", err))
	}
	if *bufFlag != "" {
		if cfg.BufferBytes, err = devbench.ParseBytes(*bufFlag); err != nil {
			return usageErr(fs.Usage, fmt.Errorf("--buffer: %w", err))
		}
	}
	// SIGINT and SIGTERM cancel ctx: the test file is removed on the way
	// out (devbench closes its target), then the exit status says so.
	ctx, interrupted, stop := signalContext(stderr)
	defer func() { err = interrupted(err) }()
	defer stop()
	if *striped {
		write := false
		switch *ops {
		case "seqwrite":
			write = true
		case "randread", "randread,seqread":
		default:
			return usageErr(fs.Usage, fmt.Errorf("--striped takes --ops randread (the default) or seqwrite, not %q", *ops))
		}
		return runStriped(ctx, splitList(*path), cfg.SizeBytes, cfg.BufferBytes, write, *jsonOut, stdout, fs.Usage)
	}
	if cfg.BlockSizes, err = parseSizes(*bsFlag); err != nil {
		return usageErr(fs.Usage, fmt.Errorf("--bs: %w", err))
	}
	if cfg.QueueDepths, err = parseInts(*qdFlag); err != nil {
		return usageErr(fs.Usage, fmt.Errorf("--qd: %w", err))
	}
	cfg.Engines, cfg.Ops = splitList(*engines), splitList(*ops)
	if err := cfg.Validate(); err != nil {
		return usageErr(fs.Usage, err)
	}
	if isTerminal(stderr) {
		cfg.Progress = progressBar(stderr)
	} else {
		// A pipe or a CI log: whole lines, at most one every few seconds.
		lp := newLineProgress(stderr)
		fmt.Fprintf(stderr, "devbench %s: writing or opening the target, then the grid\n", *path)
		cfg.Progress = func(done, total int, spec devbench.Spec, row *devbench.Row) {
			if row != nil {
				lp.Note("grid points", done, total, fmt.Sprintf("(last %s: %.0f IOPS, %.1f MB/s)", spec, row.IOPS, row.BytesPerS/1e6))
			}
		}
	}
	started := time.Now()
	rows, err := devbench.Run(ctx, cfg)
	if isTerminal(stderr) {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil {
		if len(rows) > 0 {
			printRows(stdout, rows, *jsonOut)
		}
		return err
	}
	if err := printRows(stdout, rows, *jsonOut); err != nil {
		return err
	}
	if !*jsonOut {
		host, _ := os.Hostname()
		fmt.Fprintf(stdout, "\n%d rows in %v on %s (%d CPUs), %s UTC\n", len(rows), time.Since(started).Round(time.Second), host, numCPU(), started.UTC().Format("2006-01-02 15:04"))
	}
	return nil
}

// runStriped is devbench --striped: devbench.CeilingStriped (or, with
// write, CeilingStripedWrite) over paths, each reading or overwriting
// sizeBytes (and, if a directory, holding a test file of that size) from
// bufferBytes of memory.
func runStriped(ctx context.Context, paths []string, sizeBytes, bufferBytes int64, write, asJSON bool, stdout io.Writer, usage func()) error {
	if len(paths) == 0 {
		return usageErr(usage, errors.New("--striped: --path lists no path"))
	}
	sizes := slices.Repeat([]int64{sizeBytes}, len(paths))
	ceiling, col, op := devbench.CeilingStriped, "read", "read"
	if write {
		ceiling, col, op = devbench.CeilingStripedWrite, "written", "write"
	}
	st, err := ceiling(ctx, paths, sizes, sizes, bufferBytes)
	if err != nil {
		return err
	}
	if asJSON {
		return writeIndentedJSON(stdout, st)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "path\t%s\tseconds\tMB/s\tp50 µs\tp99 µs\t\n", col)
	for i, r := range st.Devices {
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.1f\t%.1f\t%.1f\t\n", paths[i], devbench.FormatBytes(r.Bytes), r.Seconds, r.BytesPerS/1e6, r.P50Us, r.P99Us)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nstriped %s ceiling %.1f MB/s: %d devices' bytes over the slowest one's %.3f s (%s); their own rates sum to %.1f MB/s\n",
		op, st.BytesPerS/1e6, len(paths), st.Seconds, paths[st.Slowest], st.SumBytesPerS/1e6)
	return nil
}

// usageErr prints the usage and returns err; flag errors exit 2 (like flag
// parse errors) after the message.
func usageErr(usage func(), err error) error {
	usage()
	return fmt.Errorf("%w", err)
}

// writeIndentedJSON writes v as one indented JSON document (the CLI's
// --json for a single result).
func writeIndentedJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printRows(w io.Writer, rows []devbench.Row, asJSON bool) error {
	if asJSON {
		return writeIndentedJSON(w, rows)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "engine\top\tbs\tqd\tIOPS\tMB/s\tp50 µs\tp99 µs\tCPU s/GiB\tsqpoll CPU s\t")
	for _, r := range rows {
		sq := "-"
		if r.Engine == "uring-sqpoll" {
			sq = fmt.Sprintf("%.2f", r.SQPollCPUS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.0f\t%.1f\t%.1f\t%.1f\t%.3f\t%s\t\n", r.Engine, r.Op, devbench.FormatBytes(int64(r.BlockBytes)), r.QueueDepth,
			r.IOPS, r.BytesPerS/1e6, r.P50Us, r.P99Us, r.CPUSPerGiB, sq)
	}
	return tw.Flush()
}

func progressBar(w io.Writer) func(done, total int, spec devbench.Spec, row *devbench.Row) {
	return func(done, total int, spec devbench.Spec, row *devbench.Row) {
		const width = 30
		fill := done * width / max(total, 1)
		last := ""
		if row != nil {
			last = fmt.Sprintf("  %.0f IOPS %.1f MB/s", row.IOPS, row.BytesPerS/1e6)
		}
		fmt.Fprintf(w, "\r\033[K[%s%s] %d/%d %s%s", strings.Repeat("#", fill), strings.Repeat(" ", width-fill), done, total, spec, last)
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, p := range splitList(s) {
		v, err := devbench.ParseBytes(p)
		if err != nil {
			return nil, err
		}
		out = append(out, int(v))
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range splitList(s) {
		v, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("bad number %q", p)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func numCPU() int { return runtime.NumCPU() }
