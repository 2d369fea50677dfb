package objmap

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// recover rebuilds the run table and the free space (see Open).
func (m *Map) recover() error {
	dir0 := m.dirs[0]
	rep := &m.report
	rep.Layers = m.g.Layers
	runs := map[RunID]*RunInfo{}
	var order []RunID // first-seen order, for stable reports
	var epoch uint64
	nextID := RunID(1)
	startSeq := uint64(1)

	cpRuns, head, found, err := readCheckpoint(dir0)
	if err != nil {
		return err
	}
	if found {
		startSeq, epoch, nextID = head.Seq, head.Epoch, head.NextID
		rep.CheckpointRuns = len(cpRuns)
		for i := range cpRuns {
			r := &cpRuns[i]
			if _, dup := runs[r.ID]; dup {
				return fmt.Errorf("%w: %s lists run %d twice", ErrCorruptStore, filepath.Join(dir0, checkpointName), r.ID)
			}
			runs[r.ID] = r
			order = append(order, r.ID)
		}
	}

	names, err := filepath.Glob(filepath.Join(dir0, "journal-*.log"))
	if err != nil {
		return fmt.Errorf("objmap: listing journal segments in %s: %w", dir0, err)
	}
	var segs []uint64
	for _, p := range names {
		seq, ok := segmentSeq(filepath.Base(p))
		if !ok {
			continue
		}
		if seq < startSeq {
			// Covered by the checkpoint (a crash came before its deletion).
			if !m.readOnly {
				if err := os.Remove(p); err != nil {
					return fmt.Errorf("objmap: removing stale journal segment %s: %w", p, err)
				}
			}
			continue
		}
		segs = append(segs, seq)
	}
	slices.Sort(segs)
	// A segment is created only after the checkpoint that names it is
	// durable, so exactly one segment follows the checkpoint, or none (a
	// crash between the two).
	if len(segs) > 1 || len(segs) == 1 && segs[0] != startSeq {
		return fmt.Errorf("%w: %s: journal segments %v follow a checkpoint naming segment %d", ErrCorruptStore, dir0, segs, startSeq)
	}
	rep.JournalSegment = startSeq
	var segFD = -1
	var segSize int64
	maxID := nextID - 1
	if len(segs) == 1 {
		path := filepath.Join(dir0, segmentName(startSeq))
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("objmap: reading journal segment %s: %w", path, err)
		}
		p := 0
		first := true
		for p < len(b) {
			r, n, err := DecodeRecord(b[p:])
			if err == nil && first && (r.Type != RecSegment || r.Seq != startSeq) {
				return fmt.Errorf("%w: %s starts with %s record (seq %d), want segment %d", ErrCorruptStore, path, r.Type, r.Seq, startSeq)
			}
			if err != nil {
				// A torn tail: records past the last fdatasync may be
				// partly written (or holes of zeros); none was acknowledged.
				rep.JournalTailBytes = int64(len(b) - p)
				rep.JournalTail = fmt.Sprintf("at byte %d: %v", p, err)
				break
			}
			first = false
			rep.JournalRecords++
			switch r.Type {
			case RecSegment:
				if p != 0 {
					return fmt.Errorf("%w: %s: segment record at byte %d", ErrCorruptStore, path, p)
				}
			case RecCommit:
				if _, dup := runs[r.Run.ID]; dup {
					return fmt.Errorf("%w: %s: run %d committed twice (byte %d)", ErrCorruptStore, path, r.Run.ID, p)
				}
				run := r.Run
				runs[run.ID] = &run
				order = append(order, run.ID)
				maxID = max(maxID, run.ID)
			case RecFree:
				if _, ok := runs[r.ID]; ok {
					delete(runs, r.ID)
				} else {
					rep.UnknownFrees++
				}
			case RecEpoch:
				epoch = max(epoch, r.Epoch)
			default:
				return fmt.Errorf("%w: %s: %s record at byte %d", ErrCorruptStore, path, r.Type, p)
			}
			p += n
		}
		if !m.readOnly {
			segFD, err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("objmap: opening journal segment %s: %w", path, err)
			}
			m.j = newJournal(dir0, segFD, startSeq, 0, m.opts.SegmentBytes, m.opts.MaxGroupBytes)
			if first {
				// Even the marker was torn: rewrite the segment from scratch.
				unix.Close(segFD)
				m.j.fd = -1
				segFD, segSize, err = createSegment(dir0, startSeq)
				if err != nil {
					return err
				}
				m.j.fd = segFD
			} else {
				segSize = int64(p)
				if rep.JournalTailBytes > 0 {
					if err := unix.Ftruncate(segFD, segSize); err != nil {
						return fmt.Errorf("objmap: truncating the torn tail of %s: %w", path, err)
					}
					if err := unix.Fsync(segFD); err != nil {
						return fmt.Errorf("objmap: fsync of %s: %w", path, err)
					}
				}
			}
		}
	} else if !m.readOnly {
		segFD, segSize, err = createSegment(dir0, startSeq)
		if err != nil {
			return err
		}
		m.j = newJournal(dir0, segFD, startSeq, 0, m.opts.SegmentBytes, m.opts.MaxGroupBytes)
	}
	if m.j != nil {
		m.j.size, m.j.bytes = segSize, segSize
	}

	// Carve every run out of the free space, then check its header.
	live := make([]*RunInfo, 0, len(runs))
	for _, id := range order {
		if r, ok := runs[id]; ok {
			live = append(live, r)
		}
	}
	rep.Objects = len(live)
	var dropped []Problem
	drop := func(r *RunInfo, why string) {
		dropped = append(dropped, Problem{Run: r.ID, File: r.File, Offset: r.Offset, Reason: why})
	}
	carved := live[:0]
	for _, r := range live {
		n := len(r.Chain)
		switch {
		case n > MaxRunChunks(m.g):
			drop(r, fmt.Sprintf("%d chunks, more than a header holds (%d)", n, MaxRunChunks(m.g)))
		case r.Length != m.g.RunBytes(n):
			drop(r, fmt.Sprintf("extent of %d bytes, %d chunks need %d", r.Length, n, m.g.RunBytes(n)))
		default:
			if err := m.alloc.carve(r.File, extent{r.Offset, r.Length}); err != nil {
				drop(r, err.Error())
				continue
			}
			carved = append(carved, r)
		}
	}
	reasons, crcs := m.verifyHeaders(carved)
	for i, r := range carved {
		if reasons[i] == "" {
			r.ChunkCRCs, r.LayerCRCs = crcs[i].chunks, crcs[i].layers
			m.runs[r.ID] = &runEntry{info: *r, state: stateLive}
			continue
		}
		drop(r, reasons[i])
		if err := m.alloc.free(r.File, extent{r.Offset, r.Length}); err != nil {
			return fmt.Errorf("objmap: recovery: returning space of dropped run %d: %w", r.ID, err)
		}
	}
	rep.DroppedRuns = dropped
	rep.Dropped = len(dropped)
	rep.Recovered = len(m.runs)
	m.nextID = max(nextID, maxID+1)
	m.epoch = epoch
	rep.Epoch = epoch
	if m.readOnly {
		return nil
	}

	// Journal this open's epoch and the frees of dropped runs, durably,
	// before any allocation can reuse their space.
	m.j.onDurable = m.released
	m.j.checkpoint = m.writeCheckpoint
	m.epoch = epoch + 1
	rep.Epoch = m.epoch
	last, _, err := m.j.append(&Record{Type: RecEpoch, Epoch: m.epoch})
	if err != nil {
		return err
	}
	for _, p := range dropped {
		if last, _, err = m.j.append(&Record{Type: RecFree, ID: p.Run}); err != nil {
			return err
		}
	}
	return m.j.waitDurable(last)
}

// verifyHeaders reads each run's header and chunk table (one read per
// run, bounded concurrency) and returns why it does not match (empty when
// it does) and, when it does, its CRCs.
func (m *Map) verifyHeaders(runs []*RunInfo) ([]string, []runCRCs) {
	reasons := make([]string, len(runs))
	crcs := make([]runCRCs, len(runs))
	workers := min(m.opts.HeaderReaders, len(runs))
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf, err := uring.AllocBuffer(int(m.g.HeaderRegionBytes(MaxRunChunks(m.g))))
			if err != nil {
				for i := range next {
					reasons[i] = "no memory to read the header: " + err.Error()
				}
				return
			}
			defer buf.Free()
			for i := range next {
				var h Header
				h, crcs[i].chunks, reasons[i] = m.checkHeader(runs[i], buf.Bytes())
				crcs[i].layers = h.LayerCRCs
			}
		}()
	}
	for i := range runs {
		next <- i
	}
	close(next)
	wg.Wait()
	return reasons, crcs
}

// checkHeader reads r's header and chunk table in one read (buf must hold
// HeaderRegionBytes(r.Chunks())) and verifies them; the reason is empty
// when they match the journal.
func (m *Map) checkHeader(r *RunInfo, buf []byte) (Header, []uint32, string) {
	f := m.files[r.File]
	n := len(r.Chain)
	if n < 1 || n > MaxRunChunks(m.g) {
		return Header{}, nil, fmt.Sprintf("%d chunks, want 1..%d", n, MaxRunChunks(m.g))
	}
	region := m.g.HeaderRegionBytes(n)
	if int64(len(buf)) < region {
		return Header{}, nil, fmt.Sprintf("header buffer of %d bytes, need %d", len(buf), region)
	}
	if err := preadFull(int(f.FD), buf[:region], r.Offset); err != nil {
		return Header{}, nil, fmt.Sprintf("reading header and chunk table at %s offset %d: %v", f.Path, r.Offset, err)
	}
	h, err := DecodeHeader(buf)
	if err != nil {
		return Header{}, nil, err.Error()
	}
	if err := h.Matches(m.g, r); err != nil {
		return Header{}, nil, "header does not match the journal: " + err.Error()
	}
	chunks, err := DecodeChunkTable(buf[HeaderBytes:region], m.g.Layers, n, h.TableCRC)
	if err != nil {
		return Header{}, nil, err.Error()
	}
	return h, chunks, ""
}

func preadFull(fd int, b []byte, off int64) error {
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
// journaled run (and drops the queued records the snapshot covers), writes
// the snapshot to a temp file, fsyncs, renames it over the checkpoint,
// fsyncs the directory, then starts the next segment and deletes the old one.
func (m *Map) writeCheckpoint() (uint64, error) {
	j := m.j
	m.mu.Lock()
	covered := j.takeAllPending()
	seq := j.seq + 1
	list := make([]RunInfo, 0, len(m.runs))
	for _, e := range m.runs {
		list = append(list, e.info)
	}
	epoch, nextID := m.epoch, m.nextID
	m.mu.Unlock()
	slices.SortFunc(list, func(a, b RunInfo) int { return cmpID(a.ID, b.ID) })

	b, err := AppendRecord(nil, &Record{Type: RecCheckpoint, Seq: seq, Epoch: epoch, NextID: nextID, Count: uint64(len(list))})
	for i := 0; err == nil && i < len(list); i++ {
		b, err = AppendRecord(b, &Record{Type: RecCommit, Run: list[i]})
	}
	if err == nil {
		b, err = AppendRecord(b, &Record{Type: RecCheckpointEnd, Count: uint64(len(list))})
	}
	if err != nil {
		return 0, fmt.Errorf("encoding checkpoint: %w", err)
	}
	if err := writeFileAtomic(j.dir, checkpointTmpName, checkpointName, b); err != nil {
		return 0, err
	}
	if testHookAfterCheckpointRename != nil {
		if err := testHookAfterCheckpointRename(); err != nil {
			return 0, err
		}
	}
	fd, size, err := createSegment(j.dir, seq)
	if err != nil {
		return 0, err
	}
	oldFD, oldSeq := j.fd, j.seq
	j.fd, j.seq, j.size = fd, seq, size
	j.mu.Lock()
	j.bytes = size
	j.segments++
	j.mu.Unlock()
	unix.Close(oldFD)
	// A segment left behind is deleted by the next Open.
	_ = os.Remove(filepath.Join(j.dir, segmentName(oldSeq)))
	m.mu.Lock()
	m.checkpoints++
	m.mu.Unlock()
	return covered, nil
}

// testHookAfterCheckpointRename lets a test crash between the checkpoint's
// rename and the creation of the next segment.
var testHookAfterCheckpointRename func() error
