// Package report turns a replay's results into what a person reads: a
// Markdown report, PNG plots (TTFT CDF per backend, SLO attainment against
// request rate, restore bandwidth over time; drawn with gonum.org/v1/plot),
// and a progress bar on a terminal.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tutti-io/tutti/eval/harness"
	"golang.org/x/term"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Meta is how the replay was invoked, for the report's header.
type Meta struct {
	Command   string // the command line that reproduces the run
	TracePath string // the workload in words: a trace's path, the embedded window, or a generated workload's Describe
	Skipped   int    // invalid trace lines skipped (--skip-bad)
	TimeScale float64
	Notes     []string
}

// Files written by Write.
const (
	MarkdownFile  = "report.md"
	JSONFile      = "results.json"
	TTFTPlot      = "ttft_cdf.png"
	SLOPlot       = "slo_vs_rate.png"
	TTFTRatePlot  = "ttft_vs_rate.png"
	BandwidthPlot = "bandwidth.png"
	ServicesFile  = "services.json" // harness.ServiceLog: what `tutti resweep` replays again
	WarmFile      = "warm.json"     // harness.WarmSummary, when the window started warm (--warm-ms)
)

// Write writes the Markdown report, results.json and the plots into dir and
// returns the report's path.
func Write(dir string, res *harness.Result, meta Meta) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var plotErrs []string
	for name, draw := range map[string]func(*harness.Result, string) error{
		TTFTPlot: plotTTFT, SLOPlot: plotSLO, BandwidthPlot: plotBandwidth, TTFTRatePlot: plotTTFTRate,
	} {
		if err := draw(res, filepath.Join(dir, name)); err != nil {
			plotErrs = append(plotErrs, fmt.Sprintf("%s: %v", name, err))
		}
	}
	f, err := os.Create(filepath.Join(dir, JSONFile))
	if err != nil {
		return "", err
	}
	if err := WriteJSON(f, res); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	f, err = os.Create(filepath.Join(dir, ServicesFile))
	if err != nil {
		return "", err
	}
	if err := harness.WriteServices(f, res); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if res.Warm != nil {
		// results.json stays one row per backend (each row has its warm_*
		// fields); what the history was is one object beside it.
		b, err := json.MarshalIndent(res.Warm, "", "  ")
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, WarmFile), append(b, '\n'), 0o644); err != nil {
			return "", err
		}
	}
	path := filepath.Join(dir, MarkdownFile)
	f, err = os.Create(path)
	if err != nil {
		return "", err
	}
	WriteMarkdown(f, res, meta, plotErrs)
	if err := f.Close(); err != nil {
		return "", err
	}
	if len(plotErrs) > 0 {
		return path, fmt.Errorf("plots: %s", strings.Join(plotErrs, "; "))
	}
	return path, nil
}

// WriteJSON writes one object per backend (a JSON array).
func WriteJSON(w io.Writer, res *harness.Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	rows := make([]harness.BackendResult, 0, len(res.Backends))
	for _, b := range res.Backends {
		rows = append(rows, sanitize(b))
	}
	return enc.Encode(rows)
}

// sanitize replaces NaN/Inf (no requests, no loads) with 0 so the JSON is valid.
func sanitize(b harness.BackendResult) harness.BackendResult {
	for _, p := range []*float64{&b.TTFTmsP50, &b.TTFTmsP90, &b.TTFTmsP99, &b.MaxRateAtSLO, &b.BytesPerS,
		&b.CeilingFraction, &b.CeilingSumFraction, &b.CPUSPerGiB, &b.IOsPerLayerRequestMean, &b.RunsPerRequestMean,
		&b.BlocksPerRequestMean, &b.IOsPerRequestMean, &b.HitRatio, &b.GPUStallMsMean, &b.SaveCPUSPerGiB} {
		if math.IsNaN(*p) || math.IsInf(*p, 0) {
			*p = 0
		}
	}
	return b
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func gbps(b float64) string { return fmt.Sprintf("%.2f GB/s", b/1e9) }

// WriteMarkdown writes the report.
func WriteMarkdown(w io.Writer, res *harness.Result, meta Meta, plotErrs []string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("# tutti replay report\n\n")
	p("Run %s on %s. Reproduce with:\n\n```sh\n%s\n```\n\n", res.Started.Format(time.RFC3339), res.Host, meta.Command)
	writeSetup(p, res, meta)
	writeResults(p, res)
	writeDataPath(p, res)
	writePerBackend(p, res)
	if res.Warm != nil {
		writeWarm(p, res)
	}
	p("\n## Plots\n\n![TTFT p50 and p99 vs request rate](%s)\n\n![SLO attainment vs rate](%s)\n\n![TTFT CDF](%s)\n\n![device and restore bandwidth over time](%s)\n\n",
		TTFTRatePlot, SLOPlot, TTFTPlot, BandwidthPlot)
	if len(plotErrs) > 0 {
		p("Plot errors: %s\n\n", strings.Join(plotErrs, "; "))
	}
	if len(meta.Notes) > 0 {
		p("## Notes\n\n")
		for _, n := range meta.Notes {
			p("- %s\n", n)
		}
		p("\n")
	}
}

// writeSetup is the setup table: workload (a trace or a generated one), model, storage, start, SLO, ceiling.
func writeSetup(p func(string, ...any), res *harness.Result, meta Meta) {
	p("## Setup\n\n")
	p("| | |\n| --- | --- |\n")
	p("| workload | %s |\n", meta.TracePath)
	p("| requests | %d (%d block references, %d distinct blocks, %.1f s of arrivals, %.2f req/s) |\n",
		res.Trace.Requests, res.Trace.BlockRefs, res.Trace.DistinctBlocks, res.Trace.DurationMs/1000, res.Trace.RatePerS)
	if meta.Skipped > 0 {
		p("| skipped trace lines | %d (--skip-bad) |\n", meta.Skipped)
	}
	p("| time scale | %g (arrival times × this; requests sharing a timestamp bucket spread evenly within it) |\n", meta.TimeScale)
	p("| model | %s (%s) |\n", res.Model, res.Geometry)
	if res.Storage != "" || len(res.Dirs) > 1 {
		p("| storage | %s; store dirs %s (every backend spreads its files over all of them) |\n",
			orNone(res.Storage), strings.Join(res.Dirs, ", "))
	}
	p("| storage capacity | %d blocks = %s per backend%s |\n", res.CapacityBlocks, mib(res.CapacityBytes), capNote(res))
	if res.Warm != nil {
		p("| start | %s |\n", res.Warm.Note)
	} else {
		p("| start | cold: every backend's store empty when the window starts (no --warm-ms) |\n")
	}
	p("| left out | %s |\n", leftOut(res))
	p("| window reuse | %d of %d block references can hit under the capacity (%d with no capacity limit%s) |\n",
		res.Reuse.Hits, res.Reuse.BlockRefs, res.Reuse.UnboundedHits, warmHits(res))
	for _, n := range harness.WindowNotes(res) {
		p("| **read this first** | %s |\n", n)
	}
	p("| engine KV memory | %s (host, per-layer layout) |\n", mib(res.KVMemoryBytes))
	p("| compute | %s |\n", res.ComputeModel)
	p("| TTFT SLO | p90 ≤ %.2f ms (%s) |\n", res.SLOms, res.SLOSource)
	if res.CeilingBytesPS > 0 && len(res.Dirs) > 1 {
		p("| device ceiling | %s striped, %s summed (%s) |\n", gbps(res.CeilingBytesPS), gbps(res.CeilingSumBytesPS), res.CeilingNote)
	} else if res.CeilingBytesPS > 0 {
		p("| device ceiling | %s (%s) |\n", gbps(res.CeilingBytesPS), res.CeilingNote)
	} else {
		p("| device ceiling | %s |\n", res.CeilingNote)
	}
	p("\n")
}

// writeResults says how TTFT is measured, then the results table per
// backend and where tutti-cpu is below one.
func writeResults(p func(string, ...any), res *harness.Result) {
	p("TTFT comes from a deterministic timeline: restore and save times are measured for real on this machine, " +
		"one request at a time, in arrival order; the prefill is the compute model above. In the timeline the GPU runs " +
		"one prefill at a time and a layer computes once it is loaded and the previous layer is done (time the GPU " +
		"waits is the GPU stall); the device serves loads first, in arrival order, and saves only in its idle time, " +
		"yielding between blocks (every backend alike). SLO attainment against rate replays the same measured service " +
		"times at scaled arrival rates (max rate: highest rate whose p90 TTFT meets the SLO). Restore GB/s is restored " +
		"bytes over the summed restore times; CPU s/GiB is process CPU time during restores per GiB restored.\n\n")
	p("## Results\n\n")
	if heading, gains := harness.Gains(res); heading != "" {
		p("**%s%s**:\n\n", strings.ToUpper(heading[:1]), heading[1:])
		for _, g := range gains {
			p("- against `%s`: %s\n", g.Against, g.Text)
		}
		p("\n")
	}
	if rounds := roundsOf(res); rounds > 1 {
		p("Every backend replayed the window %d times, interleaved (each round's order rotated by one); each row is the backend's median round by rate at SLO, with the range over the rounds: compare two backends by their ranges, not by one round's ratio.\n\n", rounds)
	} else {
		p("One round: on a shared or noisy machine one replay's ratio between two backends can be noise (run with --rounds N for each backend's spread).\n\n")
	}
	p("| backend | TTFT p50 ms | p90 | p99 | max rate at SLO (req/s) | restore GB/s | of ceiling | of sum | CPU s/GiB | hit ratio | I/Os per request | GPU stall ms | fallbacks | verify mismatches |\n")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, b := range res.Backends {
		if b.Skipped != "" {
			continue
		}
		b = sanitize(b)
		rate := fmt.Sprintf("%.3f", b.MaxRateAtSLO)
		if b.MaxRateIsLowerBound {
			rate = "≥ " + rate
		}
		if b.Rounds != nil {
			lo, hi := harness.MinMax(b.Rounds.MaxRateAtSLO)
			plo, phi := harness.MinMax(b.Rounds.TTFTmsP99)
			rate += fmt.Sprintf(" (%.3f–%.3f over %d rounds; p99 %.2f–%.2f ms)", lo, hi, len(b.Rounds.MaxRateAtSLO), plo, phi)
		}
		p("| %s | %.2f | %.2f | %.2f | %s | %.2f | %.2f | %.2f | %.3f | %.3f | %.1f | %.2f | %d | %d |\n",
			b.Backend, b.TTFTmsP50, b.TTFTmsP90, b.TTFTmsP99, rate, b.BytesPerS/1e9, b.CeilingFraction, b.CeilingSumFraction,
			b.CPUSPerGiB, b.HitRatio, b.IOsPerRequestMean, b.GPUStallMsMean, b.Fallbacks+b.SaveFallbacks, b.VerifyMismatches)
	}
	if notes := harness.BelowNotes(res); len(notes) > 0 {
		p("\n**Where tutti-cpu is below a backend, and why** (from this run's measurements):\n\n")
		for _, n := range notes {
			p("- %s\n", n)
		}
	}
	writeClaims(p, res)
}

// writeDataPath is the data path proof: what each backend restored, read
// and wrote, against the device counters.
func writeDataPath(p func(string, ...any), res *harness.Result) {
	p("\n### Data path proof\n\n")
	p("| backend | restored | read by the backend | device read | source | diskstats read | device write | saved | evicted blocks | read latency p50/p99 µs | O_DIRECT |\n")
	p("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |\n")
	for _, b := range res.Backends {
		if b.Skipped != "" {
			continue
		}
		lat := "—"
		if b.DeviceReadLatencyP50Us > 0 {
			lat = fmt.Sprintf("≤%.0f / ≤%.0f", b.DeviceReadLatencyP50Us, b.DeviceReadLatencyP99Us)
		}
		amp := ""
		if b.RestoredBytes > 0 {
			amp = fmt.Sprintf(" (×%.2f)", float64(b.ReadBytes)/float64(b.RestoredBytes))
		}
		p("| %s | %s | %s%s | %s | %s | %s | %s | %s | %d | %s | %v |\n", b.Backend, mib(b.RestoredBytes),
			mib(b.ReadBytes), amp, mib(int64(b.DeviceReadBytes)), b.DeviceBytesSource, mib(int64(b.DiskstatsReadBytes)),
			mib(int64(b.DeviceWriteBytes)), mib(b.SavedBytes), b.EvictedBlocks, lat, b.DirectIO)
	}
	p("\n\"Read by the backend\" is what it read from its storage to restore (× the restored bytes: read amplification " +
		"from padding, bounce strides, or whole objects read to check their CRC). ")
	p("Device counters cover the whole disk during the backend's run (other processes' I/O included), so they " +
		"bound the backend's reads from above; for O_DIRECT backends device reads must be at least the restored bytes. " +
		"The page-cache backend may restore from memory (device reads below restored bytes).\n\n")
}

// writePerBackend says what each backend is (harness.BackendSummary, its
// label) or why it did not run, then the table per backend (requests,
// hits, runs, I/Os, times).
func writePerBackend(p func(string, ...any), res *harness.Result) {
	var lines []string
	for _, b := range res.Backends {
		what := harness.BackendSummary(b.Backend)
		switch {
		case b.Skipped != "":
			what += "; not run: " + b.Skipped
		case b.Label != "":
			what += "; " + b.Label
		}
		lines = append(lines, fmt.Sprintf("- `%s`: %s", b.Backend, strings.TrimPrefix(what, "; ")))
	}
	if len(lines) > 0 {
		p("### Backends\n\n%s\n\n", strings.Join(lines, "\n"))
	}
	p("### Per backend\n\n")
	p("| backend | requests | with hits | hit blocks | blocks/request | runs/request | I/Os per layer and request | wall s | load s | save s | save CPU s/GiB |\n")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, b := range res.Backends {
		if b.Skipped != "" {
			continue
		}
		b = sanitize(b)
		p("| %s | %d | %d | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.3f |\n", b.Backend, b.Requests,
			b.RequestsWithHitsRestore, b.HitBlocks, b.BlocksPerRequestMean, b.RunsPerRequestMean,
			b.IOsPerLayerRequestMean, b.WallSeconds, b.LoadSeconds, b.SaveSeconds, b.SaveCPUSPerGiB)
	}
}

// writeWarm is the warm-up section: the history and what each backend saved
// before the window (none of it in the tables above).
func writeWarm(p func(string, ...any), res *harness.Result) {
	w := res.Warm
	p("\n### Warm start\n\n%s.\n\n", w.Note)
	if w.UsedRequests == 0 {
		return
	}
	p("History: %d requests with trace timestamps in [%.0f, %.0f) ms (--warm-ms %.0f; they span %.1f s, trace lines %d-%d); %d of them share a prefix with the window. "+
		"Warm set: %d blocks (%s); the shared index admitted %d block saves, evicted %d, and held %d blocks when the window started. "+
		"The warm-up is untimed and runs no prefill: its saves, I/Os and device bytes are in no column above (the device counters start after it), "+
		"and the hit ratio's denominator is the window's block references.\n\n",
		w.HistoryRequests, w.FromMs, w.ToMs, w.DurationMs, w.HistorySpanMs/1000, w.FirstLine, w.LastLine, w.UsedRequests,
		w.Blocks, mib(w.Bytes), w.Saves, w.EvictedBlocks, w.Resident)
	p("| backend | warm-up saved blocks | saved | wall s | evicted (shared index) | fallbacks | note |\n")
	p("| --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, b := range res.Backends {
		if b.Skipped != "" {
			continue
		}
		p("| %s | %d | %s | %.2f | %d | %d | %s |\n", b.Backend, b.WarmSavedBlocks, mib(b.WarmSavedBytes),
			b.WarmSeconds, b.WarmEvictedBlocks, b.WarmFallbacks, b.WarmNote)
	}
	p("\n")
}

// roundsOf is how many rounds the replay ran (1 when no row carries them).
func roundsOf(res *harness.Result) int {
	for _, b := range res.Backends {
		if b.Rounds != nil {
			return len(b.Rounds.MaxRateAtSLO)
		}
	}
	return 1
}

// leftOut says which requests the machine's bounds left out or cut, for
// every backend alike.
func leftOut(res *harness.Result) string {
	s := fmt.Sprintf("%d requests whose KV exceeds the engine memory bound of %s (--kv-mem; for every backend)", res.Oversize, mib(res.MaxKVBytes))
	if n := res.Reuse.OverCapacity; n > 0 {
		s += fmt.Sprintf("; %d requests longer than the storage capacity, saved only in part", n)
	}
	return s
}

func warmHits(res *harness.Result) string {
	if res.Warm == nil {
		return ""
	}
	return fmt.Sprintf("; %d of the hits from the warm-up's %d blocks", res.Reuse.WarmHits, res.Reuse.WarmBlocks)
}

func orNone(s string) string {
	if s == "" {
		return "(no label)"
	}
	return s
}

func capNote(res *harness.Result) string {
	if int64(res.CapacityBlocks) < res.DistinctBlocks {
		return fmt.Sprintf(" (%s; below the %d distinct blocks of the window: leaf-first LRU eviction)", res.CapacityNote, res.DistinctBlocks)
	}
	return " (every distinct block of the window fits: no eviction)"
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p
}

// logX makes the x axis logarithmic; the range starts positive so that a plot
// with no line (no backend ran) still draws.
func logX(p *plot.Plot) {
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.X.Min, p.X.Max = 1, 10
}

func ran(res *harness.Result) []harness.BackendResult {
	var out []harness.BackendResult
	for _, b := range res.Backends {
		if b.Skipped == "" && len(b.TTFTms) > 0 {
			out = append(out, b)
		}
	}
	return out
}

func addLine(p *plot.Plot, i int, name string, xys plotter.XYs) error {
	l, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	l.Color = plotutil.Color(i)
	l.Dashes = plotutil.Dashes(i)
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

func plotTTFT(res *harness.Result, path string) error {
	p := newPlot("TTFT CDF ("+res.Model+")", "TTFT (ms, log scale)", "fraction of requests")
	logX(p)
	for i, b := range ran(res) {
		xs := append([]float64(nil), b.TTFTms...)
		sort.Float64s(xs)
		xys := make(plotter.XYs, 0, len(xs))
		for k, x := range xs {
			xys = append(xys, plotter.XY{X: math.Max(x, 1e-3), Y: float64(k+1) / float64(len(xs))})
		}
		if err := addLine(p, i, b.Backend, xys); err != nil {
			return err
		}
	}
	p.Legend.Left = false
	p.Legend.Top = false
	p.Legend.XOffs = -vg.Points(5)
	p.Legend.YOffs = vg.Points(5)
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

func plotSLO(res *harness.Result, path string) error {
	p := newPlot(fmt.Sprintf("SLO attainment vs request rate (TTFT ≤ %.1f ms)", res.SLOms),
		"request rate (req/s, log scale)", "fraction of requests within SLO")
	logX(p)
	p.Y.Min, p.Y.Max = 0, 1.05
	for i, b := range ran(res) {
		var xys plotter.XYs
		for _, pt := range b.Curve {
			if pt.RatePerS > 0 {
				xys = append(xys, plotter.XY{X: pt.RatePerS, Y: pt.Attainment})
			}
		}
		if len(xys) == 0 {
			continue
		}
		if err := addLine(p, i, fmt.Sprintf("%s (max %.3g req/s)", b.Backend, b.MaxRateAtSLO), xys); err != nil {
			return err
		}
	}
	p.Legend.Top = false
	p.Legend.Left = true
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// plotTTFTRate draws each backend's TTFT p50 (solid) and p99 (dashed)
// against request rate, from its Sweep curve.
func plotTTFTRate(res *harness.Result, path string) error {
	p := newPlot("TTFT p50 (solid) and p99 (dashed) vs request rate ("+res.Model+")",
		"request rate (req/s, log scale)", "TTFT (ms, log scale)")
	logX(p)
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 1, 10 // positive for the log scale; the lines extend it
	for i, b := range ran(res) {
		for k, q := range []func(harness.RatePoint) float64{
			func(r harness.RatePoint) float64 { return r.P50ms },
			func(r harness.RatePoint) float64 { return r.P99ms },
		} {
			var xys plotter.XYs
			for _, pt := range b.Curve {
				if v := q(pt); pt.RatePerS > 0 && v > 0 && !math.IsNaN(v) && !math.IsInf(v, 0) {
					xys = append(xys, plotter.XY{X: pt.RatePerS, Y: v})
				}
			}
			if len(xys) == 0 {
				continue
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return err
			}
			l.Color = plotutil.Color(i)
			l.Width = vg.Points(1.5)
			if k == 1 {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			} else {
				p.Legend.Add(b.Backend, l)
			}
			p.Add(l)
		}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// plotBandwidth draws two panels: the device read bandwidth measured during
// each backend's run (the data path really read the disk), and the restore
// bandwidth over the replay timeline (the arrival-paced view).
func plotBandwidth(res *harness.Result, path string) error {
	top := newPlot("Device reads during each backend's run (measured, whole disk, 200 ms samples)",
		"seconds since the backend's start", "device read GB/s")
	bottom := newPlot("Restore bandwidth over the replay timeline (measured restores at trace arrival times)",
		"time since first arrival (s)", "restore GB/s")
	for i, b := range ran(res) {
		if len(b.Device) > 0 {
			xys := make(plotter.XYs, len(b.Device))
			for k, d := range b.Device {
				xys[k] = plotter.XY{X: d.Seconds, Y: d.ReadBytesPerS / 1e9}
			}
			if err := addLine(top, i, b.Backend, xys); err != nil {
				return err
			}
		}
		if len(b.Bandwidth) > 0 {
			xys := make(plotter.XYs, len(b.Bandwidth))
			for k := range b.Bandwidth {
				xys[k] = plotter.XY{X: b.BandwidthT[k] / 1000, Y: b.Bandwidth[k] / 1e9}
			}
			if err := addLine(bottom, i, b.Backend, xys); err != nil {
				return err
			}
		}
	}
	const w, h = 8 * vg.Inch, 8 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(4)}
	canvases := plot.Align([][]*plot.Plot{{top}, {bottom}}, tiles, dc)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Progress draws a one-line progress bar when its writer is a terminal and
// stays silent otherwise (logs and pipes get no control characters). Safe
// for concurrent use.
type Progress struct {
	mu   sync.Mutex
	w    io.Writer
	on   bool
	last time.Time
}

// NewProgress returns a progress bar on w.
func NewProgress(w io.Writer) *Progress {
	f, ok := w.(*os.File)
	return &Progress{w: w, on: ok && term.IsTerminal(int(f.Fd()))}
}

// Enabled reports whether the bar draws.
func (p *Progress) Enabled() bool { return p.on }

// Update shows label and done/total, at most every 100 ms and always at the end.
func (p *Progress) Update(label string, done, total int) {
	if !p.on || total <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if done < total && time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	const width = 30
	n := done * width / total
	fmt.Fprintf(p.w, "\r%-12s [%s%s] %d/%d", label, strings.Repeat("=", n), strings.Repeat(" ", width-n), done, total)
	if done == total {
		fmt.Fprintln(p.w)
	}
}
