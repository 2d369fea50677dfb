package objmap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// recover rebuilds the run table and the free space (see Open): from the
// checkpoint and the journal when they are whole, from the run headers in
// the pool when they are damaged (rebuild.go).
func (m *Map) recover() error {
	rep := &m.report
	rep.Layers, rep.Dirs, rep.RunWidth = m.g.Layers, len(m.dirs), m.lay.Width()
	tornLimit := int64(max(m.opts.MaxGroupBytes, DefaultMaxGroupBytes))
	js, err := readJournal(m.dirs[0], m.maxRuns(), tornLimit)
	if err != nil {
		return err
	}
	rep.CheckpointRuns, rep.JournalSegment, rep.JournalRecords = js.cpRuns, js.startSeq, js.records
	rep.JournalTailBytes, rep.JournalTail, rep.UnknownFrees, rep.UnknownTrims = js.tailBytes, js.tail, js.unknownFrees, js.unknownTrims
	if js.damage != "" {
		rep.JournalDamage = js.damage
		return m.rebuild(js)
	}
	dropped, err := m.replayRuns(js)
	if err != nil || m.readOnly {
		return err
	}
	return m.resumeJournal(js, dropped)
}

// maxRuns is the most runs the pool can hold (a bound on what a checkpoint
// may list).
func (m *Map) maxRuns() int {
	return int(min(int64(m.lay.spaces())*(m.fileSize/m.lay.RunBytes(1)), 1<<30))
}

// replayRuns carves every run the journal names out of the free space and
// checks its header: a mismatch drops the run (its space is free again; the
// returned ids need a durable free), an I/O error keeps it unserved, its
// space held, for the next Open to retry.
func (m *Map) replayRuns(js *journalState) ([]RunID, error) {
	rep := &m.report
	live := make([]*RunInfo, 0, len(js.runs))
	for _, id := range js.order {
		if r, ok := js.runs[id]; ok {
			live = append(live, r)
		}
	}
	rep.Objects = len(live)
	var dropped []RunID
	drop := func(r *RunInfo, why string) {
		rep.DroppedRuns = append(rep.DroppedRuns, Problem{Run: r.ID, File: r.File, Offset: r.Offset, Reason: why})
		dropped = append(dropped, r.ID)
	}
	carved := live[:0]
	for _, r := range live {
		n := len(r.Chain)
		switch {
		case n > MaxRunChunks(m.g):
			drop(r, fmt.Sprintf("%d chunks, more than a header holds (%d)", n, MaxRunChunks(m.g)))
		case r.File < 0 || r.File >= len(m.files):
			drop(r, fmt.Sprintf("pool file %d, the pool has %d", r.File, len(m.files)))
		case r.Length != m.lay.RunBytes(n):
			drop(r, fmt.Sprintf("extent of %d bytes, %d chunks need %d", r.Length, n, m.lay.RunBytes(n)))
		default:
			if err := m.alloc.carve(r.File, extent{r.Offset, r.Length}); err != nil {
				drop(r, err.Error())
				continue
			}
			carved = append(carved, r)
		}
	}
	res := m.verifyRuns(carved, false)
	for i, r := range carved {
		switch {
		case res[i].why == "":
			r.ChunkCRCs, r.LayerCRCs = res[i].crcs.chunks, res[i].crcs.layers
			m.runs[r.ID] = &runEntry{info: *r, state: stateLive}
			m.live++
			rep.Recovered++
		case res[i].io:
			m.runs[r.ID] = &runEntry{info: *r, state: stateUnreadable}
			rep.UnreadableRuns = append(rep.UnreadableRuns, Problem{Run: r.ID, File: r.File, Offset: r.Offset, Reason: res[i].why})
		default:
			drop(r, res[i].why)
			if err := m.alloc.free(r.File, extent{r.Offset, r.Length}); err != nil {
				return nil, fmt.Errorf("objmap: recovery: returning space of dropped run %d: %w", r.ID, err)
			}
		}
	}
	rep.Dropped, rep.Unreadable = len(rep.DroppedRuns), len(rep.UnreadableRuns)
	m.nextID, m.epoch, rep.Epoch = js.nextID, js.epoch, js.epoch
	return dropped, nil
}

// resumeJournal continues the segment the journal ended in (its torn tail
// truncated) or creates it, then deletes the segments the checkpoint
// covers (only now: until the named segment is durable, its predecessor
// shows that its absence is a crash, not a loss), then starts the epoch.
func (m *Map) resumeJournal(js *journalState, dropped []RunID) error {
	dir0 := m.dirs[0]
	var fd int
	var size int64
	var err error
	if js.seg != "" && !js.markerTorn {
		fd, err = openSegmentForAppend(js)
		size = js.segGood
	} else {
		fd, size, err = createSegment(dir0, js.startSeq)
	}
	if err != nil {
		return err
	}
	m.j = newJournal(dir0, fd, js.startSeq, size, m.opts.SegmentBytes, m.opts.MaxGroupBytes)
	for _, p := range js.stale {
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("objmap: removing stale journal segment %s: %w", p, err)
		}
	}
	return m.startEpoch(dropped)
}

// startEpoch journals this open's epoch and the frees of dropped runs,
// durably, before any allocation can reuse their space.
func (m *Map) startEpoch(frees []RunID) error {
	m.j.onDurable = m.released
	m.j.checkpoint = m.writeCheckpoint
	m.j.abandon, m.j.mapMu = m.abandonCommits, &m.mu
	m.epoch++
	m.report.Epoch = m.epoch
	last, since, _, err := m.j.append(&Record{Type: RecEpoch, Epoch: m.epoch})
	if err != nil {
		return err
	}
	for _, id := range frees {
		if last, _, _, err = m.j.append(&Record{Type: RecFree, ID: id}); err != nil {
			return err
		}
	}
	return m.j.waitDurable(last, since)
}

// abandonCommits is the journal's abandon (m.mu held): the runs whose
// commit records an undone group dropped are forgotten, and their space is
// free at once (no durable record names them).
func (m *Map) abandonCommits(runs []RunID) {
	for _, id := range runs {
		e, ok := m.runs[id]
		if !ok || e.state != stateCommitting {
			continue
		}
		delete(m.runs, id)
		if err := m.alloc.free(e.info.File, extent{e.info.Offset, e.info.Length}); err != nil {
			m.j.err = fmt.Errorf("objmap: returning the space of abandoned run %d: %w", id, err)
		}
	}
}

// runCheck is the verdict on one run: why it does not verify (empty when
// it does), whether that is an I/O error rather than a mismatch, and the
// CRCs it stored.
type runCheck struct {
	why  string
	io   bool
	crcs runCRCs
}

// verifyRuns checks each run with bounded concurrency: its header and chunk
// table (one read per run) against r, and with payload its every chunk.
func (m *Map) verifyRuns(runs []*RunInfo, payload bool) []runCheck {
	out := make([]runCheck, len(runs))
	workers := min(m.opts.HeaderReaders, len(runs))
	bufBytes := HeaderRegionBytes(m.g, MaxRunChunks(m.g))
	if payload {
		bufBytes = max(bufBytes, checkPieceBytes)
	}
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf, err := uring.AllocBuffer(int(bufBytes))
			if err != nil {
				for i := range next {
					out[i] = runCheck{why: "no memory to read the header: " + err.Error(), io: true}
				}
				return
			}
			defer buf.Free()
			for i := range next {
				if payload {
					out[i] = m.verifyRun(runs[i], buf.Bytes())
					continue
				}
				h, table, why, io := m.checkHeader(runs[i], buf.Bytes())
				out[i] = runCheck{why: why, io: io, crcs: runCRCs{chunks: table, layers: h.LayerCRCs}}
			}
		}()
	}
	for i := range runs {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// checkHeader reads r's header and chunk table in one read (buf must hold
// HeaderRegionBytes(r.Chunks())) and verifies them; the reason is empty
// when they match r, io says the read itself failed.
func (m *Map) checkHeader(r *RunInfo, buf []byte) (h Header, table []uint32, why string, io bool) {
	f := m.files[r.File]
	n := len(r.Chain)
	if n < 1 || n > MaxRunChunks(m.g) {
		return Header{}, nil, fmt.Sprintf("%d chunks, want 1..%d", n, MaxRunChunks(m.g)), false
	}
	region := HeaderRegionBytes(m.g, n)
	if int64(len(buf)) < region {
		return Header{}, nil, fmt.Sprintf("header buffer of %d bytes, need %d", len(buf), region), true
	}
	if err := preadFull(int(f.FD), buf[:region], r.Offset); err != nil {
		return Header{}, nil, fmt.Sprintf("reading header and chunk table at %s offset %d: %v", f.Path, r.Offset, err), true
	}
	h, err := DecodeHeader(buf)
	if err != nil {
		return Header{}, nil, err.Error(), false
	}
	if err := h.Matches(m.g, r); err != nil {
		return Header{}, nil, "header does not match the journal: " + err.Error(), false
	}
	table, err = DecodeChunkTable(buf[HeaderBytes:region], m.g.Layers, n, h.TableCRC)
	if err != nil {
		return Header{}, nil, err.Error(), false
	}
	return h, table, "", false
}

// testHookPread, when set, fails a preadFull of the range it names (fault
// tests: an EIO on a header or payload read).
var testHookPread func(fd int, n int, off int64) error

func preadFull(fd int, b []byte, off int64) error {
	if testHookPread != nil {
		if err := testHookPread(fd, len(b), off); err != nil {
			return err
		}
	}
	for done := 0; done < len(b); {
		n, err := unix.Pread(fd, b[done:], off+int64(done))
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("end of file after %d of %d bytes", done, len(b))
		}
		done += n
	}
	return nil
}

// released is the journal's onDurable: quarantined space whose free record
// is durable goes back to the free lists.
func (m *Map) released(lsn uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.alloc.release(lsn); err != nil {
		// A double free means the run table is wrong: stop writing.
		m.j.fail(fmt.Errorf("objmap: releasing freed space: %w", err))
	}
}

// writeCheckpoint is the journal's checkpoint hook, called by the group
// commit leader when the segment outgrew SegmentBytes: it snapshots every
// journaled run (the records queued so far are covered by it, and leave
// the queue once it is in place), writes the snapshot to a temp file,
// fsyncs, renames it over the checkpoint, fsyncs the directory, then
// starts the next segment and deletes the old one. A checkpoint the file
// system has no room for is counted and left to a later group (nothing
// changed: the temp file is removed); so is the next segment, which the
// next group then creates before it writes. Other errors fail the journal.
func (m *Map) writeCheckpoint() (uint64, error) {
	j := m.j
	m.mu.Lock()
	j.mu.Lock()
	covered := j.nextLSN - 1
	j.mu.Unlock()
	seq := j.seq + 1
	list := make([]RunInfo, 0, len(m.runs))
	for _, e := range m.runs {
		list = append(list, e.info)
	}
	epoch, nextID := m.epoch, m.nextID
	m.mu.Unlock()
	b, err := encodeCheckpoint(seq, epoch, nextID, list)
	if err != nil {
		return 0, err
	}
	if err := writeCheckpointFile(j.dir, b); err != nil {
		return 0, j.checkpointFailed(err)
	}
	j.dropCovered(covered)
	j.needSeg = seq
	if testHookAfterCheckpointRename != nil {
		if err := testHookAfterCheckpointRename(); err != nil {
			return covered, err
		}
	}
	m.mu.Lock()
	m.checkpoints++
	m.mu.Unlock()
	if err := j.switchSegment(); err != nil {
		return covered, j.checkpointFailed(err)
	}
	return covered, nil
}

// writeCheckpointFile writes b as the checkpoint: temp file, fsync,
// rename, directory fsync. A failure before the rename leaves the old
// checkpoint (and no temp file); after it, the new one is in place.
func writeCheckpointFile(dir string, b []byte) error {
	tmp := filepath.Join(dir, checkpointTmpName)
	fd, err := unix.Open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("objmap: writing %s: %w", tmp, err)
	}
	err = jwrite("checkpoint", fd, b, 0)
	if err == nil {
		err = jsync("checkpoint", fd)
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, checkpointName))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("objmap: writing the checkpoint %s: %w", tmp, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("%w: objmap: checkpoint renamed into place: %w", errCheckpointPlaced, err)
	}
	return nil
}

// errCheckpointPlaced marks a checkpoint failure after the rename, which
// cannot be taken back.
var errCheckpointPlaced = errors.New("objmap: checkpoint in place, not durable")

// checkpointFailed decides what a failed checkpoint (or next segment)
// does: for lack of space it is counted and nil is returned (a later group
// retries it: a full disk stays usable); anything else fails the journal.
func (j *journal) checkpointFailed(err error) error {
	if !noSpace(err) || errors.Is(err, errCheckpointPlaced) {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.cpFailures++
	j.cpErr = err
	return nil
}

// testHookAfterCheckpointRename lets a test crash between the checkpoint's
// rename and the creation of the next segment.
var testHookAfterCheckpointRename func() error

// encodeCheckpoint encodes a checkpoint of runs (sorted here by id): head,
// one commit record per run (followed by a trim record when the run was
// trimmed), end.
func encodeCheckpoint(seq, epoch uint64, nextID RunID, runs []RunInfo) ([]byte, error) {
	slices.SortFunc(runs, func(a, b RunInfo) int { return cmpID(a.ID, b.ID) })
	b, err := AppendRecord(nil, &Record{Type: RecCheckpoint, Seq: seq, Epoch: epoch, NextID: nextID, Count: uint64(len(runs))})
	for i := 0; err == nil && i < len(runs); i++ {
		b, err = AppendRecord(b, &Record{Type: RecCommit, Run: runs[i]})
		if err == nil && runs[i].Kept < len(runs[i].Chain) {
			b, err = AppendRecord(b, &Record{Type: RecTrim, ID: runs[i].ID, Keep: runs[i].Kept})
		}
	}
	if err == nil {
		b, err = AppendRecord(b, &Record{Type: RecCheckpointEnd, Count: uint64(len(runs))})
	}
	if err != nil {
		return nil, fmt.Errorf("encoding checkpoint: %w", err)
	}
	return b, nil
}
