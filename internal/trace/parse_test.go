package trace

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// randomTrace writes n lines: mostly valid requests in non-decreasing
// timestamp buckets, with blank lines and, when bad, malformed ones of every
// kind the Reader names (bad JSON, a missing field, wrong id count, a
// timestamp going back). The last line may lack its newline.
func randomTrace(rng *rand.Rand, n int, bad bool) string {
	var b strings.Builder
	ts := 0
	for i := 0; i < n; i++ {
		if rng.IntN(4) == 0 {
			ts += 1000 * rng.IntN(3)
		}
		in := rng.IntN(3 * 512)
		ids := make([]string, (in+511)/512)
		for j := range ids {
			ids[j] = fmt.Sprint(rng.IntN(50))
		}
		line := fmt.Sprintf(`{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`,
			ts, in, rng.IntN(9), strings.Join(ids, ", "))
		switch r := rng.IntN(20); {
		case r == 0:
			line = ""
		case bad && r == 1:
			line = `{"timestamp": 1,`
		case bad && r == 2:
			line = fmt.Sprintf(`{"timestamp": %d, "output_length": 1, "hash_ids": []}`, ts)
		case bad && r == 3:
			line = fmt.Sprintf(`{"timestamp": %d, "input_length": 513, "output_length": 1, "hash_ids": [1]}`, ts)
		case bad && r == 4 && ts > 0:
			line = fmt.Sprintf(`{"timestamp": %d, "input_length": 0, "output_length": 1, "hash_ids": []}`, ts-1)
		}
		b.WriteString(line)
		if i < n-1 || rng.IntN(2) == 0 {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// sameRead fails the test unless two (requests, stats, error) results are
// equal, errors compared by message.
func sameRead(t *testing.T, what string, gotReqs []Request, gotSt Stats, gotErr error, wantReqs []Request, wantSt Stats, wantErr error) {
	t.Helper()
	msg := func(err error) string {
		if err == nil {
			return "<nil>"
		}
		return err.Error()
	}
	if msg(gotErr) != msg(wantErr) {
		t.Fatalf("%s: error %q, ReadAll's %q", what, msg(gotErr), msg(wantErr))
	}
	if !reflect.DeepEqual(gotReqs, wantReqs) {
		t.Fatalf("%s: %d requests, ReadAll's %d: %+v vs %+v", what, len(gotReqs), len(wantReqs), gotReqs, wantReqs)
	}
	if gotSt.Lines != wantSt.Lines || gotSt.Skipped != wantSt.Skipped || gotSt.Requests != wantSt.Requests ||
		msg(gotSt.FirstSkipped) != msg(wantSt.FirstSkipped) {
		t.Fatalf("%s: stats %+v, ReadAll's %+v", what, gotSt, wantSt)
	}
}

// TestSelectMatchesReadAll: on seeded random traces, with and without
// malformed lines and SkipBad, every window cut from one Parse is what
// ReadAll reads for it, errors naming the same line included; and Select
// hands out a new slice each time.
func TestSelectMatchesReadAll(t *testing.T) {
	// The seeds must reach every case: a window that ends before the
	// malformed line that ends the reading, one that reaches it, and skipped
	// lines counted up to the window's end.
	var before, reached, skippedPart int
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x7e11))
		n := rng.IntN(60)
		input := randomTrace(rng, n, seed%4 != 0)
		opts := Options{SkipBad: rng.IntN(2) == 0}
		p := Parse(strings.NewReader(input), opts)
		for k := 0; k < 12; k++ {
			w := Window{}
			if rng.IntN(2) == 0 {
				w.First = rng.IntN(n + 2)
			}
			if rng.IntN(2) == 0 {
				w.FromMs = float64(rng.IntN(20)*500 - 500)
			}
			if rng.IntN(2) == 0 {
				w.ToMs = w.FromMs + float64(rng.IntN(20)*500)
			}
			what := fmt.Sprintf("seed %d, %d lines, %+v, window %+v", seed, n, opts, w)
			wantReqs, wantSt, wantErr := ReadAll(strings.NewReader(input), opts, w)
			gotReqs, gotSt, gotErr := p.Select(w)
			sameRead(t, what, gotReqs, gotSt, gotErr, wantReqs, wantSt, wantErr)
			switch {
			case p.Err != nil && gotErr == nil:
				before++
			case p.Err != nil:
				reached++
			case gotSt.Skipped > 0 && gotSt.Skipped < p.Stats.Skipped:
				skippedPart++
			}
			if len(gotReqs) > 0 {
				gotReqs[0].ArrivalMs = -1
				if again, _, _ := p.Select(w); again[0].ArrivalMs == -1 {
					t.Fatalf("%s: Select returned a slice shared with the parsed trace", what)
				}
			}
		}
	}
	if before == 0 || reached == 0 || skippedPart == 0 {
		t.Fatalf("cases not covered: %d windows before the error, %d reaching it, %d with part of the skipped lines",
			before, reached, skippedPart)
	}
	t.Logf("%d windows before the error, %d reaching it, %d with part of the skipped lines", before, reached, skippedPart)
}

// TestSelectFatalErrors: errors that end the reading even with SkipBad (a
// read error, a line over MaxLineBytes) reach the windows that reach them,
// and only those.
func TestSelectFatalErrors(t *testing.T) {
	head := good + "\n" + strings.Replace(good, `"timestamp": 0`, `"timestamp": 5`, 1) + "\n"
	readErr := errors.New("disk on fire")
	for _, tc := range []struct {
		name  string
		input func() io.Reader
	}{
		{"read error", func() io.Reader { return io.MultiReader(strings.NewReader(head), iotest.ErrReader(readErr)) }},
		{"long line", func() io.Reader {
			return io.MultiReader(strings.NewReader(head), strings.NewReader(strings.Repeat(" ", MaxLineBytes+1)+"\n"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{SkipBad: true}
			p := Parse(tc.input(), opts)
			if p.Err == nil || len(p.Requests) != 2 {
				t.Fatalf("Parse: %d requests, error %v", len(p.Requests), p.Err)
			}
			for _, w := range []Window{{}, {First: 1}, {First: 2}, {First: 3}, {ToMs: 5}, {FromMs: 5}} {
				wantReqs, wantSt, wantErr := ReadAll(tc.input(), opts, w)
				gotReqs, gotSt, gotErr := p.Select(w)
				sameRead(t, fmt.Sprintf("window %+v", w), gotReqs, gotSt, gotErr, wantReqs, wantSt, wantErr)
			}
		})
	}
}

// FuzzSelect: for any input and window, Parse then Select is ReadAll.
func FuzzSelect(f *testing.F) {
	f.Add([]byte(good+"\n"+good+"\n{oops\n"+good), false, 2, 0.0, 0.0)
	f.Add([]byte(good+"\n\n"+`{"timestamp": 9, "input_length": 0, "output_length": 1, "hash_ids": []}`+"\n"+good+"\n"), true, 0, 1.0, 10.0)
	f.Add([]byte(randomTrace(rand.New(rand.NewPCG(3, 3)), 12, true)), true, 5, 1000.0, 0.0)
	f.Fuzz(func(t *testing.T, input []byte, skipBad bool, first int, fromMs, toMs float64) {
		opts := Options{SkipBad: skipBad, BlockTokens: 512}
		w := Window{First: first, FromMs: fromMs, ToMs: toMs}
		wantReqs, wantSt, wantErr := ReadAll(strings.NewReader(string(input)), opts, w)
		gotReqs, gotSt, gotErr := Parse(strings.NewReader(string(input)), opts).Select(w)
		sameRead(t, fmt.Sprintf("window %+v", w), gotReqs, gotSt, gotErr, wantReqs, wantSt, wantErr)
	})
}
