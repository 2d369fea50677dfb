// Package pool is `tutti gpubench-pool`: the rounds of several gpubench
// calls, pooled. A call may land on a fresh host, and which of two paths
// that both run near the ceiling comes out ahead can change from host to
// host (BENCHMARKS.md, Restore into GPU memory). One call's median then says more
// about its host than about the paths; the pool of every call's rounds,
// and the ratio of two paths within each round (same host, same minute),
// is what a decision between them rests on.
package pool

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/tutti-io/tutti/eval/gpubench"
	"github.com/tutti-io/tutti/eval/metrics"
)

// Limits on what gpubench-pool reads: gpubench writes one line per path of
// a few KiB.
const (
	poolMaxLineBytes = 1 << 20
	poolMaxRows      = 100000
)

// Row is one path's rounds in one gpubench file.
type Row struct {
	file string
	row  gpubench.Row
	// rounds are the per-round values, or the row's own values as one round
	// when it has none (a file from before --rounds).
	bytesPerS, ceilFrac, cpu []float64
	// iowq is each round's io-wq workers; nil in files from before they
	// were counted.
	iowq []int
	// pos is where the path ran in each round (0: first); nil in files
	// from before it was recorded.
	pos []int
}

// readBenchRows parses gpubench --json output: one JSON object per line,
// blank lines skipped. An error names the line. A row that failed (error
// set) is kept: the pool counts it and leaves its numbers out.
func readBenchRows(r io.Reader, name string) ([]Row, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), poolMaxLineBytes)
	var out []Row
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if len(out) == poolMaxRows {
			return nil, fmt.Errorf("%s:%d: more than %d rows", name, line, poolMaxRows)
		}
		var row gpubench.Row
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&row); err != nil {
			return nil, fmt.Errorf("%s:%d: not a gpubench row: %w", name, line, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("%s:%d: more than one JSON value on the line", name, line)
		}
		if row.Path == "" {
			return nil, fmt.Errorf("%s:%d: a row without a path", name, line)
		}
		p := Row{file: name, row: row}
		pr := row.PerRound
		switch {
		case len(pr.BytesPerS) == 0:
			p.bytesPerS, p.ceilFrac, p.cpu = []float64{row.BytesPerS}, []float64{row.CeilingFraction}, []float64{row.CPUSPerGiB}
		case len(pr.CeilingFraction) != len(pr.BytesPerS) || len(pr.CPUSPerGiB) != len(pr.BytesPerS) ||
			(pr.IOWQWorkers != nil && len(pr.IOWQWorkers) != len(pr.BytesPerS)) ||
			(pr.Position != nil && len(pr.Position) != len(pr.BytesPerS)):
			return nil, fmt.Errorf("%s:%d: path %q: %d rounds of bytes/s, %d of ceiling fraction, %d of CPU s/GiB, %d of io-wq workers, %d of positions",
				name, line, row.Path, len(pr.BytesPerS), len(pr.CeilingFraction), len(pr.CPUSPerGiB), len(pr.IOWQWorkers), len(pr.Position))
		default:
			p.bytesPerS, p.ceilFrac, p.cpu, p.iowq, p.pos = pr.BytesPerS, pr.CeilingFraction, pr.CPUSPerGiB, pr.IOWQWorkers, pr.Position
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	return out, nil
}

// Pooled is one (model, storage, path) over every file that ran it.
type Pooled struct {
	File       string  `json:"file,omitempty"` // --by-file: the one file Pooled
	Model      string  `json:"model"`
	Storage    string  `json:"storage"`
	Path       string  `json:"path"`
	Files      int     `json:"files"`
	Rounds     int     `json:"rounds"`
	Failed     int     `json:"failed_files,omitempty"` // files where the path failed; their rounds are left out
	Mismatches uint64  `json:"verify_mismatches"`
	BytesPerS  float64 `json:"bytes_per_s_median"`
	CeilFrac   float64 `json:"ceiling_fraction_median"`
	CeilMin    float64 `json:"ceiling_fraction_min"`
	CeilMax    float64 `json:"ceiling_fraction_max"`
	CPUSPerGiB float64 `json:"cpu_s_per_gib_median"`
	// IOWQRounds of IOWQKnown rounds ran io-wq workers (rounds from files
	// that did not count them are not known).
	IOWQRounds int `json:"io_wq_rounds"`
	IOWQKnown  int `json:"io_wq_rounds_known"`
	// Against the --vs path, round by round in the files that ran both:
	// this path's bytes/s over the other's.
	Vs        string  `json:"vs,omitempty"`
	VsRounds  int     `json:"vs_rounds,omitempty"`
	VsRatio   float64 `json:"vs_ratio_median,omitempty"`
	VsAhead   int     `json:"vs_rounds_ahead,omitempty"` // rounds with a ratio of at least 1
	VsRatioLo float64 `json:"vs_ratio_min,omitempty"`
	VsRatioHi float64 `json:"vs_ratio_max,omitempty"`
	// A distribution-free 95% interval for the median ratio (order
	// statistics; none under 6 rounds), and the two-sided sign test's
	// p-value for "the median ratio is 1": whether the rounds tell the two
	// paths apart at all, where the median alone falls either side of 1 by
	// the host's noise.
	VsCI95Lo float64 `json:"vs_ratio_median_ci95_lo,omitempty"`
	VsCI95Hi float64 `json:"vs_ratio_median_ci95_hi,omitempty"`
	VsSignP  float64 `json:"vs_sign_test_p,omitempty"`
	// The median ratio over the rounds where this path ran before the
	// other, and over those where it ran after (files that record where
	// each path ran): apart, they show what the order alone moves.
	VsFirstRounds  int     `json:"vs_rounds_ran_first,omitempty"`
	VsFirstRatio   float64 `json:"vs_ratio_median_ran_first,omitempty"`
	VsSecondRounds int     `json:"vs_rounds_ran_second,omitempty"`
	VsSecondRatio  float64 `json:"vs_ratio_median_ran_second,omitempty"`
	// The Pooled median CPU s/GiB over that of the --cpu-vs path (files that
	// ran both).
	CPUVs    string  `json:"cpu_vs,omitempty"`
	CPURatio float64 `json:"cpu_ratio,omitempty"`
}

type poolKey struct{ file, model, storage, path string }

// Rows pools rows by (model, storage, path), in the order each first
// appears; byFile keeps each file apart (one call, one host). vs and cpuVs
// pick a path of the same model and storage by the start of its name ("" =
// none); a path is not compared with itself. The ratio against vs pairs
// round k of a file with round k of the same file (gpubench runs every path
// in every round, in the order roundOrder gives).
func Rows(rows []Row, vs, cpuVs string, byFile bool) ([]Pooled, error) {
	g := grouping{groups: map[poolKey][]Row{}}
	for _, r := range rows {
		k := poolKey{"", r.row.Model, r.row.Storage, r.row.Path}
		if byFile {
			k.file = r.file
		}
		if _, ok := g.groups[k]; !ok {
			g.order = append(g.order, k)
		}
		g.groups[k] = append(g.groups[k], r)
	}
	out := make([]Pooled, 0, len(g.order))
	for _, k := range g.order {
		p, err := g.pool(k, vs, cpuVs)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// grouping is Rows' rows by key, keys in the order each first appears.
type grouping struct {
	order  []poolKey
	groups map[poolKey][]Row
}

// find is the row of file whose path starts with prefix, of k's model and
// storage but not k's path; more than one is an error.
func (g *grouping) find(k poolKey, prefix, file string) (Row, bool, error) {
	var hit Row
	n := 0
	for _, o := range g.order {
		if o.model != k.model || o.storage != k.storage || o.path == k.path || !strings.HasPrefix(o.path, prefix) {
			continue
		}
		for _, r := range g.groups[o] {
			if r.file == file {
				hit, n = r, n+1
			}
		}
	}
	if n > 1 {
		return Row{}, false, fmt.Errorf("%s: %d paths start with %q for %s on %q; name one", file, n, prefix, k.model, k.storage)
	}
	return hit, n == 1, nil
}

// samples are one key's pooled per-round values.
type samples struct {
	bps, frac, cpu, ratios, first, second, cpuOwn, cpuOther []float64
}

// pool is key k's Pooled row.
func (g *grouping) pool(k poolKey, vs, cpuVs string) (Pooled, error) {
	p := Pooled{File: k.file, Model: k.model, Storage: k.storage, Path: k.path}
	var s samples
	for _, r := range g.groups[k] {
		p.Files++
		p.Mismatches += r.row.Mismatches
		if r.row.Error != "" {
			p.Failed++
			continue
		}
		s.bps = append(s.bps, r.bytesPerS...)
		s.frac = append(s.frac, r.ceilFrac...)
		s.cpu = append(s.cpu, r.cpu...)
		for _, n := range r.iowq {
			p.IOWQKnown++
			if n > 0 {
				p.IOWQRounds++
			}
		}
		if vs != "" {
			o, ok, err := g.find(k, vs, r.file)
			if err != nil {
				return p, err
			}
			if ok && o.row.Error == "" {
				if len(o.bytesPerS) != len(r.bytesPerS) {
					return p, fmt.Errorf("%s: %q ran %d rounds, %q %d", r.file, k.path, len(r.bytesPerS), o.row.Path, len(o.bytesPerS))
				}
				p.Vs = o.row.Path
				s.addRatios(r, o)
			}
		}
		if cpuVs != "" {
			o, ok, err := g.find(k, cpuVs, r.file)
			if err != nil {
				return p, err
			}
			if ok && o.row.Error == "" {
				p.CPUVs = o.row.Path
				s.cpuOwn = append(s.cpuOwn, r.cpu...)
				s.cpuOther = append(s.cpuOther, o.cpu...)
			}
		}
	}
	p.summarize(&s)
	return p, nil
}

// addRatios adds r's bytes/s over o's, round by round (rounds where o has
// none are left out), also to first or second where both files say where
// each path ran.
func (s *samples) addRatios(r, o Row) {
	ordered := len(r.pos) == len(r.bytesPerS) && len(o.pos) == len(r.bytesPerS)
	for i, b := range r.bytesPerS {
		if o.bytesPerS[i] <= 0 {
			continue
		}
		x := b / o.bytesPerS[i]
		s.ratios = append(s.ratios, x)
		switch {
		case !ordered:
		case r.pos[i] < o.pos[i]:
			s.first = append(s.first, x)
		default:
			s.second = append(s.second, x)
		}
	}
}

// summarize puts s's medians, ranges and tests into p.
func (p *Pooled) summarize(s *samples) {
	p.Rounds = len(s.bps)
	if p.Rounds > 0 {
		p.BytesPerS, p.CeilFrac, p.CPUSPerGiB = gpubench.Median(s.bps), gpubench.Median(s.frac), gpubench.Median(s.cpu)
		p.CeilMin, p.CeilMax = slices.Min(s.frac), slices.Max(s.frac)
	}
	if len(s.ratios) > 0 {
		p.VsRounds, p.VsRatio = len(s.ratios), gpubench.Median(s.ratios)
		p.VsRatioLo, p.VsRatioHi = slices.Min(s.ratios), slices.Max(s.ratios)
		for _, x := range s.ratios {
			if x >= 1 {
				p.VsAhead++
			}
		}
		if lo, hi, ok := metrics.MedianCI(s.ratios, 0.95); ok {
			p.VsCI95Lo, p.VsCI95Hi = lo, hi
		}
		_, _, p.VsSignP = metrics.SignTest(s.ratios, 1)
		if len(s.first) > 0 {
			p.VsFirstRounds, p.VsFirstRatio = len(s.first), gpubench.Median(s.first)
		}
		if len(s.second) > 0 {
			p.VsSecondRounds, p.VsSecondRatio = len(s.second), gpubench.Median(s.second)
		}
	}
	if len(s.cpuOther) > 0 {
		if m := gpubench.Median(s.cpuOther); m > 0 {
			p.CPURatio = gpubench.Median(s.cpuOwn) / m
		}
	}
}

// ReadFiles reads every named gpubench --json file (readBenchRows), in
// order; an error names the file and line.
func ReadFiles(names []string) ([]Row, error) {
	var rows []Row
	for _, name := range names {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		rs, err := readBenchRows(f, name)
		f.Close()
		if err != nil {
			return nil, err
		}
		rows = append(rows, rs...)
	}
	return rows, nil
}

// Print writes the pooled rows as gpubench-pool's table, with a legend.
func Print(w io.Writer, out []Pooled) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	byFile := len(out) > 0 && out[0].File != ""
	if byFile {
		fmt.Fprint(tw, "file\t")
	}
	fmt.Fprintln(tw, "model\tstorage\tpath\tfiles\trounds\tGB/s\tx ceil\tx ceil range\tCPU s/GiB\tio-wq\tvs\tahead\tvs range\tvs 95% CI\tsign p\tvs ran first / second\tCPU ratio\tmismatch")
	for _, p := range out {
		vsCell, ahead, rng, ci, signP, order, cpuCell, iowq := "-", "-", "-", "-", "-", "-", "-", "-"
		if p.IOWQKnown > 0 {
			iowq = fmt.Sprintf("%d of %d", p.IOWQRounds, p.IOWQKnown)
		}
		if p.VsRounds > 0 {
			vsCell = fmt.Sprintf("%.3f", p.VsRatio)
			ahead = fmt.Sprintf("%d of %d", p.VsAhead, p.VsRounds)
			rng = fmt.Sprintf("%.3f-%.3f", p.VsRatioLo, p.VsRatioHi)
			signP = fmt.Sprintf("%.2f", p.VsSignP)
			if p.VsFirstRounds+p.VsSecondRounds > 0 {
				order = fmt.Sprintf("%s / %s", ratioCell(p.VsFirstRatio, p.VsFirstRounds), ratioCell(p.VsSecondRatio, p.VsSecondRounds))
			}
			if p.VsCI95Hi > 0 {
				ci = fmt.Sprintf("%.3f-%.3f", p.VsCI95Lo, p.VsCI95Hi)
			}
		}
		if p.CPURatio > 0 {
			cpuCell = fmt.Sprintf("%.3f", p.CPURatio)
		}
		files := fmt.Sprint(p.Files)
		if p.Failed > 0 {
			files = fmt.Sprintf("%d (%d failed)", p.Files, p.Failed)
		}
		if byFile {
			fmt.Fprintf(tw, "%s\t", p.File)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%.2f\t%.3f\t%.3f-%.3f\t%.4f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n",
			p.Model, p.Storage, shortPath(p.Path), files, p.Rounds, p.BytesPerS/1e9, p.CeilFrac, p.CeilMin, p.CeilMax, p.CPUSPerGiB, iowq, vsCell, ahead, rng, ci, signP, order, cpuCell, p.Mismatches)
	}
	tw.Flush()
	var names []string
	seen := map[string]bool{}
	for _, p := range out {
		for _, n := range []string{p.Vs, p.CPUVs} {
			if n != "" && !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	fmt.Fprintln(w, "io-wq: rounds that ran io-wq workers, of the rounds whose files count them.")
	if len(names) > 0 {
		fmt.Fprintf(w, "vs: the median over rounds of bytes/s over the compared path's in the same round; ahead: rounds at 1 or more; 95%% CI: a distribution-free interval for that median (order statistics, 6 rounds or more); sign p: the two-sided sign test's p-value for a median of 1; ran first / second: the median ratio (rounds) where the path ran before the compared one and where after. CPU ratio: Pooled median CPU s/GiB over the compared path's. Compared paths: %s\n", strings.Join(names, "; "))
	}
}

// ratioCell is a median ratio and its count of rounds, "-" with none.
func ratioCell(r float64, n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f (%d)", r, n)
}

// shortPath is a path's name up to its first " (" detail, for the table.
func shortPath(p string) string {
	if i := strings.Index(p, " ("); i > 0 && !strings.HasPrefix(p, "(") {
		return p[:i]
	}
	return p
}
