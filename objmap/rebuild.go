package objmap

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/google/btree"
	"github.com/tutti-io/tutti/uring"
)

// Rebuilding the run index from the run headers, when the checkpoint or
// the journal is damaged (see journalread.go).
//
// Every run's header is its commit record: Commit writes it after the
// payload and fdatasyncs both before the journal record, so a run the
// journal acknowledged has a durable header that names its generation, id,
// file, offset, chain and CRCs. The rebuild reads every block of every
// pool file and keeps the blocks that hold a valid header of this store
// located where it lies. Headers of dead runs are still on disk too (freed
// runs, runs whose extent was reused in part), so:
//
//   - Later wins: a run overlapping a later run's header (greater
//     (generation, id): generations are store opens, ids increase within one)
//     was freed before that run was allocated; it is superseded, whether or
//     not the later run itself verifies.
//   - A run freed by a record still readable in the journal stays freed,
//     and one trimmed by such a record stays trimmed.
//   - Every remaining run's payload is read and checked against its chunk
//     table and per-layer CRCs: a header written by a Commit that crashed
//     before its payload was durable never verifies, and is dropped.
//
// Without the lost journal, a run that was freed but whose extent nothing
// reused since can come back, and a trimmed run whole: its bytes are intact
// and verified, so it serves the KV of its own chain, never another run's
// bytes. Next ids and
// the epoch start past every header seen, so no id is ever reused.

// scanPieceBytes is the piece the header scan reads a pool file in.
const scanPieceBytes = 1 << 20

// headerCand is a valid header found by the scan.
type headerCand struct {
	h    Header
	file int
	off  int64
}

// rebuild recovers the run table from the run headers (js.damage says why
// the journal is not trusted) and, unless read-only, writes a checkpoint of
// it and starts a new journal segment, so the next Open is normal. A
// writable rebuild that could not read the whole pool fails and writes
// nothing (rebuilding from a partial scan would lose the runs it missed).
func (m *Map) rebuild(js *journalState) error {
	rep := &m.report
	rep.Rebuilt = true
	cands, maxID, maxGen := m.scanHeaders()
	rep.HeaderCandidates = len(cands)
	winners := m.resolveHeaders(cands, js.freed, js.trims)
	rep.Objects = len(winners)
	slices.SortFunc(winners, func(a, b *RunInfo) int { return cmpID(a.ID, b.ID) })
	res := m.verifyRuns(winners, true)
	for i, r := range winners {
		why := res[i].why
		if why == "" {
			if err := m.alloc.carve(r.File, extent{r.Offset, r.Length}); err != nil {
				why = "extent: " + err.Error()
			}
		}
		switch {
		case why == "":
			r.ChunkCRCs, r.LayerCRCs = res[i].crcs.chunks, res[i].crcs.layers
			m.runs[r.ID] = &runEntry{info: *r, state: stateLive}
			m.live++
			rep.Recovered++
		case res[i].io:
			rep.UnreadableRuns = append(rep.UnreadableRuns, Problem{Run: r.ID, File: r.File, Offset: r.Offset, Reason: why})
		default:
			rep.DroppedRuns = append(rep.DroppedRuns, Problem{Run: r.ID, File: r.File, Offset: r.Offset,
				Reason: "header verifies, payload does not (a commit cut short, or damage): " + why})
		}
	}
	rep.HeaderRuns = rep.Recovered
	rep.Dropped, rep.Unreadable = len(rep.DroppedRuns), len(rep.UnreadableRuns)
	m.nextID = max(js.nextID, maxID+1)
	m.epoch = max(js.epoch, maxGen)
	rep.Epoch = m.epoch
	if m.readOnly {
		return nil
	}
	if len(rep.ScanErrors) > 0 || rep.Unreadable > 0 {
		return fmt.Errorf("%w: %s; rebuilding the index from run headers needs the whole pool, and %d ranges and %d runs could not be read (%s): nothing was changed",
			ErrCorruptStore, rep.JournalDamage, len(rep.ScanErrors), rep.Unreadable, strings.Join(append(rep.ScanErrors, problemList(rep.UnreadableRuns)...), "; "))
	}
	return m.rewriteJournal(js)
}

func problemList(ps []Problem) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = fmt.Sprintf("run %d (file %d offset %d): %s", p.Run, p.File, p.Offset, p.Reason)
	}
	return out
}

// rewriteJournal replaces a damaged journal after a rebuild: a checkpoint
// of the rebuilt runs naming a new segment past every one present, that
// segment, then the removal of the old segments, then the epoch. A crash
// before the checkpoint's rename leaves the damaged journal (the next Open
// rebuilds again); after it, the checkpoint is whole and the old segments
// are stale.
func (m *Map) rewriteJournal(js *journalState) error {
	dir0 := m.dirs[0]
	seq := max(js.maxSeq, js.startSeq) + 1
	list := make([]RunInfo, 0, len(m.runs))
	for _, e := range m.runs {
		list = append(list, e.info)
	}
	b, err := encodeCheckpoint(seq, m.epoch+1, m.nextID, list)
	if err != nil {
		return fmt.Errorf("objmap: rebuild: %w", err)
	}
	if err := writeFileAtomic(dir0, checkpointTmpName, checkpointName, b); err != nil {
		return fmt.Errorf("objmap: rebuild: %w", err)
	}
	fd, size, err := createSegment(dir0, seq)
	if err != nil {
		return err
	}
	m.j = newJournal(dir0, fd, seq, size, m.opts.SegmentBytes, m.opts.MaxGroupBytes)
	names, _ := filepath.Glob(filepath.Join(dir0, "journal-*.log"))
	for _, p := range names {
		if s, ok := segmentSeq(filepath.Base(p)); ok && s != seq {
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("objmap: rebuild: removing damaged journal segment %s: %w", p, err)
			}
		}
	}
	m.report.JournalSegment = seq
	return m.startEpoch(nil)
}

// scanHeaders reads every pool file in full (one reader per file, at most
// HeaderReaders) and returns the valid headers of this store that lie
// where they say, with the greatest run id and generation among them. Read
// errors go to the report's ScanErrors.
func (m *Map) scanHeaders() ([]headerCand, RunID, uint64) {
	type result struct {
		cands []headerCand
		errs  []string
		bytes int64
	}
	res := make([]result, len(m.files))
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < min(m.opts.HeaderReaders, len(m.files)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf, err := uring.AllocBuffer(scanPieceBytes)
			if err != nil {
				for fi := range next {
					res[fi].errs = []string{fmt.Sprintf("%s: no memory to scan it: %v", m.files[fi].Path, err)}
				}
				return
			}
			defer buf.Free()
			for fi := range next {
				res[fi].cands, res[fi].errs, res[fi].bytes = m.scanFile(fi, buf.Bytes())
			}
		}()
	}
	for fi := range m.files {
		next <- fi
	}
	close(next)
	wg.Wait()
	var all []headerCand
	var maxID RunID
	var maxGen uint64
	for _, r := range res {
		all = append(all, r.cands...)
		m.report.ScanErrors = append(m.report.ScanErrors, r.errs...)
		m.report.ScannedBytes += r.bytes
		for _, c := range r.cands {
			maxID, maxGen = max(maxID, c.h.RunID), max(maxGen, c.h.Generation)
		}
	}
	return all, maxID, maxGen
}

// scanFile reads pool file fi through buf and returns its valid headers.
func (m *Map) scanFile(fi int, buf []byte) (cands []headerCand, errs []string, scanned int64) {
	f := m.files[fi]
	piece := int64(len(buf)) &^ (BlockBytes - 1)
	for off := int64(0); off < m.fileSize; off += piece {
		n := min(piece, m.fileSize-off)
		if err := preadFull(int(f.FD), buf[:n], off); err != nil {
			errs = append(errs, fmt.Sprintf("%s bytes [%d, +%d): %v", f.Path, off, n, err))
			continue
		}
		scanned += n
		for k := int64(0); k+HeaderBytes <= n; k += BlockBytes {
			b := buf[k : k+HeaderBytes]
			if [8]byte(b[:8]) != headerMagic {
				continue
			}
			h, err := DecodeHeader(b)
			if err == nil && m.headerHere(&h, fi, off+k) {
				cands = append(cands, headerCand{h: h, file: fi, off: off + k})
			}
		}
	}
	return cands, errs, scanned
}

// headerHere reports whether h is a header of this store's geometry
// describing a run that starts at off in file fi and fits in it.
func (m *Map) headerHere(h *Header, fi int, off int64) bool {
	n := len(h.Chain)
	return h.Fingerprint == Fingerprint(m.g) && len(h.LayerCRCs) == m.g.Layers &&
		h.ChunkBytesPerLayer == uint64(m.g.ChunkBytesPerLayer()) && h.File == uint32(fi) && h.Offset == uint64(off) &&
		n >= 1 && n <= MaxRunChunks(m.g) && off+m.lay.RunBytes(n) <= m.fileSize
}

// resolveHeaders orders the candidates latest first and keeps those that
// overlap no later candidate, repeat no later run id and were not freed by
// a readable journal record (see the rules above); a readable trim record
// still cuts its run.
func (m *Map) resolveHeaders(cands []headerCand, freed map[RunID]bool, trims map[RunID]int) []*RunInfo {
	slices.SortFunc(cands, func(a, b headerCand) int {
		return cmp.Or(cmp.Compare(b.h.Generation, a.h.Generation), cmp.Compare(b.h.RunID, a.h.RunID),
			cmp.Compare(a.file, b.file), cmp.Compare(a.off, b.off))
	})
	// Runs claim extents of their stripe groups: a run overlaps any run
	// whose extent shares bytes in any file of its group (the extent is the
	// same range in each), whichever file holds either header.
	claimed := make([]*extentUnion, m.lay.spaces())
	for i := range claimed {
		claimed[i] = newExtentUnion()
	}
	seen := map[RunID]bool{}
	var out []*RunInfo
	for _, c := range cands {
		e := extent{c.off, m.lay.RunBytes(len(c.h.Chain))}
		overlaps := claimed[m.lay.space(c.file)].add(e)
		if overlaps || seen[c.h.RunID] || freed[c.h.RunID] {
			m.report.Superseded++
			continue
		}
		seen[c.h.RunID] = true
		kept := len(c.h.Chain)
		if k, ok := trims[c.h.RunID]; ok {
			kept = min(kept, k)
		}
		out = append(out, &RunInfo{ID: c.h.RunID, Generation: c.h.Generation, File: c.file, Offset: c.off, Length: e.n,
			Chain: c.h.Chain, Parent: c.h.Parent, HasParent: c.h.HasParent, Kept: kept})
	}
	return out
}

// extentUnion is a union of extents kept as disjoint, merged extents.
type extentUnion struct{ t *btree.BTreeG[extent] }

func newExtentUnion() *extentUnion {
	return &extentUnion{t: btree.NewG(btreeDegree, func(a, b extent) bool { return a.off < b.off })}
}

// add adds e and reports whether it overlapped the union before.
func (u *extentUnion) add(e extent) bool {
	overlaps := false
	m := e
	var del []extent
	// The extents that overlap e start before its end and end after its
	// start; being disjoint and sorted, they are contiguous in offset order.
	u.t.DescendLessOrEqual(extent{off: e.end() - 1}, func(x extent) bool {
		if x.end() <= e.off {
			return false
		}
		overlaps = true
		del = append(del, x)
		m.off, m.n = min(m.off, x.off), max(m.end(), x.end())-min(m.off, x.off)
		return true
	})
	for _, x := range del {
		u.t.Delete(x)
	}
	u.t.ReplaceOrInsert(m)
	return overlaps
}
