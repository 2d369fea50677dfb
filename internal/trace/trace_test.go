package trace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestParseLine(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		field      string // "" with ok
		ok         bool
		want       Request
	}{
		{name: "ok", line: `{"timestamp": 3000, "input_length": 1025, "output_length": 7, "hash_ids": [0, 5, 9]}`, ok: true,
			want: Request{Line: 1, TimestampMs: 3000, ArrivalMs: 3000, InputTokens: 1025, OutputTokens: 7, HashIDs: []uint64{0, 5, 9}}},
		{name: "unknown fields ignored", line: `{"extra": {"a": [1]}, "timestamp": 1.5, "input_length": 512, "output_length": 0, "hash_ids": [4], "x": null}`, ok: true,
			want: Request{Line: 1, TimestampMs: 1.5, ArrivalMs: 1.5, InputTokens: 512, HashIDs: []uint64{4}}},
		{name: "empty input", line: `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`, ok: true,
			want: Request{Line: 1, OutputTokens: 1, HashIDs: []uint64{}}},
		{name: "not json", line: `{"timestamp": 0,`, field: ""},
		{name: "array", line: `[1,2]`, field: ""},
		{name: "null", line: `null`, field: ""},
		{name: "missing timestamp", line: `{"input_length": 1, "output_length": 1, "hash_ids": [1]}`, field: "timestamp"},
		{name: "null timestamp", line: `{"timestamp": null, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, field: "timestamp"},
		{name: "negative timestamp", line: `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, field: "timestamp"},
		{name: "string timestamp", line: `{"timestamp": "0", "input_length": 1, "output_length": 1, "hash_ids": [1]}`, field: "timestamp"},
		{name: "missing input", line: `{"timestamp": 0, "output_length": 1, "hash_ids": [1]}`, field: "input_length"},
		{name: "fractional input", line: `{"timestamp": 0, "input_length": 1.5, "output_length": 1, "hash_ids": [1]}`, field: "input_length"},
		{name: "negative input", line: `{"timestamp": 0, "input_length": -3, "output_length": 1, "hash_ids": []}`, field: "input_length"},
		{name: "missing output", line: `{"timestamp": 0, "input_length": 1, "hash_ids": [1]}`, field: "output_length"},
		{name: "huge output", line: `{"timestamp": 0, "input_length": 1, "output_length": 99999999999, "hash_ids": [1]}`, field: "output_length"},
		{name: "missing ids", line: `{"timestamp": 0, "input_length": 1, "output_length": 1}`, field: "hash_ids"},
		{name: "ids not array", line: `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": 5}`, field: "hash_ids"},
		{name: "negative id", line: `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-5]}`, field: "hash_ids"},
		{name: "too few ids", line: `{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [1]}`, field: "hash_ids"},
		{name: "too many ids", line: `{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1, 2]}`, field: "hash_ids"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseLine([]byte(tc.line), 1, 512)
			if tc.ok {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if got.Line != tc.want.Line || got.TimestampMs != tc.want.TimestampMs || got.ArrivalMs != tc.want.ArrivalMs ||
					got.InputTokens != tc.want.InputTokens || got.OutputTokens != tc.want.OutputTokens ||
					len(got.HashIDs) != len(tc.want.HashIDs) {
					t.Fatalf("got %+v, want %+v", got, tc.want)
				}
				for i := range got.HashIDs {
					if got.HashIDs[i] != tc.want.HashIDs[i] {
						t.Fatalf("id %d: got %d want %d", i, got.HashIDs[i], tc.want.HashIDs[i])
					}
				}
				return
			}
			var le *LineError
			if !errors.As(err, &le) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("want *LineError wrapping ErrInvalid, got %v", err)
			}
			if le.Line != 1 || le.Field != tc.field {
				t.Fatalf("got line %d field %q, want line 1 field %q (%v)", le.Line, le.Field, tc.field, err)
			}
			if !strings.Contains(err.Error(), "line 1") {
				t.Fatalf("message does not name the line: %v", err)
			}
		})
	}
}

func TestBlockTokensParameter(t *testing.T) {
	line := []byte(`{"timestamp": 0, "input_length": 33, "output_length": 1, "hash_ids": [1, 2, 3]}`)
	if _, err := ParseLine(line, 1, 16); err != nil {
		t.Fatalf("block 16: %v", err)
	}
	if _, err := ParseLine(line, 1, 512); err == nil {
		t.Fatal("block 512: want error")
	}
}

const good = `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}`

func TestReaderErrorsNameLine(t *testing.T) {
	for _, tc := range []struct {
		name, input string
		line        int
		field       string
		skipped     int // with SkipBad
		valid       int // requests with SkipBad
	}{
		{"bad json at 3", good + "\n" + good + "\n{oops\n" + good + "\n", 3, "", 1, 3},
		{"non-monotone at 2", `{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [0]}` + "\n" + good + "\n", 2, "timestamp", 1, 1},
		{"blank lines counted", good + "\n\n\n" + `{"timestamp": 1}` + "\n", 4, "input_length", 1, 1},
		{"no trailing newline", good + "\n" + `{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": []}`, 2, "hash_ids", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rd := NewReader(strings.NewReader(tc.input), Options{})
			var err error
			for err == nil {
				_, err = rd.Next()
			}
			var le *LineError
			if !errors.As(err, &le) || le.Line != tc.line || le.Field != tc.field {
				t.Fatalf("got %v, want line %d field %q", err, tc.line, tc.field)
			}
			// Sticky.
			if _, err2 := rd.Next(); err2 != err {
				t.Fatalf("error not sticky: %v", err2)
			}
			reqs, st, err := ReadAll(strings.NewReader(tc.input), Options{SkipBad: true}, Window{})
			if err != nil {
				t.Fatal(err)
			}
			if st.Skipped != tc.skipped || len(reqs) != tc.valid || st.FirstSkipped == nil {
				t.Fatalf("skip-bad: skipped %d valid %d (first %v), want %d, %d", st.Skipped, len(reqs), st.FirstSkipped, tc.skipped, tc.valid)
			}
		})
	}
}

func TestLongLine(t *testing.T) {
	// A line over the internal buffer (64 KiB) but under the limit parses.
	n := 20000
	var b strings.Builder
	b.WriteString(`{"timestamp": 0, "input_length": `)
	b.WriteString(strconv.Itoa(n * 512))
	b.WriteString(`, "output_length": 1, "hash_ids": [`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(i))
	}
	b.WriteString("]}")
	reqs, _, err := ReadAll(strings.NewReader(b.String()), Options{}, Window{})
	if err != nil || len(reqs) != 1 || len(reqs[0].HashIDs) != n {
		t.Fatalf("got %d reqs, err %v", len(reqs), err)
	}
}

func mk(ts ...float64) []Request {
	reqs := make([]Request, len(ts))
	for i, t := range ts {
		reqs[i] = Request{Line: i + 1, TimestampMs: t, ArrivalMs: t}
	}
	return reqs
}

func arrivals(reqs []Request) []float64 {
	out := make([]float64, len(reqs))
	for i, r := range reqs {
		out[i] = r.ArrivalMs
	}
	return out
}

func eq(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if d := a[i] - b[i]; d > 1e-9 || d < -1e-9 {
			return false
		}
	}
	return true
}

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       []float64
		bucketMs float64
		want     []float64
	}{
		{"gap to next", []float64{0, 0, 0, 3000, 3000, 6000}, 0, []float64{0, 1000, 2000, 3000, 4500, 6000}},
		{"last bucket uses min gap", []float64{0, 3000, 3000}, 0, []float64{0, 3000, 4500}},
		{"bucket width", []float64{0, 0, 3000, 3000}, 1000, []float64{0, 500, 3000, 3500}},
		{"bucket width capped by gap", []float64{0, 0, 100}, 1000, []float64{0, 50, 100}},
		{"single bucket no width", []float64{7, 7, 7}, 0, []float64{7, 7, 7}},
		{"single bucket with width", []float64{7, 7}, 10, []float64{7, 12}},
		{"empty", nil, 0, []float64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs := mk(tc.in...)
			Spread(reqs, tc.bucketMs)
			if got := arrivals(reqs); !eq(got, tc.want) {
				t.Fatalf("got %v want %v", got, tc.want)
			}
			for i := 1; i < len(reqs); i++ {
				if reqs[i].ArrivalMs < reqs[i-1].ArrivalMs {
					t.Fatalf("not monotone at %d: %v", i, arrivals(reqs))
				}
			}
		})
	}
}

func TestScaleRebaseWindow(t *testing.T) {
	reqs := mk(1000, 2000, 4000)
	Rebase(reqs)
	if err := Scale(reqs, 0.5); err != nil {
		t.Fatal(err)
	}
	if got := arrivals(reqs); !eq(got, []float64{0, 500, 1500}) {
		t.Fatalf("got %v", got)
	}
	for _, f := range []float64{0, -1} {
		if Scale(reqs, f) == nil {
			t.Fatalf("scale %v: want error", f)
		}
	}
	var b strings.Builder
	for _, ts := range []string{"0", "0", "3000", "6000", "9000"} {
		b.WriteString(`{"timestamp": ` + ts + `, "input_length": 1, "output_length": 1, "hash_ids": [0]}` + "\n")
	}
	for _, tc := range []struct {
		w    Window
		want []float64
	}{
		{Window{}, []float64{0, 0, 3000, 6000, 9000}},
		{Window{First: 2}, []float64{0, 0}},
		{Window{FromMs: 3000, ToMs: 9000}, []float64{3000, 6000}},
		{Window{FromMs: 3000, First: 1}, []float64{3000}},
	} {
		reqs, st, err := ReadAll(strings.NewReader(b.String()), Options{}, tc.w)
		if err != nil || !eq(arrivals(reqs), tc.want) || st.Requests != len(reqs) {
			t.Fatalf("window %+v: got %v (%v)", tc.w, arrivals(reqs), err)
		}
	}
}

// TestConversationTrace reads the shared trace when present (it lives outside
// the repository) and checks the figures its README states.
func TestConversationTrace(t *testing.T) {
	f, err := os.Open("../../../shared/traces/conversation_trace.jsonl")
	if err != nil {
		t.Skipf("shared trace not present: %v", err)
	}
	defer f.Close()
	reqs, st, err := ReadAll(f, Options{}, Window{})
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(reqs)
	if st.Skipped != 0 || s.Requests != 12031 || s.BlockRefs != 288500 || s.DistinctBlocks != 182790 {
		t.Fatalf("summary %+v stats %+v", s, st)
	}
}

func TestEmbeddedWindowParses(t *testing.T) {
	f, err := os.Open("../testdata/window.jsonl")
	if err != nil {
		t.Skipf("window not present: %v", err)
	}
	defer f.Close()
	reqs, st, err := ReadAll(f, Options{}, Window{})
	if err != nil || st.Skipped != 0 || len(reqs) == 0 {
		t.Fatalf("%d requests, %+v, %v", len(reqs), st, err)
	}
}

func FuzzParseLine(f *testing.F) {
	f.Add([]byte(good), 512)
	f.Add([]byte(`{"timestamp": 1e3, "input_length": 1025, "output_length": 7, "hash_ids": [0, 5, 9], "x": 1}`), 512)
	f.Add([]byte(`{"timestamp": -0, "input_length": 0, "output_length": 0, "hash_ids": []}`), 16)
	f.Add([]byte(`{"timestamp": 0, "input_length": 18446744073709551616, "hash_ids": [1]}`), 0)
	f.Add([]byte(`nul`), 1)
	f.Fuzz(func(t *testing.T, line []byte, block int) {
		if block > 1<<20 || block < -1 {
			block = 512
		}
		req, err := ParseLine(line, 9, block)
		if err != nil {
			var le *LineError
			if !errors.As(err, &le) || le.Line != 9 || !errors.Is(err, ErrInvalid) {
				t.Fatalf("error is not a *LineError for line 9: %v", err)
			}
			return
		}
		bt := block
		if bt <= 0 {
			bt = DefaultBlockTokens
		}
		if req.TimestampMs < 0 || req.TimestampMs > MaxTimestampMs || req.InputTokens < 0 || req.OutputTokens < 0 ||
			len(req.HashIDs) != (req.InputTokens+bt-1)/bt || req.Line != 9 {
			t.Fatalf("accepted an invalid request: %+v", req)
		}
		// A valid line also streams.
		reqs, _, err := ReadAll(strings.NewReader(string(line)), Options{BlockTokens: block}, Window{})
		if err != nil && !errors.Is(err, io.EOF) {
			// A line containing a raw newline inside JSON whitespace splits; only accept that case.
			if !strings.ContainsAny(string(line), "\n\r") {
				t.Fatalf("ParseLine accepted, Reader refused: %v", err)
			}
		} else if err == nil && len(reqs) != 1 && !strings.ContainsAny(string(line), "\n\r") {
			t.Fatalf("reader got %d requests", len(reqs))
		}
	})
}

// TestAbsurdTimestamp: a timestamp beyond MaxTimestampMs is an error of its
// own line, naming it; with SkipBad that line alone is skipped and the lines
// after it are kept (before the bound, every later line was refused as "not
// monotone" after it).
func TestAbsurdTimestamp(t *testing.T) {
	line := func(ts string) string {
		return `{"timestamp": ` + ts + `, "input_length": 512, "output_length": 1, "hash_ids": [1]}`
	}
	in := strings.Join([]string{line("0"), line("10"), line("1e308"), line("20"), line("30")}, "\n")
	_, _, err := ReadAll(strings.NewReader(in), Options{}, Window{})
	var le *LineError
	if !errors.As(err, &le) || le.Line != 3 || le.Field != "timestamp" || !strings.Contains(err.Error(), "beyond the limit") {
		t.Fatalf("error %v, want trace line 3's timestamp beyond the limit", err)
	}
	reqs, st, err := ReadAll(strings.NewReader(in), Options{SkipBad: true}, Window{})
	if err != nil || st.Skipped != 1 || len(reqs) != 4 {
		t.Fatalf("SkipBad: %d requests, %+v, %v: want the 4 good lines and 1 skipped", len(reqs), st, err)
	}
	if s := Summarize(reqs); s.DurationMs != 30 {
		t.Fatalf("span %v ms, want 30", s.DurationMs)
	}
	if _, err := ParseLine([]byte(line("1e12")), 1, 512); err != nil {
		t.Fatalf("the bound itself: %v", err)
	}
	// A line out of order names the line it is out of order with.
	_, _, err = ReadAll(strings.NewReader(line("5")+"\n"+line("3")), Options{}, Window{})
	if err == nil || !strings.Contains(err.Error(), "trace line 2") || !strings.Contains(err.Error(), "(line 1)") {
		t.Fatalf("not monotone: %v", err)
	}
}

// TestReaderBounds: a trace with more requests or ids than the Reader's
// bounds ends with an error naming the line where it crossed them, also
// with SkipBad (a bound of the whole trace is not a bad line).
func TestReaderBounds(t *testing.T) {
	var b strings.Builder
	for i := range 10 {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}`+"\n", i)
	}
	for _, tc := range []struct {
		maxReq, maxIDs, wantLine int
	}{{4, 1 << 20, 5}, {1 << 20, 7, 4}, {10, 20, 0}} {
		for _, skip := range []bool{false, true} {
			r := NewReader(strings.NewReader(b.String()), Options{SkipBad: skip})
			r.maxRequests, r.maxIDs = tc.maxReq, tc.maxIDs
			n := 0
			var err error
			for {
				if _, err = r.Next(); err != nil {
					break
				}
				n++
			}
			var le *LineError
			switch {
			case tc.wantLine == 0 && (!errors.Is(err, io.EOF) || n != 10):
				t.Fatalf("%+v: %d requests, %v", tc, n, err)
			case tc.wantLine > 0 && (!errors.As(err, &le) || le.Line != tc.wantLine || !strings.Contains(err.Error(), "exceeds its bounds")):
				t.Fatalf("%+v skip %v: after %d requests: %v, want the bound at line %d", tc, skip, n, err, tc.wantLine)
			}
		}
	}
}
