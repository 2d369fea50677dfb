package objmap

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tutti-io/tutti/uring"
)

// Allocate reserves space for up to chunks chain blocks as one or more runs
// of at most MaxRunChunks chunks, each spread over Layout.Width devices, the
// runs round-robin over the pool's stripe groups.
// It does no I/O; it waits for a Prewrite write in progress (one write),
// whose piece of the free space it may need. A partial result (fewer chunks in total than
// asked, nil error) means the pool had no room for the rest: the caller
// stores what fits and counts the rest as not admitted. When nothing fits it
// returns ErrNoSpace. Space freed by Free becomes allocatable only once its
// free record is durable (after the next Commit or Sync).
func (m *Map) Allocate(chunks int) ([]Reservation, error) {
	return m.AllocateStriped(chunks, 1)
}

// AllocateStriped is Allocate with the chunks cut into at least ways runs
// (fewer when there are fewer chunks) of near-equal length, the longer ones
// last: consecutive runs go to consecutive stripe groups and start their
// layers on consecutive devices of their group (Layout), so where runs
// spread over fewer devices than the store has (Layout.Width < Dirs) the
// runs of one save are written (and later read) on min(ways·Width, Dirs)
// devices at once. ways is bounded by the runs one call returns.
func (m *Map) AllocateStriped(chunks, ways int) ([]Reservation, error) {
	if chunks < 1 || ways < 1 || ways > maxRunsPerAllocate {
		return nil, fmt.Errorf("objmap: allocating %d chunks in %d runs (want chunks >= 1, ways in 1..%d)", chunks, ways, maxRunsPerAllocate)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// A prewrite in progress holds a piece of the free space: wait for it
	// (one write) rather than place runs around it or fail for lack of it.
	m.waitPrewrite()
	if err := m.usable(); err != nil {
		return nil, fmt.Errorf("objmap: allocating %d chunks: %w", chunks, err)
	}
	ways = min(ways, chunks)
	var spans []span
	for i := range ways {
		// Piece i of ways near-equal pieces, the longer ones last: a restore
		// reads a prefix of the chunks, most often all but the last few (the
		// block the next request no longer shares), so cutting the longest
		// piece keeps the devices' shares of the prefix even (13 chunks as
		// 3,3,3,4 read back 12 as 3 per device; as 4,3,3,3, one device reads
		// 4 of 12 and the load takes a third longer than striped evenly). A
		// piece the pool cannot take whole ends the allocation (partial, as
		// Allocate's).
		piece := chunks/ways + min(1, max(0, i-(ways-chunks%ways)+1))
		got := m.alloc.alloc(piece, MaxRunChunks(m.g), maxRunsPerAllocate-len(spans))
		spans = append(spans, got...)
		placed := 0
		for _, sp := range got {
			placed += sp.chunks
		}
		if placed < piece {
			break
		}
	}
	if len(spans) == 0 {
		return nil, fmt.Errorf("objmap: allocating %d chunks (%d bytes free, %d quarantined): %w",
			chunks, m.alloc.freeBytes(), m.alloc.quarantinedBytes(), ErrNoSpace)
	}
	out := make([]Reservation, len(spans))
	for i, sp := range spans {
		r := Reservation{ID: m.nextID, Generation: m.epoch, File: sp.file(m.lay), Offset: sp.off, Length: sp.n, Chunks: sp.chunks}
		m.nextID++
		m.reserved[r.ID] = r
		out[i] = r
	}
	return out, nil
}

// Abort returns an uncommitted reservation's space at once (nothing durable
// refers to it). The caller must have no write in flight into it.
func (m *Map) Abort(r Reservation) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.reserved[r.ID]; !ok {
		return fmt.Errorf("objmap: aborting run %d: %w (not a pending reservation)", r.ID, ErrUnknownRun)
	}
	delete(m.reserved, r.ID)
	m.aborts++
	return m.alloc.free(r.File, extent{r.Offset, r.Length})
}

// Commit makes runs durable, all or nothing up to the journal append. The
// caller must have completed (reaped) every payload write of each run. For
// each run Commit writes the header (the commit record) at its offset in its
// home file, then fdatasyncs each pool file involved once (every file the
// runs span: payload and header durable), then
// appends one journal record per run and waits for the group commit that
// makes them durable. When Commit returns nil the runs survive any crash and
// are served by Lookup. On an error before the journal append the
// reservations are aborted (their space is free again); on a journal error
// the store fails closed (every later write fails) and the runs' fate is
// decided by the next recovery.
func (m *Map) Commit(reqs []CommitRequest) error {
	if len(reqs) == 0 {
		return nil
	}
	if len(reqs) > MaxCommitBatch {
		return fmt.Errorf("objmap: committing %d runs, at most %d per call", len(reqs), MaxCommitBatch)
	}
	m.mu.Lock()
	if err := m.usable(); err != nil {
		m.mu.Unlock()
		return fmt.Errorf("objmap: commit: %w", err)
	}
	for i := range reqs {
		r := &reqs[i]
		have, ok := m.reserved[r.Res.ID]
		var err error
		switch {
		case !ok || have != r.Res:
			err = fmt.Errorf("%w (not a pending reservation of this store)", ErrUnknownRun)
		case len(r.Chain) != r.Res.Chunks:
			err = fmt.Errorf("%d chain ids for %d chunks", len(r.Chain), r.Res.Chunks)
		case len(r.ChunkCRCs) != m.g.Layers*r.Res.Chunks:
			err = fmt.Errorf("%d chunk CRCs for %d layers x %d chunks", len(r.ChunkCRCs), m.g.Layers, r.Res.Chunks)
		case r.LayerCRCs != nil && len(r.LayerCRCs) != m.g.Layers:
			err = fmt.Errorf("%d layer CRCs for %d layers", len(r.LayerCRCs), m.g.Layers)
		}
		if err != nil {
			m.mu.Unlock()
			return fmt.Errorf("objmap: committing run %d: %w", r.Res.ID, err)
		}
		for _, o := range reqs[:i] {
			if o.Res.ID == r.Res.ID {
				m.mu.Unlock()
				return fmt.Errorf("objmap: committing run %d twice in one call", r.Res.ID)
			}
		}
	}
	for _, r := range reqs {
		delete(m.reserved, r.Res.ID)
	}
	m.mu.Unlock()

	crcs, err := m.writeHeaders(reqs)
	if err != nil {
		m.mu.Lock()
		for _, r := range reqs {
			_ = m.alloc.free(r.Res.File, extent{r.Res.Offset, r.Res.Length})
		}
		m.aborts += int64(len(reqs))
		m.mu.Unlock()
		return err
	}

	m.mu.Lock()
	if err := m.j.commitRoom(); err != nil {
		m.freeReserved(reqs)
		m.mu.Unlock()
		return fmt.Errorf("objmap: committing %d runs: %w", len(reqs), err)
	}
	var last, since uint64
	for i, r := range reqs {
		info := RunInfo{ID: r.Res.ID, Generation: r.Res.Generation, File: r.Res.File, Offset: r.Res.Offset,
			Length: r.Res.Length, Chain: slices.Clone(r.Chain), Parent: r.Parent, HasParent: r.HasParent,
			Kept: len(r.Chain), ChunkCRCs: crcs[i].chunks, LayerCRCs: crcs[i].layers}
		lsn, at, _, err := m.j.append(&Record{Type: RecCommit, Run: info})
		if err != nil {
			// Only a journal that failed closed: the records queued before
			// it are never written either.
			m.mu.Unlock()
			return fmt.Errorf("objmap: journaling commit of run %d: %w", r.Res.ID, err)
		}
		last, since = lsn, at
		m.runs[info.ID] = &runEntry{info: info, state: stateCommitting}
	}
	m.mu.Unlock()
	// Commit waits for its records anyway, so the queue bound needs nothing more.
	return m.settleCommits(reqs, m.j.waitDurable(last, since))
}

// freeReserved gives back the space of reservations whose commit failed
// before any record named them (m.mu held).
func (m *Map) freeReserved(reqs []CommitRequest) {
	for _, r := range reqs {
		_ = m.alloc.free(r.Res.File, extent{r.Res.Offset, r.Res.Length})
	}
	m.aborts += int64(len(reqs))
}

// settleCommits ends a Commit whose records were waited for (werr: the
// wait's error). Runs the journal abandoned (an undone group) are gone from
// the table; the others are durable. All or nothing: when any was
// abandoned, those that became durable are freed again (journaled) and
// Commit fails. After the journal failed closed the runs stay as they are,
// unserved, for the next recovery to decide.
func (m *Map) settleCommits(reqs []CommitRequest, werr error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if werr != nil && m.j.failed() != nil {
		return fmt.Errorf("objmap: committing %d runs: %w", len(reqs), werr)
	}
	lost := 0
	for _, r := range reqs {
		if _, ok := m.runs[r.Res.ID]; !ok {
			lost++
		}
	}
	for _, r := range reqs {
		e, ok := m.runs[r.Res.ID]
		if !ok {
			continue
		}
		e.state = stateLive
		m.live++
		if lost > 0 {
			_, _, _, _ = m.freeLocked(r.Res.ID, e)
		}
	}
	if lost == 0 {
		m.commits += int64(len(reqs))
		return nil
	}
	m.aborts += int64(len(reqs))
	if werr == nil {
		werr = m.j.undoneErr()
	}
	return fmt.Errorf("objmap: committing %d runs: %d of them could not be journaled: %w", len(reqs), lost, werr)
}

// runCRCs is what Commit stored for one run (new slices, owned by the RunInfo).
type runCRCs struct{ chunks, layers []uint32 }

// writeHeaders writes each run's header and chunk table (one write at the
// run's offset in its home file, from off-heap memory) and fdatasyncs every
// pool file the runs span. It returns the CRCs it stored, per request.
func (m *Map) writeHeaders(reqs []CommitRequest) ([]runCRCs, error) {
	var need int64
	for _, r := range reqs {
		need = max(need, HeaderRegionBytes(m.g, r.Res.Chunks))
	}
	buf, err := uring.AllocBuffer(int(need))
	if err != nil {
		return nil, fmt.Errorf("objmap: commit: header buffer: %w", err)
	}
	defer buf.Free()
	b := buf.Bytes()
	out := make([]runCRCs, len(reqs))
	var touched []int // pool files written, each synced once
	for i, r := range reqs {
		f := m.files[r.Res.File]
		chunks := slices.Clone(r.ChunkCRCs)
		layers, err := LayerCRCsFromChunks(m.g, chunks, r.Res.Chunks)
		if err != nil {
			return nil, fmt.Errorf("objmap: committing run %d: %w", r.Res.ID, err)
		}
		if r.LayerCRCs != nil {
			for l, c := range layers {
				if c != r.LayerCRCs[l] {
					return nil, fmt.Errorf("objmap: committing run %d: layer %d: chunk CRCs give CRC32C %08x, LayerCRCs say %08x",
						r.Res.ID, l, c, r.LayerCRCs[l])
				}
			}
		}
		region := b[:HeaderRegionBytes(m.g, r.Res.Chunks)]
		tableCRC, err := EncodeChunkTable(region[HeaderBytes:], m.g.Layers, r.Res.Chunks, chunks)
		if err != nil {
			return nil, fmt.Errorf("objmap: committing run %d: %w", r.Res.ID, err)
		}
		h := Header{Fingerprint: Fingerprint(m.g), Generation: r.Res.Generation, RunID: r.Res.ID, File: uint32(r.Res.File),
			Offset: uint64(r.Res.Offset), ChunkBytesPerLayer: uint64(m.g.ChunkBytesPerLayer()), Parent: r.Parent, HasParent: r.HasParent,
			LayerCRCs: layers, TableCRC: tableCRC, Chain: r.Chain}
		if err := EncodeHeader(region, &h); err != nil {
			return nil, fmt.Errorf("objmap: committing run %d: %w", r.Res.ID, err)
		}
		if err := pwriteAll(int(f.FD), region, r.Res.Offset); err != nil {
			return nil, fmt.Errorf("objmap: committing run %d: writing header at %s offset %d: %w", r.Res.ID, f.Path, r.Res.Offset, err)
		}
		out[i] = runCRCs{chunks: chunks, layers: layers}
		for _, fi := range m.lay.RunFiles(r.Res.File, nil) {
			if !slices.Contains(touched, fi) {
				touched = append(touched, fi)
			}
		}
	}
	if err := m.syncFiles(touched); err != nil {
		return nil, err
	}
	return out, nil
}

// maxParallelSyncs bounds the fdatasyncs one commit runs at once.
const maxParallelSyncs = 16

// syncFiles fdatasyncs the pool files, all at once (at most
// maxParallelSyncs at a time): a commit of a striped save touches one file
// per device, and each device flushes on its own.
func (m *Map) syncFiles(files []int) error {
	errs := make([]error, len(files))
	sem := make(chan struct{}, maxParallelSyncs)
	var wg sync.WaitGroup
	for i, fi := range files {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.syncers[fi].sync(); err != nil {
				errs[i] = fmt.Errorf("objmap: commit: fdatasync of %s: %w", m.files[fi].Path, err)
			}
			<-sem
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Free forgets a committed run. It journals a free record and returns
// without waiting for it (unless the journal queue is past its bound); the
// run stops being served at once, and its space becomes allocatable once the
// record is durable (after the next Commit or Sync; see allocator for why).
// The caller must have no read in flight on the run.
func (m *Map) Free(id RunID) error {
	m.mu.Lock()
	if err := m.usable(); err != nil {
		m.mu.Unlock()
		return fmt.Errorf("objmap: freeing run %d: %w", id, err)
	}
	e, ok := m.runs[id]
	if !ok || e.state != stateLive {
		m.mu.Unlock()
		return fmt.Errorf("objmap: freeing run %d: %w", id, ErrUnknownRun)
	}
	lsn, since, overfull, err := m.freeLocked(id, e)
	m.mu.Unlock()
	if err != nil {
		return fmt.Errorf("objmap: freeing run %d: %w", id, err)
	}
	if overfull {
		return m.j.waitDurable(lsn, since)
	}
	return nil
}

// freeLocked journals the free of live run id (entry e) and quarantines
// its space until the record is durable (m.mu held).
func (m *Map) freeLocked(id RunID, e *runEntry) (lsn, since uint64, overfull bool, err error) {
	lsn, since, overfull, err = m.j.append(&Record{Type: RecFree, ID: id})
	if err != nil {
		return 0, 0, false, err
	}
	delete(m.runs, id)
	m.live--
	m.alloc.quarantineFree(e.info.File, extent{e.info.Offset, e.info.Length}, lsn)
	m.frees++
	return lsn, since, overfull, nil
}

// Trim cuts a committed run to its first keep chunks: from now on the run
// serves only those (RunInfo.Kept), after any later Open too. Like Free it
// journals a record and returns without waiting for it (unless the journal
// queue is past its bound); a crash before the record is durable serves the
// run's tail again, whose bytes are intact. The space stays the run's until
// Free. keep at or above the run's Kept changes nothing; keep < 1 is an
// error (Free the run instead). The caller must have no read in flight on
// the chunks it cuts.
func (m *Map) Trim(id RunID, keep int) error {
	m.mu.Lock()
	if err := m.usable(); err != nil {
		m.mu.Unlock()
		return fmt.Errorf("objmap: trimming run %d: %w", id, err)
	}
	e, ok := m.runs[id]
	switch {
	case !ok || e.state != stateLive:
		m.mu.Unlock()
		return fmt.Errorf("objmap: trimming run %d: %w", id, ErrUnknownRun)
	case keep < 1:
		m.mu.Unlock()
		return fmt.Errorf("objmap: trimming run %d to %d chunks: keep at least 1 (or free it)", id, keep)
	case keep >= e.info.Kept:
		m.mu.Unlock()
		return nil
	}
	lsn, since, overfull, err := m.j.append(&Record{Type: RecTrim, ID: id, Keep: keep})
	if err != nil {
		m.mu.Unlock()
		return fmt.Errorf("objmap: trimming run %d: %w", id, err)
	}
	e.info.Kept = keep
	m.trims++
	m.mu.Unlock()
	if overfull {
		return m.j.waitDurable(lsn, since)
	}
	return nil
}

// Sync makes every journal record appended so far durable (frees and
// trims; a commit's own Commit waits for it), which also releases their
// quarantined space. After a group was undone for lack of space, Sync
// writes the records queued again, with a probe record (an epoch record
// repeating the current epoch, which replay ignores) so that it tells
// whether space is back even when nothing else is queued.
func (m *Map) Sync() error {
	m.mu.Lock()
	if err := m.usable(); err != nil {
		m.mu.Unlock()
		if errors.Is(err, ErrReadOnly) {
			return nil
		}
		return fmt.Errorf("objmap: sync: %w", err)
	}
	lsn, since := m.j.keepLSN(), m.j.failureCount()
	if m.j.failing() != nil {
		var err error
		if lsn, since, _, err = m.j.append(&Record{Type: RecEpoch, Epoch: m.epoch}); err != nil {
			m.mu.Unlock()
			return fmt.Errorf("objmap: sync: %w", err)
		}
	}
	m.mu.Unlock()
	if lsn == 0 {
		return nil
	}
	if err := m.j.waitDurable(lsn, since); err != nil {
		return fmt.Errorf("objmap: sync: %w", err)
	}
	return nil
}

// Failing is the error of the last journal group the file system had no
// room for, while no group was written since (nil otherwise). Commits
// fail with it meanwhile; Sync tells when space is back.
func (m *Map) Failing() error {
	if m.j == nil {
		return nil
	}
	return m.j.failing()
}

// Lookup returns a committed, durable run. The returned Chain is shared:
// read-only.
func (m *Map) Lookup(id RunID) (RunInfo, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.runs[id]
	if !ok || e.state != stateLive {
		return RunInfo{}, false
	}
	return e.info, true
}

// Runs calls fn for every durable run in RunID order (the runtime rebuilds
// its prefix index from it after Open) until fn returns false. fn must not
// call back into the Map.
func (m *Map) Runs(fn func(RunInfo) bool) {
	m.mu.Lock()
	list := make([]RunInfo, 0, len(m.runs))
	for _, e := range m.runs {
		if e.state == stateLive {
			list = append(list, e.info)
		}
	}
	m.mu.Unlock()
	slices.SortFunc(list, func(a, b RunInfo) int { return cmpID(a.ID, b.ID) })
	for _, r := range list {
		if !fn(r) {
			return
		}
	}
}

func cmpID(a, b RunID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Stats is a snapshot of the store's counters.
type Stats struct {
	CapacityBytes    int64  `json:"capacity_bytes"`
	FreeBytes        int64  `json:"free_bytes"`
	QuarantinedBytes int64  `json:"quarantined_bytes"`
	ReservedBytes    int64  `json:"reserved_bytes"`
	LiveRuns         int    `json:"live_runs"`
	Commits          int64  `json:"commits"`
	Frees            int64  `json:"frees"`
	Aborts           int64  `json:"aborts"`
	JournalRecords   int64  `json:"journal_records"`
	JournalSyncs     int64  `json:"journal_syncs"`
	JournalBytes     int64  `json:"journal_bytes"`
	PoolSyncs        int64  `json:"pool_syncs"`
	Checkpoints      int64  `json:"checkpoints"`
	Epoch            uint64 `json:"epoch"`
	Trims            int64  `json:"trims"`
	// JournalFailures counts journal groups the file system had no room
	// for, undone (the segment truncated back); AbandonedCommits the commit
	// records they took with them (those Commits failed); JournalError is
	// the last one's error while no group was written since ("" then).
	JournalFailures  int64  `json:"journal_failures"`
	AbandonedCommits int64  `json:"abandoned_commits"`
	JournalError     string `json:"journal_error"`
	// CheckpointFailures counts checkpoints (or the segments after them)
	// not written for lack of space, each retried by a later group;
	// CheckpointError is the last one's error.
	CheckpointFailures int64  `json:"checkpoint_failures"`
	CheckpointError    string `json:"checkpoint_error"`
}

// Stats returns the current counters.
func (m *Map) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Stats{CapacityBytes: m.fileSize * int64(len(m.files)), FreeBytes: m.alloc.freeBytes(),
		QuarantinedBytes: m.alloc.quarantinedBytes(), Commits: m.commits, Frees: m.frees, Aborts: m.aborts,
		Checkpoints: m.checkpoints, Epoch: m.epoch, Trims: m.trims}
	for _, r := range m.reserved {
		s.ReservedBytes += m.lay.Footprint(r.Chunks)
	}
	for _, fs := range m.syncers {
		fs.mu.Lock()
		s.PoolSyncs += fs.syncs
		fs.mu.Unlock()
	}
	s.LiveRuns = m.live
	if m.j != nil {
		m.j.mu.Lock()
		s.JournalRecords, s.JournalSyncs, s.JournalBytes = m.j.records, m.j.syncs, m.j.bytes
		s.JournalFailures, s.AbandonedCommits, s.CheckpointFailures = int64(m.j.failures), m.j.abandoned, m.j.cpFailures
		s.JournalError, s.CheckpointError = errString(m.j.lastFail), errString(m.j.cpErr)
		m.j.mu.Unlock()
	}
	return s
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
