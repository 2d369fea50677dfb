package pool

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/gpubench"
)

const (
	poolGPU = "gpu-driven (kick, no SQPOLL)"
	poolA   = "(a) uring -> staging -> scatter"
	poolB   = "(b) per-block (page x layer)"
)

// poolLine is one gpubench --json line with per-round values.
func poolLine(t *testing.T, model, path string, bps, frac, cpu []float64, mism uint64, errText string) string {
	t.Helper()
	r := gpubench.Row{Path: path, Storage: "loops", Model: model, Mismatches: mism, Error: errText, Rounds: len(bps),
		PerRound: gpubench.RoundStats{BytesPerS: bps, CeilingFraction: frac, CPUSPerGiB: cpu}}
	if len(bps) > 0 {
		r.BytesPerS, r.CeilingFraction, r.CPUSPerGiB = gpubench.Median(bps), gpubench.Median(frac), gpubench.Median(cpu)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// readPool reads every file's gpubench lines; an error fails the test.
func readPool(t *testing.T, files map[string]string) []Row {
	t.Helper()
	var rows []Row
	for name, in := range files {
		rs, err := readBenchRows(strings.NewReader(in), name)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, rs...)
	}
	return rows
}

func TestReadBenchRows(t *testing.T) {
	ok := poolLine(t, "m", poolGPU, []float64{1, 2, 3}, []float64{.9, .95, 1}, []float64{.1, .2, .3}, 0, "")
	for _, tc := range []struct {
		name, in string
		rows     int
		rounds   []int  // per row
		err      string // substring; "" = no error
	}{
		{"one row, three rounds", ok + "\n", 1, []int{3}, ""},
		{"blank lines skipped", "\n" + ok + "\n\n" + ok, 2, []int{3, 3}, ""},
		{"a row from before --rounds counts as one round", `{"path":"x","bytes_per_s":5,"ceiling_fraction":0.5,"cpu_s_per_gib":0.1}`, 1, []int{1}, ""},
		{"not JSON", ok + "\n{\"path\":", 0, nil, "f.json:2: not a gpubench row"},
		{"unknown field", `{"path":"x","bytes_per_sec":5}`, 0, nil, "f.json:1: not a gpubench row"},
		{"no path", `{"bytes_per_s":5}`, 0, nil, "f.json:1: a row without a path"},
		{"two values on a line", `{"path":"x"} {"path":"y"}`, 0, nil, "f.json:1: more than one JSON value"},
		{"io-wq workers of another length", `{"path":"x","per_round":{"bytes_per_s_rounds":[1,2],"ceiling_fraction_rounds":[1,1],"cpu_s_per_gib_rounds":[1,2],"io_wq_workers_rounds":[0]}}`,
			0, nil, "1 of io-wq workers"},
		{"rounds of unequal length", `{"path":"x","per_round":{"bytes_per_s_rounds":[1,2],"ceiling_fraction_rounds":[1],"cpu_s_per_gib_rounds":[1,2]}}`,
			0, nil, `f.json:1: path "x": 2 rounds of bytes/s, 1 of ceiling fraction, 2 of CPU s/GiB, 0 of io-wq workers`},
	} {
		rows, err := readBenchRows(strings.NewReader(tc.in), "f.json")
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if len(rows) != tc.rows {
			t.Errorf("%s: %d rows, want %d", tc.name, len(rows), tc.rows)
			continue
		}
		for i, r := range rows {
			if len(r.bytesPerS) != tc.rounds[i] || len(r.ceilFrac) != tc.rounds[i] || len(r.cpu) != tc.rounds[i] {
				t.Errorf("%s: row %d has %d/%d/%d rounds, want %d", tc.name, i, len(r.bytesPerS), len(r.ceilFrac), len(r.cpu), tc.rounds[i])
			}
		}
	}
}

func TestPoolRows(t *testing.T) {
	// Two files (two hosts): on the first the GPU path leads (a) in every
	// round, on the second it trails in two of three.
	f1 := strings.Join([]string{
		poolLine(t, "70b", poolGPU, []float64{12, 11, 13}, []float64{.97, .96, .99}, []float64{.004, .004, .005}, 0, ""),
		poolLine(t, "70b", poolA, []float64{10, 10, 12}, []float64{.90, .91, .92}, []float64{.02, .02, .02}, 0, ""),
		poolLine(t, "70b", poolB, []float64{4, 4, 4}, []float64{.3, .3, .3}, []float64{.05, .05, .05}, 0, ""),
	}, "\n")
	f2 := strings.Join([]string{
		poolLine(t, "70b", poolGPU, []float64{9, 14, 10}, []float64{.90, 1.01, .92}, []float64{.003, .003, .003}, 2, ""),
		poolLine(t, "70b", poolA, []float64{10, 12, 11}, []float64{.95, .96, .97}, []float64{.01, .01, .01}, 0, ""),
		poolLine(t, "mla", poolGPU, []float64{5}, []float64{.5}, []float64{.1}, 0, ""),
		poolLine(t, "70b", poolB, nil, nil, nil, 0, "open: no such file"),
	}, "\n")
	rows := readPool(t, map[string]string{"one.json": f1, "two.json": f2})
	out, err := Rows(rows, "(a)", "(b)", false)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Pooled{}
	for _, p := range out {
		got[p.Model+"/"+p.Path] = p
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	g := got["70b/"+poolGPU]
	// Six rounds; the median is the lower middle of an even count, as
	// gpubench's own.
	if g.Files != 2 || g.Rounds != 6 || g.Mismatches != 2 || !near(g.BytesPerS, 11) || !near(g.CeilFrac, .96) ||
		!near(g.CeilMin, .90) || !near(g.CeilMax, 1.01) || !near(g.CPUSPerGiB, .003) {
		t.Errorf("GPU Pooled %+v", g)
	}
	// Ratios per round: 1.2 1.1 1.0833 | 0.9 1.1667 0.9091; ahead 4 of 6.
	if g.Vs != poolA || g.VsRounds != 6 || g.VsAhead != 4 || !near(g.VsRatio, 13.0/12) || !near(g.VsRatioLo, .9) || !near(g.VsRatioHi, 1.2) {
		t.Errorf("GPU against (a): %+v", g)
	}
	// Six rounds: the 95% interval for the median is the extremes; 4 above
	// 1 and 2 below: sign test p = 2·P(X ≤ 2), X ~ Bin(6, 1/2) = 44/64.
	if !near(g.VsCI95Lo, .9) || !near(g.VsCI95Hi, 1.2) || !near(g.VsSignP, 44.0/64) {
		t.Errorf("GPU against (a), interval and sign test: %+v", g)
	}
	// (b) failed in file two: only file one's CPU counts, against file
	// one's GPU rounds: median .004 over .05.
	if g.CPUVs != poolB || !near(g.CPURatio, .004/.05) {
		t.Errorf("GPU CPU ratio: %+v", g)
	}
	b := got["70b/"+poolB]
	if b.Files != 2 || b.Failed != 1 || b.Rounds != 3 {
		t.Errorf("a failed file's rounds are left out and counted: %+v", b)
	}
	a := got["70b/"+poolA]
	if a.VsRounds != 0 || a.Vs != "" {
		t.Errorf("a path compared with itself: %+v", a)
	}
	if m := got["mla/"+poolGPU]; m.Rounds != 1 || m.VsRounds != 0 || m.CPURatio != 0 {
		t.Errorf("a model is compared only with its own paths: %+v", m)
	}

	// --by-file: each file (host) apart.
	per, err := Rows(rows, "(a)", "", true)
	if err != nil {
		t.Fatal(err)
	}
	ahead := map[string]string{}
	for _, p := range per {
		if p.Model == "70b" && p.Path == poolGPU {
			ahead[p.File] = fmt.Sprintf("%d of %d over %d rounds", p.VsAhead, p.VsRounds, p.Rounds)
		}
	}
	if want := map[string]string{"one.json": "3 of 3 over 3 rounds", "two.json": "1 of 3 over 3 rounds"}; fmt.Sprint(ahead) != fmt.Sprint(want) {
		t.Errorf("by file: %v, want %v", ahead, want)
	}

	for _, tc := range []struct {
		name, vs, err string
	}{
		{"a prefix two paths share", "(", `paths start with "("`},
	} {
		if _, err := Rows(rows, tc.vs, "", false); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.err)
		}
	}
	short := strings.Join([]string{
		poolLine(t, "70b", poolGPU, []float64{1, 2}, []float64{1, 1}, []float64{1, 1}, 0, ""),
		poolLine(t, "70b", poolA, []float64{1}, []float64{1}, []float64{1}, 0, ""),
	}, "\n")
	if _, err := Rows(readPool(t, map[string]string{"short.json": short}), "(a)", "", false); err == nil || !strings.Contains(err.Error(), "ran 2 rounds") {
		t.Errorf("rounds that cannot be paired: error %v", err)
	}
}

// FuzzReadBenchRows: any input gives rows or an error, never a panic; rows
// always have a path and as many rounds of each value.
func FuzzReadBenchRows(f *testing.F) {
	f.Add(`{"path":"x","per_round":{"bytes_per_s_rounds":[1,2],"ceiling_fraction_rounds":[1,1],"cpu_s_per_gib_rounds":[1,2]}}`)
	f.Add("\n\n{\"path\":\"y\",\"bytes_per_s\":3}\n")
	f.Add(`{"path":"x"} {"path":"y"}`)
	f.Add(`{"path":1}`)
	f.Fuzz(func(t *testing.T, in string) {
		rows, err := readBenchRows(strings.NewReader(in), "fuzz")
		if err != nil {
			return
		}
		for _, r := range rows {
			if r.row.Path == "" || len(r.bytesPerS) == 0 || len(r.ceilFrac) != len(r.bytesPerS) || len(r.cpu) != len(r.bytesPerS) ||
				(r.iowq != nil && len(r.iowq) != len(r.bytesPerS)) {
				t.Fatalf("row %+v from %q", r, in)
			}
		}
	})
}

// Rounds with io-wq workers are counted where a file counts them, and
// rounds from files that do not are left out of the count.
func TestPoolIOWQRounds(t *testing.T) {
	in := `{"path":"g","model":"m","per_round":{"bytes_per_s_rounds":[1,2,3],"ceiling_fraction_rounds":[1,1,1],"cpu_s_per_gib_rounds":[1,1,1],"io_wq_workers_rounds":[0,4,1]}}
{"path":"g","model":"m","per_round":{"bytes_per_s_rounds":[1,2],"ceiling_fraction_rounds":[1,1],"cpu_s_per_gib_rounds":[1,1]}}`
	out, err := Rows(readPool(t, map[string]string{"f.json": in}), "", "", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].Rounds != 5 || out[0].IOWQRounds != 2 || out[0].IOWQKnown != 3 {
		t.Errorf("Pooled %+v: want 5 rounds, io-wq in 2 of 3 counted", out)
	}
}

// The ratio against the compared path, split by which of the two ran first
// in each round; files without positions count in the Pooled ratio only.
func TestPoolRanFirstSecond(t *testing.T) {
	line := func(path string, bps []float64, pos []int) string {
		r := gpubench.Row{Path: path, Storage: "loops", Model: "70b", Rounds: len(bps),
			PerRound: gpubench.RoundStats{BytesPerS: bps, CeilingFraction: bps, CPUSPerGiB: bps, Position: pos}}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	withPos := line(poolGPU, []float64{9, 11, 9, 11}, []int{0, 1, 1, 0}) + "\n" + line(poolA, []float64{10, 10, 10, 10}, []int{1, 0, 0, 1})
	noPos := line(poolGPU, []float64{20}, nil) + "\n" + line(poolA, []float64{10}, nil)
	out, err := Rows(readPool(t, map[string]string{"pos.json": withPos, "old.json": noPos}), "(a)", "", false)
	if err != nil {
		t.Fatal(err)
	}
	g := out[0]
	if g.Path != poolGPU || g.VsRounds != 5 {
		t.Fatalf("got %+v, want the GPU row over 5 rounds", g)
	}
	// Ran first in rounds 1 and 4: 0.9 and 1.1, the lower middle 0.9; second
	// in rounds 2 and 3: 1.1 and 0.9, 0.9 as well. The old file's round is
	// in neither.
	if g.VsFirstRounds != 2 || g.VsSecondRounds != 2 || g.VsFirstRatio != 0.9 || g.VsSecondRatio != 0.9 {
		t.Errorf("ran first/second: %+v", g)
	}
	skew := line(poolGPU, []float64{9, 11, 11, 11}, []int{0, 1, 1, 1}) + "\n" + line(poolA, []float64{10, 10, 10, 10}, []int{1, 0, 0, 0})
	out, err = Rows(readPool(t, map[string]string{"skew.json": skew}), "(a)", "", false)
	if err != nil {
		t.Fatal(err)
	}
	if g := out[0]; g.VsFirstRounds != 1 || g.VsFirstRatio != 0.9 || g.VsSecondRounds != 3 || math.Abs(g.VsSecondRatio-1.1) > 1e-12 {
		t.Errorf("one round first at 0.9, three second at 1.1: %+v", g)
	}
	var buf bytes.Buffer
	Print(&buf, out)
	if !strings.Contains(buf.String(), "0.900 (1) / 1.100 (3)") {
		t.Errorf("table does not show the split:\n%s", buf.String())
	}
	bad := `{"path":"x","per_round":{"bytes_per_s_rounds":[1,2],"ceiling_fraction_rounds":[1,1],"cpu_s_per_gib_rounds":[1,2],"position_rounds":[0]}}`
	if _, err := readBenchRows(strings.NewReader(bad), "bad.json"); err == nil || !strings.Contains(err.Error(), "1 of positions") {
		t.Errorf("positions of another length: %v", err)
	}
}
