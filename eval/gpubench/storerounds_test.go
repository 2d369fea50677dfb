package gpubench

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMergeStoreRounds(t *testing.T) {
	row := func(path, op string, bps, ceil, cpu float64, pos int) StoreRow {
		return StoreRow{Path: path, Op: op, BytesPerS: bps, CeilingBytesPS: ceil, CeilingFraction: bps / ceil, CPUSPerGiB: cpu, Blocks: int(bps), position: pos}
	}
	for _, c := range []struct {
		name   string
		rounds [][]StoreRow
		// want, per merged row: bytes/s, fraction, CPU, ceiling, mismatches,
		// the fraction's range, the positions
		bps, frac, cpu, ceil []float64
		mism                 []uint64
		span, pos            []string
		ratios               []string // storeRatios: op median [min max]
		err                  string
	}{
		{
			name: "three rounds, two paths",
			rounds: [][]StoreRow{
				{row("store-gpu", "save", 10, 20, 0.3, 0), row("store-cpu", "save", 10, 20, 0.9, 1)},
				{row("store-gpu", "save", 14, 14, 0.1, 1), row("store-cpu", "save", 20, 16, 0.8, 0)},
				{row("store-gpu", "save", 12, 16, 0.2, 1), row("store-cpu", "save", 15, 15, 0.7, 0)},
			},
			// gpu fractions 0.5 1.0 0.75; cpu 0.5 1.25 1.0; ratios 1.0 0.7 0.8
			bps: []float64{12, 15}, frac: []float64{0.75, 1.0}, cpu: []float64{0.2, 0.8}, ceil: []float64{16, 16},
			mism: []uint64{0, 0}, span: []string{"[0.50 1.00]", "[0.50 1.25]"}, pos: []string{"[0 1 1]", "[1 0 0]"},
			ratios: []string{"save 0.80 [0.70 1.00]"},
		},
		{
			name: "even count takes the lower middle; mismatches add up",
			rounds: [][]StoreRow{
				{withMismatches(row("store-cpu", "restore", 9, 10, 0, 0), 1)},
				{withMismatches(row("store-cpu", "restore", 3, 10, 0, 0), 2)},
			},
			bps: []float64{3}, frac: []float64{0.3}, cpu: []float64{0}, ceil: []float64{10},
			mism: []uint64{3}, span: []string{"[0.30 0.90]"}, pos: []string{"[0 0]"},
		},
		{
			name: "one op per path, no pair: no ratio",
			rounds: [][]StoreRow{
				{row("store-gpu", "save", 4, 8, 0, 0), row("store-cpu", "restore", 4, 8, 0, 1)},
			},
			bps: []float64{4, 4}, frac: []float64{0.5, 0.5}, cpu: []float64{0, 0}, ceil: []float64{8, 8},
			mism: []uint64{0, 0}, span: []string{"[0.50 0.50]", "[0.50 0.50]"}, pos: []string{"[0]", "[1]"},
		},
		{
			name:   "rounds must have the same rows",
			rounds: [][]StoreRow{{row("store-cpu", "save", 1, 1, 0, 0)}, {row("store-cpu", "restore", 1, 1, 0, 0)}},
			err:    "round 2 row 1 is store-cpu restore",
		},
		{
			name:   "rounds must have as many rows",
			rounds: [][]StoreRow{{row("store-cpu", "save", 1, 1, 0, 0)}, {}},
			err:    "round 2 has 0 store rows",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := mergeStoreRounds(c.rounds)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || len(got) != len(c.bps) {
				t.Fatalf("%d rows, %v", len(got), err)
			}
			for i, r := range got {
				f := r.PerRound.CeilingFraction
				span := fmt.Sprintf("[%.2f %.2f]", slices.Min(f), slices.Max(f))
				if r.BytesPerS != c.bps[i] || !near(r.CeilingFraction, c.frac[i]) || r.CPUSPerGiB != c.cpu[i] || r.CeilingBytesPS != c.ceil[i] ||
					r.Mismatches != c.mism[i] || span != c.span[i] || fmt.Sprint(r.PerRound.Position) != c.pos[i] ||
					r.Rounds != len(c.rounds) || len(r.PerRound.BytesPerS) != len(c.rounds) || r.Blocks != int(c.bps[i]) {
					t.Errorf("row %d: %+v (span %s)", i, r, span)
				}
			}
			var ratios []string
			for _, q := range storeRatios(got) {
				ratios = append(ratios, fmt.Sprintf("%s %.2f [%.2f %.2f]", q.Op, Median(q.Rounds), slices.Min(q.Rounds), slices.Max(q.Rounds)))
			}
			if fmt.Sprint(ratios) != fmt.Sprint(c.ratios) {
				t.Errorf("ratios %q, want %q", ratios, c.ratios)
			}
		})
	}
}

// TestPrintStoreTable: a row per path and op with its fraction's range, and
// the store-gpu/store-cpu line per op both ran.
func TestPrintStoreTable(t *testing.T) {
	st := func(bps, frac []float64) RoundStats { return RoundStats{BytesPerS: bps, CeilingFraction: frac} }
	rows := []StoreRow{
		{Path: PathStoreGPU, Op: "save-again", BytesPerS: 9e9, CeilingFraction: 0.9, Rounds: 2, PerRound: st([]float64{9e9, 8e9}, []float64{0.9, 0.8})},
		{Path: PathStoreCPU, Op: "save-again", BytesPerS: 10e9, CeilingFraction: 1, Rounds: 2, PerRound: st([]float64{10e9, 10e9}, []float64{1, 0.95})},
	}
	var b bytes.Buffer
	printStoreTable(&b, rows)
	out := b.String()
	for _, want := range []string{
		"median of 2 rounds",
		"  store-gpu save-again        0      9.00    0.900   [0.800-0.900]",
		"  store-cpu save-again        0     10.00    1.000   [0.950-1.000]",
		"  store-gpu/store-cpu save-again   median 0.800 [0.800-0.900] of 2 rounds",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if printStoreTable(&b, nil); b.Len() != 0 {
		t.Errorf("no rows printed %q", b.String())
	}
}

// TestCeilingFileBytes: the share of the prefix clamped to 64 MiB..2 GiB,
// whole MiB, shrunk to what fits beside the stores on one file system, an
// error where 64 MiB do not.
func TestCeilingFileBytes(t *testing.T) {
	d1, d2 := t.TempDir(), t.TempDir()
	avail := freeBytes(t, d1)
	for _, c := range []struct {
		name        string
		dirs        []string
		want, store int64
		get         int64 // -1: an error
	}{
		{"share", []string{d1}, 100<<20 + 5, 0, 100 << 20},
		{"at least 64 MiB", []string{d1}, 1, 0, minCeilingFile},
		{"at most 2 GiB", []string{d1}, 5 << 30, 0, maxCeilingFile},
		{"shrunk beside the store", []string{d1}, 1 << 30, avail - storeSlackBytes - (200 << 20), 200 << 20},
		{"two dirs on one file system share the room", []string{d1, d2}, 1 << 30, avail/2 - storeSlackBytes - (100 << 20), 100 << 20},
		{"no room", []string{d1}, 1 << 30, avail, -1},
	} {
		got, err := ceilingFileBytes(c.dirs, c.want, c.store)
		switch {
		case c.get < 0 && (err == nil || !strings.Contains(err.Error(), "--no-ceiling")):
			t.Errorf("%s: %d, %v: want an error naming --no-ceiling", c.name, got, err)
		case c.get >= 0 && (err != nil || math.Abs(float64(got-c.get)) > 64<<20 || got%(1<<20) != 0):
			// other writers to the file system move its free space a little
			t.Errorf("%s: %d MiB, %v: want about %d MiB", c.name, got>>20, err, c.get>>20)
		}
	}
	if _, err := ceilingFileBytes([]string{d1 + "/nope"}, 1, 0); err == nil {
		t.Error("a missing directory sized")
	}
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

func withMismatches(r StoreRow, n uint64) StoreRow { r.Mismatches = n; return r }

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
