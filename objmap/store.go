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

// Options configure Open.
type Options struct {
	// Dirs are the store directories (one per device); runs are striped
	// round-robin over them. On reopen they may be listed in any order.
	Dirs []string
	// CapacityBytes is the pool size, preallocated at creation and split
	// evenly over Dirs*FilesPerDir files. On reopen 0 means "as created";
	// another value must equal the one the store was created with.
	CapacityBytes int64
	// FilesPerDir is the pool files per directory (default 1).
	FilesPerDir int
	// Geometry is required at creation; on reopen the zero value means "as
	// recorded in the manifest", anything else must equal it.
	Geometry Geometry
	// Buffered opens pool files without O_DIRECT (for file systems that
	// refuse it, such as tmpfs). Files() reports DirectAlign 0 then.
	Buffered bool
	// ReadOnly opens for checking (fsck): nothing of the store is written
	// (only the LOCK file, with this pid), a torn journal tail is reported
	// but not truncated, and Allocate/Commit/Free fail with ErrReadOnly.
	ReadOnly bool
	// SegmentBytes bounds a journal segment: past it, a checkpoint is
	// written and a new segment started (default 64 MiB, minimum 512 bytes).
	SegmentBytes int64
	// MaxGroupBytes bounds the records one fdatasync covers (default 1 MiB).
	MaxGroupBytes int
	// HeaderReaders bounds the concurrent header reads of recovery (default 32).
	HeaderReaders int
}

// Limits.
const (
	DefaultSegmentBytes  = 64 << 20
	DefaultMaxGroupBytes = 1 << 20
	// MaxCommitBatch bounds the reservations of one Commit call.
	MaxCommitBatch = 1024
	// maxRunsPerAllocate bounds the runs one Allocate call returns.
	maxRunsPerAllocate = 4096
	maxDirs            = 256
	maxFilesPerDir     = 64
)

// Reservation is space for one run, returned by Allocate and owned by the
// caller until it passes it to Commit or Abort. The caller writes the run's
// objects at Offset+ObjectOffset(Chunks, l) in Files()[File] (the header
// block at Offset is written by Commit). A reservation not committed before
// a crash or Close is simply free space again.
type Reservation struct {
	ID         RunID
	Generation uint64
	File       int
	Offset     int64
	Length     int64 // Geometry.RunBytes(Chunks)
	Chunks     int
}

// CommitRequest commits one reservation.
type CommitRequest struct {
	Res Reservation
	// Chain holds the chain ids of the run's chunks (len == Res.Chunks).
	Chain []uint64
	// ChunkCRCs holds CRC32C of each chunk of each object, layer-major:
	// ChunkCRCs[l*Res.Chunks+c] covers the ChunkBytesPerLayer bytes of chunk
	// c at ObjectOffset(Res.Chunks, l)+c*ChunkBytesPerLayer (len ==
	// Layers*Res.Chunks). Commit writes them as the run's chunk table and
	// derives the header's per-layer CRCs from them.
	ChunkCRCs []uint32
	// LayerCRCs optionally holds CRC32C of each object's payload,
	// ObjectBytes(Chunks) bytes without padding (len == Layers): a cross-check
	// of ChunkCRCs (Commit fails when they disagree).
	LayerCRCs []uint32
	// Parent is the chain id the run's first block follows; HasParent is
	// false when the run starts a prefix. Stored in the header and the
	// journal record, returned in RunInfo.
	Parent    uint64
	HasParent bool
}

type runState uint8

const (
	stateCommitting runState = iota // record appended, not yet durable: not served
	stateLive                       // durable: served
)

type runEntry struct {
	info  RunInfo
	state runState
}

// Map is an open store: the pool files, their free space, the runs and the
// journal. It is safe for concurrent use.
type Map struct {
	g        Geometry
	opts     Options
	dirs     []string // ordered by manifest index; journal in dirs[0]
	locks    []*DirLock
	files    []*uring.File
	syncers  []*fileSyncer
	fileSize int64
	readOnly bool

	mu       sync.Mutex
	alloc    *allocator
	runs     map[RunID]*runEntry
	reserved map[RunID]Reservation
	nextID   RunID
	epoch    uint64
	closed   bool

	j           *journal // nil when read-only
	report      RecoveryReport
	checkpoints int64
	commits     int64
	frees       int64
	aborts      int64
	// Commits of LayerCRCs-only requests and the payload bytes they read back.
}

// Open opens (or creates) the store in opts.Dirs: it locks every directory,
// reads or writes the manifests, opens the pool, recovers (checkpoint,
// journal replay, header check of every run) and, unless read-only, journals
// the new epoch and the frees of dropped runs. The report is in Recovery().
func Open(opts Options) (*Map, error) {
	if len(opts.Dirs) == 0 || len(opts.Dirs) > maxDirs {
		return nil, fmt.Errorf("objmap: open: %d directories, want 1..%d", len(opts.Dirs), maxDirs)
	}
	if opts.FilesPerDir == 0 {
		opts.FilesPerDir = 1
	}
	if opts.FilesPerDir < 1 || opts.FilesPerDir > maxFilesPerDir {
		return nil, fmt.Errorf("objmap: open: FilesPerDir %d, want 1..%d", opts.FilesPerDir, maxFilesPerDir)
	}
	if opts.SegmentBytes == 0 {
		opts.SegmentBytes = DefaultSegmentBytes
	}
	if opts.SegmentBytes < 512 {
		return nil, fmt.Errorf("objmap: open: SegmentBytes %d, want >= 512", opts.SegmentBytes)
	}
	if opts.MaxGroupBytes == 0 {
		opts.MaxGroupBytes = DefaultMaxGroupBytes
	}
	if opts.MaxGroupBytes < MaxRecordBytes+recordFrameBytes {
		return nil, fmt.Errorf("objmap: open: MaxGroupBytes %d, want >= %d", opts.MaxGroupBytes, MaxRecordBytes+recordFrameBytes)
	}
	if opts.HeaderReaders == 0 {
		opts.HeaderReaders = 32
	}
	opts.HeaderReaders = min(max(opts.HeaderReaders, 1), 64)
	seen := map[string]bool{}
	for i, d := range opts.Dirs {
		abs, err := filepath.Abs(d)
		if err != nil {
			return nil, fmt.Errorf("objmap: open: Dirs[%d] %q: %w", i, d, err)
		}
		if seen[abs] {
			return nil, fmt.Errorf("objmap: open: Dirs[%d] %q listed twice", i, d)
		}
		seen[abs] = true
	}

	m := &Map{opts: opts, readOnly: opts.ReadOnly, runs: map[RunID]*runEntry{}, reserved: map[RunID]Reservation{}}
	ok := false
	defer func() {
		if !ok {
			m.closeFiles()
		}
	}()
	for _, d := range opts.Dirs {
		if !opts.ReadOnly {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return nil, fmt.Errorf("objmap: open: creating %s: %w", d, err)
			}
		} else if _, err := os.Stat(d); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrNoStore, d, err)
		}
		l, err := LockDir(d)
		if err != nil {
			return nil, err
		}
		m.locks = append(m.locks, l)
	}
	mans := make([]*manifest, len(opts.Dirs))
	have := 0
	for i, d := range opts.Dirs {
		man, err := readManifest(d)
		if err != nil {
			return nil, err
		}
		mans[i] = man
		if man != nil {
			have++
		}
	}
	var err error
	switch {
	case have == 0 && opts.ReadOnly:
		return nil, fmt.Errorf("%w: %s has no %s", ErrNoStore, opts.Dirs[0], manifestName)
	case have == 0:
		mans, err = createStore(opts)
	case have < len(mans):
		for i, man := range mans {
			if man == nil {
				return nil, fmt.Errorf("%w: %s has no %s while %d other directories do (interrupted creation, or a directory missing from the list?)",
					ErrCorruptStore, opts.Dirs[i], manifestName, have)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if err := m.adoptManifests(mans); err != nil {
		return nil, err
	}
	if err := m.openPool(); err != nil {
		return nil, err
	}
	if err := m.recover(); err != nil {
		return nil, err
	}
	ok = true
	return m, nil
}

// createStore makes the pool files, the first journal segment and, last,
// the manifests (a store without manifests is not a store yet, so a crash
// during creation leaves nothing that Open would trust).
func createStore(opts Options) ([]*manifest, error) {
	g := opts.Geometry
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("objmap: creating store: %w", err)
	}
	nfiles := int64(len(opts.Dirs) * opts.FilesPerDir)
	if opts.CapacityBytes <= 0 {
		return nil, fmt.Errorf("objmap: creating store: CapacityBytes %d, want > 0", opts.CapacityBytes)
	}
	fileBytes := opts.CapacityBytes / nfiles &^ (BlockBytes - 1)
	if fileBytes < g.RunBytes(1) {
		return nil, fmt.Errorf("objmap: creating store: CapacityBytes %d gives %d-byte pool files, smaller than one run of one chunk (%d bytes)",
			opts.CapacityBytes, fileBytes, g.RunBytes(1))
	}
	id, err := newStoreID()
	if err != nil {
		return nil, err
	}
	mans := make([]*manifest, len(opts.Dirs))
	for i, d := range opts.Dirs {
		// Leftovers of an interrupted creation (no manifest was written) hold
		// nothing committed; remove only our own file names.
		for _, pat := range []string{"pool-*.dat", "journal-*.log", checkpointName, checkpointTmpName, manifestTmpName} {
			old, _ := filepath.Glob(filepath.Join(d, pat))
			for _, p := range old {
				if err := os.Remove(p); err != nil {
					return nil, fmt.Errorf("objmap: creating store: removing leftover %s: %w", p, err)
				}
			}
		}
		for k := 0; k < opts.FilesPerDir; k++ {
			global := k*len(opts.Dirs) + i
			if err := createPoolFile(filepath.Join(d, poolFileName(global)), fileBytes); err != nil {
				return nil, err
			}
		}
		if err := syncDir(d); err != nil {
			return nil, fmt.Errorf("objmap: creating store: %w", err)
		}
		mans[i] = &manifest{Version: manifestVersion, StoreID: id, DirIndex: i, Dirs: len(opts.Dirs), Geometry: g,
			Fingerprint: fmt.Sprintf("%016x", g.Fingerprint()), FilesPerDir: opts.FilesPerDir, FileBytes: fileBytes,
			CapacityBytes: opts.CapacityBytes}
	}
	fd, _, err := createSegment(opts.Dirs[0], 1)
	if err != nil {
		return nil, err
	}
	unix.Close(fd)
	for i := len(opts.Dirs) - 1; i >= 0; i-- {
		if err := writeManifest(opts.Dirs[i], mans[i]); err != nil {
			return nil, err
		}
	}
	return mans, nil
}

// createPoolFile makes an owner-only file with sizeBytes of real blocks
// (fallocate, not a sparse file: the space is promised at creation and
// later writes do not fail with ENOSPC).
func createPoolFile(path string, sizeBytes int64) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("objmap: creating pool file %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Fallocate(fd, 0, 0, sizeBytes); err != nil {
		return fmt.Errorf("objmap: preallocating %d bytes for pool file %s: %w", sizeBytes, path, err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("objmap: fsync of pool file %s: %w", path, err)
	}
	return nil
}

func (m *Map) adoptManifests(mans []*manifest) error {
	first := mans[0]
	if first.Dirs != len(mans) {
		return fmt.Errorf("%w: store %s spans %d directories, %d given", ErrCorruptStore, first.StoreID, first.Dirs, len(mans))
	}
	m.dirs = make([]string, len(mans))
	for i, man := range mans {
		if man.StoreID != first.StoreID || man.Dirs != first.Dirs || man.FilesPerDir != first.FilesPerDir ||
			man.FileBytes != first.FileBytes || man.Geometry != first.Geometry {
			return fmt.Errorf("%w: %s belongs to store %s, %s to store %s (or their pool shapes differ)",
				ErrCorruptStore, m.opts.Dirs[i], man.StoreID, m.opts.Dirs[0], first.StoreID)
		}
		if m.dirs[man.DirIndex] != "" {
			return fmt.Errorf("%w: %s and %s both claim directory index %d", ErrCorruptStore, m.dirs[man.DirIndex], m.opts.Dirs[i], man.DirIndex)
		}
		m.dirs[man.DirIndex] = m.opts.Dirs[i]
	}
	if m.opts.Geometry != (Geometry{}) && m.opts.Geometry != first.Geometry {
		return fmt.Errorf("%w: store %s has %v, asked for %v", ErrGeometryMismatch, m.dirs[0], first.Geometry, m.opts.Geometry)
	}
	if m.opts.CapacityBytes != 0 && m.opts.CapacityBytes != first.CapacityBytes {
		return fmt.Errorf("objmap: open: store %s was created with CapacityBytes %d, asked for %d (resizing is not supported)",
			m.dirs[0], first.CapacityBytes, m.opts.CapacityBytes)
	}
	m.g = first.Geometry
	m.fileSize = first.FileBytes
	m.opts.FilesPerDir = first.FilesPerDir
	return nil
}

func (m *Map) openPool() error {
	n := len(m.dirs) * m.opts.FilesPerDir
	flags := unix.O_RDWR
	if m.readOnly {
		flags = unix.O_RDONLY
	}
	if !m.opts.Buffered {
		flags |= unix.O_DIRECT
	}
	sizes := make([]int64, n)
	for i := 0; i < n; i++ {
		path := filepath.Join(m.dirs[i%len(m.dirs)], poolFileName(i))
		f, err := uring.OpenFile(path, flags, 0o600)
		if err != nil {
			if errors.Is(err, unix.EINVAL) && !m.opts.Buffered {
				return fmt.Errorf("objmap: opening pool file %s with O_DIRECT: %w (the file system refuses O_DIRECT; set Options.Buffered)", path, err)
			}
			return fmt.Errorf("objmap: opening pool file: %w", err)
		}
		m.files = append(m.files, f)
		m.syncers = append(m.syncers, newFileSyncer(int(f.FD)))
		var st unix.Stat_t
		if err := unix.Fstat(int(f.FD), &st); err != nil {
			return fmt.Errorf("objmap: stat of pool file %s: %w", path, err)
		}
		if st.Size < m.fileSize {
			return fmt.Errorf("%w: pool file %s is %d bytes, manifest says %d", ErrCorruptStore, path, st.Size, m.fileSize)
		}
		if f.DirectAlign > BlockBytes {
			return fmt.Errorf("objmap: pool file %s needs O_DIRECT alignment %d, objects are aligned to %d", path, f.DirectAlign, BlockBytes)
		}
		sizes[i] = m.fileSize
	}
	m.alloc = newAllocator(m.g, sizes)
	return nil
}

// Geometry is the store's geometry (from its manifest).
func (m *Map) Geometry() Geometry { return m.g }

// Dirs are the store directories in manifest order (file i lies in Dirs()[i % len]).
func (m *Map) Dirs() []string { return slices.Clone(m.dirs) }

// Files are the open pool files, indexed by RunInfo.File / Reservation.File.
// The Map owns them and closes them in Close; the runtime may register them
// with its io_uring engines (which sets File.Index) but must not close them.
func (m *Map) Files() []*uring.File { return m.files }

// MaxRunChunks is the longest run Allocate returns (header capacity; see
// the package function).
func (m *Map) MaxRunChunks() int { return MaxRunChunks(m.g) }

// Recovery is the report of the recovery done by Open.
func (m *Map) Recovery() RecoveryReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.report.clone()
}

func (m *Map) usable() error {
	if m.closed {
		return ErrClosed
	}
	if m.readOnly {
		return ErrReadOnly
	}
	return m.j.failed()
}

// Allocate reserves space for up to chunks chain blocks as one or more runs
// of at most MaxRunChunks chunks, striped round-robin over the pool files.
// It never blocks on I/O. A partial result (fewer chunks in total than
// asked, nil error) means the pool had no room for the rest: the caller
// stores what fits and counts the rest as not admitted. When nothing fits it
// returns ErrNoSpace. Space freed by Free becomes allocatable only once its
// free record is durable (after the next Commit or Sync).
func (m *Map) Allocate(chunks int) ([]Reservation, error) {
	if chunks < 1 {
		return nil, fmt.Errorf("objmap: allocating %d chunks", chunks)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.usable(); err != nil {
		return nil, fmt.Errorf("objmap: allocating %d chunks: %w", chunks, err)
	}
	spans := m.alloc.alloc(chunks, MaxRunChunks(m.g), maxRunsPerAllocate)
	if len(spans) == 0 {
		return nil, fmt.Errorf("objmap: allocating %d chunks (%d bytes free, %d quarantined): %w",
			chunks, m.alloc.freeBytes(), m.alloc.quarantinedBytes(), ErrNoSpace)
	}
	out := make([]Reservation, len(spans))
	for i, sp := range spans {
		r := Reservation{ID: m.nextID, Generation: m.epoch, File: sp.file, Offset: sp.off, Length: sp.n, Chunks: sp.chunks}
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
// each run Commit writes the header (the commit record) at its offset, then
// fdatasyncs each pool file involved once (payload and header durable), then
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
	var last uint64
	var overfull bool
	for i, r := range reqs {
		info := RunInfo{ID: r.Res.ID, Generation: r.Res.Generation, File: r.Res.File, Offset: r.Res.Offset,
			Length: r.Res.Length, Chain: slices.Clone(r.Chain), Parent: r.Parent, HasParent: r.HasParent,
			ChunkCRCs: crcs[i].chunks, LayerCRCs: crcs[i].layers}
		lsn, of, err := m.j.append(&Record{Type: RecCommit, Run: info})
		if err != nil {
			m.mu.Unlock()
			return fmt.Errorf("objmap: journaling commit of run %d: %w", r.Res.ID, err)
		}
		last, overfull = lsn, overfull || of
		m.runs[info.ID] = &runEntry{info: info, state: stateCommitting}
	}
	m.mu.Unlock()
	_ = overfull // Commit waits anyway
	if err := m.j.waitDurable(last); err != nil {
		return fmt.Errorf("objmap: committing %d runs: %w", len(reqs), err)
	}
	m.mu.Lock()
	for _, r := range reqs {
		if e, ok := m.runs[r.Res.ID]; ok {
			e.state = stateLive
		}
	}
	m.commits += int64(len(reqs))
	m.mu.Unlock()
	return nil
}

// runCRCs is what Commit stored for one run (new slices, owned by the RunInfo).
type runCRCs struct{ chunks, layers []uint32 }

// writeHeaders writes each run's header and chunk table (one write at the
// run's offset, from off-heap memory) and fdatasyncs every pool file
// involved. It returns the CRCs it stored, per request.
func (m *Map) writeHeaders(reqs []CommitRequest) ([]runCRCs, error) {
	var need int64
	for _, r := range reqs {
		need = max(need, m.g.HeaderRegionBytes(r.Res.Chunks))
	}
	buf, err := uring.AllocBuffer(int(need))
	if err != nil {
		return nil, fmt.Errorf("objmap: commit: header buffer: %w", err)
	}
	defer buf.Free()
	b := buf.Bytes()
	out := make([]runCRCs, len(reqs))
	var sync []int
	for i, r := range reqs {
		f := m.files[r.Res.File]
		chunks := slices.Clone(r.ChunkCRCs)
		layers, err := m.g.LayerCRCsFromChunks(chunks, r.Res.Chunks)
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
		region := b[:m.g.HeaderRegionBytes(r.Res.Chunks)]
		tableCRC, err := EncodeChunkTable(region[HeaderBytes:], m.g.Layers, r.Res.Chunks, chunks)
		if err != nil {
			return nil, fmt.Errorf("objmap: committing run %d: %w", r.Res.ID, err)
		}
		h := Header{Fingerprint: m.g.Fingerprint(), Generation: r.Res.Generation, RunID: r.Res.ID, File: uint32(r.Res.File),
			Offset: uint64(r.Res.Offset), ChunkBytesPerLayer: uint64(m.g.ChunkBytesPerLayer()), Parent: r.Parent, HasParent: r.HasParent,
			LayerCRCs: layers, TableCRC: tableCRC, Chain: r.Chain}
		if err := EncodeHeader(region, &h); err != nil {
			return nil, fmt.Errorf("objmap: committing run %d: %w", r.Res.ID, err)
		}
		if err := pwriteAll(int(f.FD), region, r.Res.Offset); err != nil {
			return nil, fmt.Errorf("objmap: committing run %d: writing header at %s offset %d: %w", r.Res.ID, f.Path, r.Res.Offset, err)
		}
		out[i] = runCRCs{chunks: chunks, layers: layers}
		if !slices.Contains(sync, r.Res.File) {
			sync = append(sync, r.Res.File)
		}
	}
	for _, fi := range sync {
		if err := m.syncers[fi].sync(); err != nil {
			return nil, fmt.Errorf("objmap: commit: fdatasync of %s: %w", m.files[fi].Path, err)
		}
	}
	return out, nil
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
	lsn, overfull, err := m.j.append(&Record{Type: RecFree, ID: id})
	if err != nil {
		m.mu.Unlock()
		return fmt.Errorf("objmap: freeing run %d: %w", id, err)
	}
	delete(m.runs, id)
	m.alloc.quarantineFree(e.info.File, extent{e.info.Offset, e.info.Length}, lsn)
	m.frees++
	m.mu.Unlock()
	if overfull {
		return m.j.waitDurable(lsn)
	}
	return nil
}

// Sync makes every journal record appended so far durable (frees included),
// which also releases their quarantined space.
func (m *Map) Sync() error {
	m.mu.Lock()
	if err := m.usable(); err != nil {
		m.mu.Unlock()
		if errors.Is(err, ErrReadOnly) {
			return nil
		}
		return fmt.Errorf("objmap: sync: %w", err)
	}
	m.mu.Unlock()
	if lsn := m.j.lastLSN(); lsn > 0 {
		return m.j.waitDurable(lsn)
	}
	return nil
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
}

// Stats returns the current counters.
func (m *Map) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Stats{CapacityBytes: m.fileSize * int64(len(m.files)), FreeBytes: m.alloc.freeBytes(),
		QuarantinedBytes: m.alloc.quarantinedBytes(), Commits: m.commits, Frees: m.frees, Aborts: m.aborts,
		Checkpoints: m.checkpoints, Epoch: m.epoch}
	for _, r := range m.reserved {
		s.ReservedBytes += r.Length
	}
	for _, fs := range m.syncers {
		fs.mu.Lock()
		s.PoolSyncs += fs.syncs
		fs.mu.Unlock()
	}
	for _, e := range m.runs {
		if e.state == stateLive {
			s.LiveRuns++
		}
	}
	if m.j != nil {
		m.j.mu.Lock()
		s.JournalRecords, s.JournalSyncs, s.JournalBytes = m.j.records, m.j.syncs, m.j.bytes
		m.j.mu.Unlock()
	}
	return s
}

// Close makes pending journal records durable, then closes the journal and
// the pool files and releases the directory locks. Pending reservations are
// dropped (free again on the next open). The runtime must have closed the
// engines that registered Files() first.
func (m *Map) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	m.mu.Unlock()
	var err error
	if !m.readOnly {
		err = m.Sync()
	}
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	if cerr := m.closeFiles(); err == nil {
		err = cerr
	}
	return err
}

// closeFiles closes every descriptor and releases the locks, writing nothing
// (also what a crash leaves behind, which tests use).
func (m *Map) closeFiles() error {
	var first error
	if m.j != nil && m.j.fd >= 0 {
		if err := unix.Close(m.j.fd); err != nil && first == nil {
			first = err
		}
		m.j.fd = -1
	}
	for _, f := range m.files {
		if f.FD >= 0 {
			if err := f.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	for _, l := range m.locks {
		if err := l.Unlock(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
