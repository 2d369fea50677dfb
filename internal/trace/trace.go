// Package trace reads request traces in the Mooncake FAST'25 format: JSONL, one
// request per line, with fields
//
//	timestamp      arrival time in ms relative to the first request (number in [0, MaxTimestampMs], non-decreasing)
//	input_length   prompt tokens (integer ≥ 0)
//	output_length  generated tokens (integer ≥ 0)
//	hash_ids       one id per block of BlockTokens input tokens (len == ceil(input_length/BlockTokens));
//	               ids are chained prefix hashes: equal ids mean an equal whole prefix up to that block
//
// Unknown fields are ignored, so traces with extra columns parse unchanged.
//
// The Reader streams: memory is bounded by one line (MaxLineBytes) plus the
// requests the caller keeps, at most MaxRequests holding MaxTotalHashIDs ids. A malformed line is an error (*LineError) naming
// the line number and the field; with Options.SkipBad the line is skipped and
// counted instead (Reader.Skipped), never silently dropped.
//
// ReadAll streams one Window (first N or a time range) and stops at its end.
// Parse reads a whole trace once and Parsed.Select cuts any number of windows
// from it, each with exactly what ReadAll returns for that window (requests,
// stats, error), so a caller that needs several windows of one file reads it
// once.
//
// Replay helpers work on a slice of requests: Rebase, Scale (multiply arrival
// times) and Spread (place requests that share a timestamp bucket evenly
// within it, deterministically).
package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// DefaultBlockTokens is the block size of the Mooncake traces (tokens per hash id).
const DefaultBlockTokens = 512

// MaxLineBytes bounds one JSONL line. The longest request of the conversation
// trace (126K tokens, 247 ids) is under 4 KiB; 16 MiB leaves room for traces
// with million-token contexts while still bounding memory on a corrupt file.
const MaxLineBytes = 16 << 20

// maxHashIDs bounds the ids of one request (2^20 blocks = 512M tokens at 512).
const maxHashIDs = 1 << 20

// MaxTimestampMs bounds a timestamp (about 31 years of ms): a trace spans
// hours, so anything beyond is a corrupt or crafted value, refused on its own
// line instead of making every later line "not monotone" and a report's span
// hundreds of digits long.
const MaxTimestampMs = 1e12

// Bounds of one Reader (and so of Parse): the requests it returns and their
// block ids in all, which is what a parsed trace holds in memory (8 bytes an
// id). The Mooncake traces have tens of thousands of requests and a few
// million ids.
const (
	MaxRequests     = 1 << 24
	MaxTotalHashIDs = 1 << 28
)

// Request is one trace line.
type Request struct {
	Line         int      // 1-based line number in the source (for messages)
	TimestampMs  float64  // timestamp as in the trace
	ArrivalMs    float64  // replay arrival time: TimestampMs until Scale/Spread change it
	InputTokens  int      // input_length
	OutputTokens int      // output_length
	HashIDs      []uint64 // chained block ids, one per BlockTokens input tokens
}

// ErrInvalid is wrapped by every validation error of a line.
var ErrInvalid = errors.New("invalid trace line")

// LineError names the line and the field that made it invalid.
type LineError struct {
	Line  int    // 1-based
	Field string // "timestamp", "input_length", "output_length", "hash_ids", or "" for the whole line
	Err   error
}

func (e *LineError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("trace line %d: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("trace line %d: field %s: %v", e.Line, e.Field, e.Err)
}

func (e *LineError) Unwrap() []error { return []error{ErrInvalid, e.Err} }

// ParseLine parses and validates one line on its own (no cross-line check such
// as monotone timestamps). blockTokens ≤ 0 means DefaultBlockTokens. Errors are
// *LineError carrying lineNo.
func ParseLine(line []byte, lineNo, blockTokens int) (Request, error) {
	if blockTokens <= 0 {
		blockTokens = DefaultBlockTokens
	}
	bad := func(field string, format string, args ...any) (Request, error) {
		return Request{}, &LineError{Line: lineNo, Field: field, Err: fmt.Errorf(format, args...)}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(line, &fields); err != nil {
		return bad("", "not a JSON object: %v", err)
	}
	if fields == nil {
		return bad("", "not a JSON object: null")
	}
	get := func(name string) (json.RawMessage, bool) {
		raw, ok := fields[name]
		if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			return nil, false
		}
		return raw, true
	}
	req := Request{Line: lineNo}

	raw, ok := get("timestamp")
	if !ok {
		return bad("timestamp", "missing")
	}
	ts, err := parseNumber(raw)
	if err != nil {
		return bad("timestamp", "%v", err)
	}
	if ts < 0 {
		return bad("timestamp", "negative (%v)", ts)
	}
	if ts > MaxTimestampMs {
		return bad("timestamp", "%v ms is beyond the limit of %v ms", ts, MaxTimestampMs)
	}
	req.TimestampMs, req.ArrivalMs = ts, ts

	for _, f := range []struct {
		name string
		dst  *int
	}{{"input_length", &req.InputTokens}, {"output_length", &req.OutputTokens}} {
		raw, ok := get(f.name)
		if !ok {
			return bad(f.name, "missing")
		}
		v, err := parseCount(raw)
		if err != nil {
			return bad(f.name, "%v", err)
		}
		*f.dst = v
	}

	raw, ok = get("hash_ids")
	if !ok {
		return bad("hash_ids", "missing")
	}
	ids, err := parseIDs(raw)
	if err != nil {
		return bad("hash_ids", "%v", err)
	}
	want := (req.InputTokens + blockTokens - 1) / blockTokens
	if len(ids) != want {
		return bad("hash_ids", "has %d ids, want ceil(input_length %d / %d) = %d",
			len(ids), req.InputTokens, blockTokens, want)
	}
	req.HashIDs = ids
	return req, nil
}

// parseNumber accepts a finite JSON number.
func parseNumber(raw json.RawMessage) (float64, error) {
	var n json.Number
	if err := unmarshalNumber(raw, &n); err != nil {
		return 0, fmt.Errorf("not a number: %s", clip(raw))
	}
	v, err := strconv.ParseFloat(string(n), 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("not a finite number: %s", clip(raw))
	}
	return v, nil
}

// parseCount accepts a non-negative integer that fits an int32 (token counts).
func parseCount(raw json.RawMessage) (int, error) {
	var n json.Number
	if err := unmarshalNumber(raw, &n); err != nil {
		return 0, fmt.Errorf("not a number: %s", clip(raw))
	}
	v, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not an integer: %s", clip(raw))
	}
	if v < 0 {
		return 0, fmt.Errorf("negative (%d)", v)
	}
	if v > math.MaxInt32 {
		return 0, fmt.Errorf("too large (%d)", v)
	}
	return int(v), nil
}

// parseIDs accepts an array of non-negative integers.
func parseIDs(raw json.RawMessage) ([]uint64, error) {
	var nums []json.RawMessage
	if err := json.Unmarshal(raw, &nums); err != nil || nums == nil {
		return nil, fmt.Errorf("not an array of integers: %s", clip(raw))
	}
	if len(nums) > maxHashIDs {
		return nil, fmt.Errorf("%d ids, more than the limit %d", len(nums), maxHashIDs)
	}
	ids := make([]uint64, len(nums))
	for i, rn := range nums {
		var n json.Number
		if err := unmarshalNumber(rn, &n); err != nil {
			return nil, fmt.Errorf("id %d is not a number: %s", i, clip(rn))
		}
		v, err := strconv.ParseUint(string(n), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("id %d is not a non-negative integer: %s", i, n)
		}
		ids[i] = v
	}
	return ids, nil
}

// unmarshalNumber decodes a JSON number literal; unlike json.Number's own
// decoding it refuses a quoted string ("12").
func unmarshalNumber(raw json.RawMessage, n *json.Number) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return errors.New("not a number literal")
	}
	return json.Unmarshal(raw, n)
}

func clip(raw []byte) string {
	const max = 40
	if len(raw) > max {
		return string(raw[:max]) + "..."
	}
	return string(raw)
}

// Options configure a Reader.
type Options struct {
	BlockTokens int  // tokens per hash id; ≤ 0 means DefaultBlockTokens
	SkipBad     bool // skip and count invalid lines instead of failing on the first
}

// Reader streams requests from JSONL. Blank lines are ignored. It is not safe
// for concurrent use.
type Reader struct {
	br       *bufio.Reader
	opts     Options
	line     int
	skipped  int
	lastTs   float64
	lastLine int // the line of lastTs
	haveLast bool
	requests int // returned so far
	ids      int // hash ids returned so far
	// maxRequests and maxIDs are MaxRequests and MaxTotalHashIDs (smaller
	// in tests).
	maxRequests, maxIDs int
	firstBad            error // first skipped line's error, for reports
	err                 error // sticky
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader, opts Options) *Reader {
	if opts.BlockTokens <= 0 {
		opts.BlockTokens = DefaultBlockTokens
	}
	return &Reader{br: bufio.NewReaderSize(r, 64<<10), opts: opts, maxRequests: MaxRequests, maxIDs: MaxTotalHashIDs}
}

// Next returns the next valid request, or io.EOF at the end. A non-EOF error is
// sticky: a *LineError for an invalid line (without SkipBad), or the read error.
func (r *Reader) Next() (Request, error) {
	for r.err == nil {
		line, err := r.readLine()
		if err != nil {
			r.err = err
			break
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		req, err := ParseLine(line, r.line, r.opts.BlockTokens)
		if err == nil && r.haveLast && req.TimestampMs < r.lastTs {
			err = &LineError{Line: r.line, Field: "timestamp",
				Err: fmt.Errorf("not monotone: %v after %v (line %d)", req.TimestampMs, r.lastTs, r.lastLine)}
		}
		if err == nil && (r.requests >= r.maxRequests || r.ids+len(req.HashIDs) > r.maxIDs) {
			// A bound of the whole trace, not of this line: never skipped.
			r.err = &LineError{Line: r.line, Err: fmt.Errorf("the trace exceeds its bounds (%d requests, %d block ids in all)", r.maxRequests, r.maxIDs)}
			break
		}
		if err != nil {
			if r.opts.SkipBad {
				r.skipped++
				if r.firstBad == nil {
					r.firstBad = err
				}
				continue
			}
			r.err = err
			break
		}
		r.lastTs, r.lastLine, r.haveLast = req.TimestampMs, r.line, true
		r.requests++
		r.ids += len(req.HashIDs)
		return req, nil
	}
	return Request{}, r.err
}

// readLine returns the next line without its newline; a line longer than
// MaxLineBytes is an error naming it.
func (r *Reader) readLine() ([]byte, error) {
	var buf []byte
	for {
		chunk, err := r.br.ReadSlice('\n')
		if len(buf)+len(chunk) > MaxLineBytes {
			return nil, &LineError{Line: r.line + 1, Err: fmt.Errorf("line longer than %d bytes", MaxLineBytes)}
		}
		switch {
		case err == nil:
			r.line++
			if buf == nil {
				return chunk[:len(chunk)-1], nil
			}
			return append(buf, chunk[:len(chunk)-1]...), nil
		case errors.Is(err, bufio.ErrBufferFull):
			buf = append(buf, chunk...)
		case errors.Is(err, io.EOF):
			buf = append(buf, chunk...)
			if len(buf) == 0 {
				return nil, io.EOF
			}
			r.line++
			return buf, nil
		default:
			return nil, fmt.Errorf("reading trace after line %d: %w", r.line, err)
		}
	}
}

// Lines returns how many lines were read so far.
func (r *Reader) Lines() int { return r.line }

// Skipped returns how many invalid lines SkipBad skipped.
func (r *Reader) Skipped() int { return r.skipped }

// FirstSkipped returns the error of the first skipped line, or nil.
func (r *Reader) FirstSkipped() error { return r.firstBad }

// Window selects requests while reading. Zero values mean no limit.
type Window struct {
	First int // at most this many requests (after the time range)
	// Time range on the trace's timestamps: FromMs ≤ timestamp < ToMs (ToMs 0 = no end).
	FromMs, ToMs float64
}

// Stats describe what ReadAll read.
type Stats struct {
	Lines        int   // lines read
	Skipped      int   // invalid lines skipped (SkipBad)
	FirstSkipped error // the first skipped line's error
	Requests     int   // requests returned
}

// ReadAll reads the requests of w from r. It stops reading at the end of the
// window (timestamps are monotone), so a small window of a large trace is cheap.
func ReadAll(r io.Reader, opts Options, w Window) ([]Request, Stats, error) {
	rd := NewReader(r, opts)
	sel := selector{w: w}
	for !sel.done() {
		req, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, Stats{}, err
		}
		sel.offer(req)
	}
	return sel.reqs, Stats{Lines: rd.Lines(), Skipped: rd.Skipped(), FirstSkipped: rd.FirstSkipped(), Requests: len(sel.reqs)}, nil
}

// selector applies a Window to valid requests in trace order. ReadAll and
// Parsed.Select share it, so both cut the same window and stop at the same
// request.
type selector struct {
	w    Window
	reqs []Request
	past bool // a request at or after ToMs was offered
}

// done reports whether the window is complete: no later request can join it,
// so a reader stops here (and never sees a malformed line after it).
func (s *selector) done() bool {
	return s.past || (s.w.First > 0 && len(s.reqs) >= s.w.First)
}

func (s *selector) offer(req Request) {
	switch {
	case req.TimestampMs < s.w.FromMs:
	case s.w.ToMs > 0 && req.TimestampMs >= s.w.ToMs:
		s.past = true
	default:
		s.reqs = append(s.reqs, req)
	}
}

// Parsed is a whole trace read once: every valid request plus where each was
// read, so Select can answer any window as ReadAll would have, reading only
// up to that window's end.
type Parsed struct {
	Requests []Request // every valid request, in trace order
	Stats    Stats     // of the whole read (up to Err)
	// Err ended the reading before the end of the input: a *LineError
	// without SkipBad, a line longer than MaxLineBytes, or a read error. It
	// is not Parse's error because a window that ends before it is unaffected
	// (ReadAll stops before reaching it); Select returns it for the windows
	// that reach it.
	Err error
	// skippedBefore[i] is how many lines SkipBad had skipped when
	// Requests[i] was read.
	skippedBefore []int
}

// Parse reads every request of r, as ReadAll with an empty Window would but
// keeping a malformed line's error (or a read error) in Parsed.Err instead of
// dropping the requests before it. Memory: the valid requests plus one int
// each.
func Parse(r io.Reader, opts Options) *Parsed {
	rd := NewReader(r, opts)
	p := &Parsed{}
	for {
		req, err := rd.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				p.Err = err
			}
			break
		}
		p.Requests = append(p.Requests, req)
		p.skippedBefore = append(p.skippedBefore, rd.Skipped())
	}
	p.Stats = Stats{Lines: rd.Lines(), Skipped: rd.Skipped(), FirstSkipped: rd.FirstSkipped(), Requests: len(p.Requests)}
	return p
}

// Select returns window w of the parsed trace: the requests, stats and error
// ReadAll returns for w on the same input with the same Options. The slice is
// new (callers may change arrival times); the requests' HashIDs are shared
// with p.Requests and must not be modified.
func (p *Parsed) Select(w Window) ([]Request, Stats, error) {
	sel := selector{w: w}
	for i, req := range p.Requests {
		sel.offer(req)
		if sel.done() {
			// ReadAll stops right after reading this request's line.
			st := Stats{Lines: req.Line, Skipped: p.skippedBefore[i], Requests: len(sel.reqs)}
			if st.Skipped > 0 {
				st.FirstSkipped = p.Stats.FirstSkipped
			}
			return sel.reqs, st, nil
		}
	}
	if p.Err != nil {
		return nil, Stats{}, p.Err
	}
	st := p.Stats
	st.Requests = len(sel.reqs)
	return sel.reqs, st, nil
}

// Rebase shifts arrival times so the first request arrives at 0 (a window cut
// from the middle of a trace starts at once).
func Rebase(reqs []Request) {
	if len(reqs) == 0 {
		return
	}
	t0 := reqs[0].ArrivalMs
	for i := range reqs {
		reqs[i].ArrivalMs -= t0
	}
}

// Scale multiplies arrival times by factor: 0.5 replays twice as fast (double
// the request rate), 2 half as fast. factor must be > 0.
func Scale(reqs []Request, factor float64) error {
	if !(factor > 0) || math.IsInf(factor, 0) {
		return fmt.Errorf("time scale %v: must be a finite number > 0", factor)
	}
	for i := range reqs {
		reqs[i].ArrivalMs *= factor
	}
	return nil
}

// Spread places requests that share one arrival time (a timestamp bucket)
// evenly within the bucket: the k requests of a bucket at time t get
// t + i*width/k for i = 0..k-1, in trace order. The width is bucketMs when > 0,
// capped by the gap to the next distinct time; when bucketMs ≤ 0 it is that
// gap, and for the last bucket the smallest gap seen (0 with a single bucket).
// Deterministic; call it after Scale with a scaled bucketMs, or before with the
// trace's own. Arrival times stay non-decreasing.
func Spread(reqs []Request, bucketMs float64) {
	minGap := math.Inf(1)
	for i := 1; i < len(reqs); i++ {
		if g := reqs[i].ArrivalMs - reqs[i-1].ArrivalMs; g > 0 && g < minGap {
			minGap = g
		}
	}
	if math.IsInf(minGap, 1) {
		minGap = 0
	}
	for i := 0; i < len(reqs); {
		j := i + 1
		for j < len(reqs) && reqs[j].ArrivalMs == reqs[i].ArrivalMs {
			j++
		}
		width := minGap
		if j < len(reqs) {
			width = reqs[j].ArrivalMs - reqs[i].ArrivalMs
		}
		if bucketMs > 0 && (bucketMs < width || j == len(reqs)) {
			width = bucketMs
		}
		if k := j - i; k > 1 && width > 0 {
			t := reqs[i].ArrivalMs
			for n := i; n < j; n++ {
				reqs[n].ArrivalMs = t + float64(n-i)*width/float64(k)
			}
		}
		i = j
	}
}

// Summary describes a request slice for reports.
type Summary struct {
	Requests       int
	DurationMs     float64 // last arrival − first arrival
	InputTokens    int64   // sum
	BlockRefs      int64   // sum of len(HashIDs)
	DistinctBlocks int64
	RatePerS       float64 // requests per second of arrival time (0 when DurationMs is 0)
}

// Summarize computes a Summary.
func Summarize(reqs []Request) Summary {
	s := Summary{Requests: len(reqs)}
	seen := make(map[uint64]struct{})
	for _, r := range reqs {
		s.InputTokens += int64(r.InputTokens)
		s.BlockRefs += int64(len(r.HashIDs))
		for _, id := range r.HashIDs {
			seen[id] = struct{}{}
		}
	}
	s.DistinctBlocks = int64(len(seen))
	if len(reqs) > 1 {
		s.DurationMs = reqs[len(reqs)-1].ArrivalMs - reqs[0].ArrivalMs
		if s.DurationMs > 0 {
			s.RatePerS = float64(len(reqs)-1) / (s.DurationMs / 1000)
		}
	}
	return s
}
