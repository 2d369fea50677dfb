package objmap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// Reading the checkpoint and the journal, writing nothing.
//
// The journal is trusted only when it is whole: the checkpoint decodes
// completely, exactly the segment it names follows it, the segment starts
// with its marker, and every record decodes up to at most a torn tail. A
// torn tail is what a crash during the last group commit leaves: a last
// record cut short, or bytes (zeros, pieces of records) after the last good
// record, no longer than one group, with no valid record after the first
// bad byte. Anything else (a bad record followed by valid ones, a zeroed or
// missing segment or checkpoint, records out of place) is damage: recovery
// then rebuilds the index from the run headers (rebuild.go) instead of
// trusting a journal that may have lost acknowledged commits.

// markerRecordBytes is the size of a segment marker record: a segment no
// longer than this that holds no valid marker was torn while being created.
const markerRecordBytes = recordFrameBytes + 1 + 8

// tailScanCRCBytes bounds the bytes the torn-tail check checksums while it
// looks for a valid record after a bad one; past it the tail counts as
// damage (a rebuild, never a silent loss).
const tailScanCRCBytes = 64 << 20

// journalState is what the checkpoint and the readable journal say.
type journalState struct {
	runs   map[RunID]*RunInfo
	order  []RunID        // first-seen order, for stable reports
	freed  map[RunID]bool // freed by a readable record: never served again, even by a rebuild
	trims  map[RunID]int  // the shortest Keep of a readable trim record, by run (for a rebuild too)
	epoch  uint64
	nextID RunID // above every id the checkpoint and the journal name

	startSeq   uint64   // the segment the checkpoint names (1 without one)
	cpRuns     int      // runs in the checkpoint
	seg        string   // the segment to continue; "" when there is none
	segGood    int64    // bytes of seg up to the torn tail
	markerTorn bool     // seg was torn while being created: recreate it
	stale      []string // segments covered by the checkpoint
	maxSeq     uint64   // the highest segment number present

	records      int
	tailBytes    int64
	tail         string
	unknownFrees int
	unknownTrims int

	// damage, when not empty, says why the journal is not trusted: file,
	// byte offset, what is wrong.
	damage string
}

// newJournalState is the state of an empty journal: no run, segment 1 next.
func newJournalState() *journalState {
	return &journalState{runs: map[RunID]*RunInfo{}, freed: map[RunID]bool{}, trims: map[RunID]int{}, nextID: 1, startSeq: 1}
}

// readBounded reads path, refusing a file larger than maxBytes (a bound
// on what recovery holds in memory). found is false when it does not exist.
func readBounded(path string, maxBytes int64) (b []byte, found bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("objmap: reading %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, true, fmt.Errorf("objmap: stat of %s: %w", path, err)
	}
	if st.Size() > maxBytes {
		return nil, true, fmt.Errorf("%w: %s is %d bytes, more than the %d it can hold", errTooLarge, path, st.Size(), maxBytes)
	}
	b = make([]byte, st.Size())
	if err := preadFull(int(f.Fd()), b, 0); err != nil {
		return nil, true, fmt.Errorf("objmap: reading %s: %w", path, err)
	}
	return b, true, nil
}

var errTooLarge = errors.New("objmap: file too large")

func segmentSeq(name string) (uint64, bool) {
	var seq uint64
	if _, err := fmt.Sscanf(name, "journal-%016x.log", &seq); err != nil || segmentName(seq) != name {
		return 0, false
	}
	return seq, true
}

// parseCheckpoint decodes a checkpoint file: its head record, Count commit
// records (at most maxRuns), its end record, nothing after. It never panics
// on garbage; an error names the byte offset.
func parseCheckpoint(b []byte, maxRuns int) (runs []RunInfo, head Record, err error) {
	bad := func(at int, why string, args ...any) error {
		return fmt.Errorf("at byte %d: %s", at, fmt.Sprintf(why, args...))
	}
	head, n, err := DecodeRecord(b)
	if err != nil {
		return nil, Record{}, bad(0, "%v", err)
	}
	if head.Type != RecCheckpoint {
		return nil, Record{}, bad(0, "first record is %s, want checkpoint", head.Type)
	}
	if head.Count > uint64(maxRuns) {
		return nil, Record{}, bad(0, "%d runs, the pool holds at most %d", head.Count, maxRuns)
	}
	p := n
	runs = make([]RunInfo, 0, head.Count)
	for i := uint64(0); i < head.Count; {
		r, n, err := DecodeRecord(b[p:])
		if err != nil {
			return nil, Record{}, bad(p, "run %d of %d: %v", i, head.Count, err)
		}
		switch {
		case r.Type == RecCommit:
			runs = append(runs, r.Run)
			i++
		case r.Type == RecTrim && len(runs) > 0 && runs[len(runs)-1].ID == r.ID && r.Keep < runs[len(runs)-1].Kept:
			runs[len(runs)-1].Kept = r.Keep
		default:
			return nil, Record{}, bad(p, "run %d of %d: a %s record where a commit (or a trim of the run before) belongs", i, head.Count, r.Type)
		}
		p += n
	}
	// A trim of the last run sits between it and the end record.
	if r, n, err := DecodeRecord(b[p:]); err == nil && r.Type == RecTrim && len(runs) > 0 && runs[len(runs)-1].ID == r.ID && r.Keep < runs[len(runs)-1].Kept {
		runs[len(runs)-1].Kept = r.Keep
		p += n
	}
	end, n, err := DecodeRecord(b[p:])
	if err != nil || end.Type != RecCheckpointEnd || end.Count != head.Count || p+n != len(b) {
		return nil, Record{}, bad(p, "missing or wrong end record (err %v, %d trailing bytes)", err, len(b)-p-n)
	}
	return runs, head, nil
}

// readJournal reads dir's checkpoint and journal segments. maxRuns bounds
// the runs a checkpoint may list (what the pool can hold), tornLimit the
// bytes a torn tail may span. Damage is reported in journalState.damage;
// the error is for what cannot be read at all (an I/O error).
func readJournal(dir string, maxRuns int, tornLimit int64) (*journalState, error) {
	js := newJournalState()
	names, err := filepath.Glob(filepath.Join(dir, "journal-*.log"))
	if err != nil {
		return nil, fmt.Errorf("objmap: listing journal segments in %s: %w", dir, err)
	}
	var segs []uint64
	for _, p := range names {
		if seq, ok := segmentSeq(filepath.Base(p)); ok {
			segs = append(segs, seq)
			js.maxSeq = max(js.maxSeq, seq)
		}
	}
	slices.Sort(segs)

	cpPath := filepath.Join(dir, checkpointName)
	maxCP := int64(maxRuns+2) * (recordFrameBytes + MaxRecordBytes)
	b, found, err := readBounded(cpPath, maxCP)
	if errors.Is(err, errTooLarge) {
		js.damage = err.Error()
		return js, nil
	}
	if err != nil {
		return nil, err
	}
	if found {
		// The checkpoint was fsynced before its rename: damage is real.
		cpRuns, head, err := parseCheckpoint(b, maxRuns)
		if err != nil {
			js.damage = fmt.Sprintf("%s %v", cpPath, err)
			return js, nil
		}
		js.startSeq, js.epoch, js.nextID, js.cpRuns = head.Seq, head.Epoch, max(head.NextID, 1), len(cpRuns)
		for i := range cpRuns {
			r := &cpRuns[i]
			if _, dup := js.runs[r.ID]; dup {
				js.damage = fmt.Sprintf("%s lists run %d twice", cpPath, r.ID)
				return js, nil
			}
			js.runs[r.ID] = r
			js.order = append(js.order, r.ID)
			js.nextID = max(js.nextID, r.ID+1)
			if r.Kept < len(r.Chain) {
				js.trims[r.ID] = r.Kept
			}
		}
	}
	var cur []uint64
	for _, seq := range segs {
		if seq < js.startSeq {
			js.stale = append(js.stale, filepath.Join(dir, segmentName(seq)))
		} else {
			cur = append(cur, seq)
		}
	}
	// A segment is created only after the checkpoint that names it is
	// durable, and the one before it is deleted only after that: exactly
	// the named segment follows the checkpoint, or none and its predecessor
	// is still there (a crash between the two).
	switch {
	case len(cur) == 0 && len(js.stale) > 0:
		return js, nil
	case len(cur) == 0 && found:
		js.damage = fmt.Sprintf("%s missing (the checkpoint names it)", filepath.Join(dir, segmentName(js.startSeq)))
		return js, nil
	case len(cur) == 0:
		js.damage = fmt.Sprintf("%s missing (no checkpoint, no journal segment)", filepath.Join(dir, segmentName(1)))
		return js, nil
	case len(cur) > 1 || cur[0] != js.startSeq:
		js.damage = fmt.Sprintf("%s: journal segments %v follow a checkpoint naming segment %d", dir, cur, js.startSeq)
		if !found {
			js.damage = fmt.Sprintf("%s: journal segments %v and no checkpoint (without one the journal starts at segment 1)", dir, cur)
		}
		return js, nil
	}
	js.seg = filepath.Join(dir, segmentName(js.startSeq))
	b, _, err = readBounded(js.seg, MaxSegmentBytes+MaxGroupBytesLimit)
	if errors.Is(err, errTooLarge) {
		js.damage = err.Error()
		return js, nil
	}
	if err != nil {
		return nil, err
	}
	js.replaySegment(b, tornLimit)
	return js, nil
}

// replaySegment applies the records of segment js.seg (bytes b) to js: up
// to a torn tail, or up to damage.
func (js *journalState) replaySegment(b []byte, tornLimit int64) {
	path := js.seg
	r, n, err := DecodeRecord(b)
	switch {
	case err != nil && len(b) <= markerRecordBytes && len(js.stale) > 0:
		// Torn while being created after its checkpoint: it holds nothing.
		js.markerTorn = true
		return
	case err != nil:
		js.damage = fmt.Sprintf("%s at byte 0: segment marker: %v", path, err)
		return
	case r.Type != RecSegment || r.Seq != js.startSeq:
		js.damage = fmt.Sprintf("%s at byte 0: %s record (seq %d), want the marker of segment %d", path, r.Type, r.Seq, js.startSeq)
		return
	}
	js.records++
	p := n
	for p < len(b) {
		r, n, err := DecodeRecord(b[p:])
		if err != nil {
			js.badRecord(b, p, err, tornLimit)
			break
		}
		if why := js.apply(&r); why != "" {
			js.damage = fmt.Sprintf("%s at byte %d: %s", path, p, why)
			return
		}
		js.records++
		p += n
	}
	js.segGood = int64(p)
}

// apply applies one journal record; a non-empty result is damage.
func (js *journalState) apply(r *Record) string {
	switch r.Type {
	case RecCommit:
		if _, dup := js.runs[r.Run.ID]; dup {
			return fmt.Sprintf("run %d committed twice", r.Run.ID)
		}
		run := r.Run
		js.runs[run.ID] = &run
		js.order = append(js.order, run.ID)
		js.nextID = max(js.nextID, run.ID+1)
	case RecFree:
		js.freed[r.ID] = true
		if _, ok := js.runs[r.ID]; ok {
			delete(js.runs, r.ID)
		} else {
			js.unknownFrees++
		}
	case RecTrim:
		// Trims only shorten, so their order does not matter.
		if k, ok := js.trims[r.ID]; !ok || r.Keep < k {
			js.trims[r.ID] = r.Keep
		}
		if run, ok := js.runs[r.ID]; ok {
			run.Kept = min(run.Kept, r.Keep)
		} else {
			js.unknownTrims++
		}
	case RecEpoch:
		js.epoch = max(js.epoch, r.Epoch)
	default:
		return fmt.Sprintf("%s record inside a journal segment", r.Type)
	}
	return ""
}

// badRecord classifies the bytes from the first bad record at p: a torn
// tail (dropped, nothing in it was acknowledged) or damage.
func (js *journalState) badRecord(b []byte, p int, err error, tornLimit int64) {
	tail := int64(len(b) - p)
	if tail > tornLimit {
		js.damage = fmt.Sprintf("%s at byte %d: %v, with %d bytes after it: more than one group commit (%d bytes) can tear",
			js.seg, p, err, tail, tornLimit)
		return
	}
	if q, r, found, exhausted := findRecord(b, p+1); found {
		js.damage = fmt.Sprintf("%s at byte %d: %v, but a valid %s record follows at byte %d: a damaged record in the middle, not a torn tail",
			js.seg, p, err, r.Type, q)
		return
	} else if exhausted {
		js.damage = fmt.Sprintf("%s at byte %d: %v, and the %d bytes after it could not all be checked for valid records", js.seg, p, err, tail)
		return
	}
	js.tailBytes = tail
	js.tail = fmt.Sprintf("at byte %d: %v", p, err)
}

// findRecord returns the first offset q >= from where a valid record
// starts. exhausted reports that it gave up after checksumming
// tailScanCRCBytes without finding one.
func findRecord(b []byte, from int) (q int, r Record, found, exhausted bool) {
	var budget int64 = tailScanCRCBytes
	for q = from; q+recordFrameBytes < len(b); q++ {
		n := int(uint32(b[q]) | uint32(b[q+1])<<8 | uint32(b[q+2])<<16 | uint32(b[q+3])<<24)
		if n < 1 || n > MaxRecordBytes || q+recordFrameBytes+n > len(b) {
			continue
		}
		if t := RecordType(b[q+recordFrameBytes]); t < RecCommit || t > maxRecordType {
			continue
		}
		if budget -= int64(n); budget < 0 {
			return q, Record{}, false, true
		}
		if rec, _, err := DecodeRecord(b[q:]); err == nil {
			return q, rec, true, false
		}
	}
	return 0, Record{}, false, false
}

// openSegmentForAppend continues js.seg after recovery: the torn tail is
// truncated (and that made durable) so new records follow the good ones.
func openSegmentForAppend(js *journalState) (int, error) {
	fd, err := unix.Open(js.seg, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("objmap: opening journal segment %s: %w", js.seg, err)
	}
	if js.tailBytes > 0 {
		if err := unix.Ftruncate(fd, js.segGood); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("objmap: truncating the torn tail of %s: %w", js.seg, err)
		}
		if err := unix.Fsync(fd); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("objmap: fsync of %s: %w", js.seg, err)
		}
	}
	return fd, nil
}
