package objmap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// Options configure Open.
type Options struct {
	// Dirs are the store directories (one per device); every run spreads
	// its layers over them (RunWidth, layout.go). On reopen they may be
	// listed in any order.
	Dirs []string
	// CapacityBytes is the pool size, preallocated at creation and split
	// evenly over Dirs*FilesPerDir files. On reopen 0 means "as created";
	// another value must equal the one the store was created with.
	CapacityBytes int64
	// FilesPerDir is the pool files per directory (default 1).
	FilesPerDir int
	// Geometry is required at creation; on reopen the zero value means "as
	// recorded in the manifest", anything else must equal it.
	Geometry kvshape.Geometry
	// Buffered opens pool files without O_DIRECT (for file systems that
	// refuse it, such as tmpfs). Files() reports DirectAlign 0 then.
	Buffered bool
	// WritePool writes every byte of the pool with zeros at creation
	// (ignored on reopen): creation then takes the capacity's write time,
	// and the first saves into the fresh pool overwrite written extents as
	// every later save does, instead of having the file system convert
	// fallocate's unwritten extents as each write completes.
	WritePool bool
	// ReadOnly opens for checking (fsck): nothing is written (the LOCK
	// file is flock'ed shared, so a store on a read-only mount can be
	// checked, and a writer holding it is refused), a torn journal tail is
	// reported but not truncated, a damaged journal is reported and the
	// index rebuilt from run headers in memory only, and
	// Allocate/Commit/Free fail with ErrReadOnly.
	ReadOnly bool
	// MustExist opens only a store that exists (fsck --repair): nothing
	// is created, a listed directory that does not exist is ErrMissingDir
	// and directories without a store are ErrNoStore. ReadOnly implies it.
	MustExist bool
	// SegmentBytes bounds a journal segment: past it, a checkpoint is
	// written and a new segment started (default 64 MiB, minimum 512 bytes).
	SegmentBytes int64
	// MaxGroupBytes bounds the records one fdatasync covers (default 1 MiB).
	MaxGroupBytes int
	// HeaderReaders bounds the concurrent header reads of recovery (default 32).
	HeaderReaders int
	// RunWidth is the devices each run spreads over (layout.go), fixed at
	// creation: 0 is RunWidth(Geometry.Layers, len(Dirs)), every directory
	// for a real model; 1 puts each run whole on one device (the layout of
	// stores made before manifest version 3). On reopen 0 means "as
	// created"; another value must equal it.
	RunWidth int
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
	// MaxSegmentBytes bounds Options.SegmentBytes, and so the journal a
	// recovery reads into memory.
	MaxSegmentBytes = 1 << 30
	// MaxGroupBytesLimit bounds Options.MaxGroupBytes: one group commit is
	// one write, and only the last one can be torn by a crash.
	MaxGroupBytesLimit = 16 << 20
	maxFilesPerDir     = 64
)

// Reservation is space for one run, returned by Allocate and owned by the
// caller until it passes it to Commit or Abort. The caller writes the run's
// objects where the store's Layout puts them (Layout.Where(res.Place(), l,
// 0)); Commit writes the header region at Offset of Files()[File], the
// run's home file. A reservation not committed before a crash or Close is
// simply free space again.
type Reservation struct {
	ID         RunID
	Generation uint64
	File       int   // the home pool file (Layout: the run spans its stripe group)
	Offset     int64 // the extent's start, the same in every file the run spans
	Length     int64 // the extent in each of those files: Layout.RunBytes(Chunks)
	Chunks     int
}

// CommitRequest commits one reservation.
type CommitRequest struct {
	Res Reservation
	// Chain holds the chain ids of the run's chunks (len == Res.Chunks).
	Chain []uint64
	// ChunkCRCs holds CRC32C of each chunk of each object, layer-major:
	// ChunkCRCs[l*Res.Chunks+c] covers the ChunkBytesPerLayer bytes of chunk
	// c of layer l, at Layout.Where(Res.Place(), l, c) (len ==
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
	stateUnreadable                 // journaled, header unreadable (I/O error): not served, kept for the next Open
)

type runEntry struct {
	info  RunInfo
	state runState
}

// Map is an open store: the pool files, their free space, the runs and the
// journal. It is safe for concurrent use.
type Map struct {
	g        kvshape.Geometry
	lay      Layout
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
	live     int // runs in stateLive: Stats stays O(1), cheap enough to call per request
	reserved map[RunID]Reservation
	nextID   RunID
	epoch    uint64
	closed   bool

	// pre is the prewrite state (prewrite.go); prewriteDone (on mu) wakes
	// Close when the last Prewrite write in progress ends.
	pre          prewriteState
	prewriteDone sync.Cond

	j           *journal // nil when read-only
	report      RecoveryReport
	checkpoints int64
	commits     int64
	frees       int64
	trims       int64
	aborts      int64
	// Commits of LayerCRCs-only requests and the payload bytes they read back.
}

// Open opens (or creates) the store in opts.Dirs: it locks every directory
// (exclusively; read-only: shared, writing nothing), reads or writes the
// manifests, opens the pool, recovers (checkpoint, journal replay, header
// check of every run; from the run headers when the journal is damaged)
// and, unless read-only, journals the new epoch and the frees of dropped
// runs. The report is in Recovery(). A failed Open leaves the directories
// as it found them: what it created (pool files, journal, manifests, LOCK,
// the directories themselves) is removed again.
func Open(opts Options) (*Map, error) {
	opts, err := checkOptions(opts)
	if err != nil {
		return nil, err
	}
	m := &Map{opts: opts, readOnly: opts.ReadOnly, runs: map[RunID]*runEntry{}, reserved: map[RunID]Reservation{}}
	m.prewriteDone.L = &m.mu
	var madeDirs []string // created by this Open, deepest last
	created := false      // this Open created the store files
	ok := false
	defer func() {
		if !ok {
			m.undoOpen(created, madeDirs)
		}
	}()
	existing := opts.ReadOnly || opts.MustExist
	made := map[string]bool{} // directories of opts.Dirs this Open created
	for _, d := range opts.Dirs {
		var l *DirLock
		if existing {
			if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("%w: %s does not exist", ErrMissingDir, d)
			} else if err != nil {
				return nil, fmt.Errorf("objmap: open: %w", err)
			}
		} else {
			dm, merr := mkdirAllList(d)
			madeDirs = append(madeDirs, dm...)
			if merr != nil {
				return nil, fmt.Errorf("objmap: open: creating %s: %w", d, merr)
			}
			made[d] = len(dm) > 0
		}
		if opts.ReadOnly {
			l, err = LockDirShared(d)
		} else {
			l, err = LockDir(d)
		}
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
	switch {
	case have == 0 && existing:
		return nil, fmt.Errorf("%w: no %s in %s", ErrNoStore, manifestName, strings.Join(opts.Dirs, ", "))
	case have == 0:
		created = true
		mans, err = createStore(opts)
	case have < len(mans):
		for i, man := range mans {
			if man == nil && made[opts.Dirs[i]] {
				return nil, fmt.Errorf("%w: %s does not exist while %d other directories listed hold the store", ErrMissingDir, opts.Dirs[i], have)
			}
		}
		for i, man := range mans {
			if man == nil {
				return nil, fmt.Errorf("%w: %s has no %s while %d other directories listed do: the store's directory there is missing (not mounted?), the directory is not one of the store's, or the store's creation was interrupted",
					ErrMissingDir, opts.Dirs[i], manifestName, have)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if err := m.adoptManifests(mans); err != nil {
		return nil, err
	}
	if !opts.ReadOnly {
		if err := upgradeManifests(opts.Dirs, mans); err != nil {
			return nil, err
		}
	}
	if err := m.openPool(); err != nil {
		return nil, err
	}
	if err := m.recover(); err != nil {
		return nil, err
	}
	m.scanUnwritten()
	ok = true
	return m, nil
}

// checkOptions fills in defaults and bounds every option.
func checkOptions(opts Options) (Options, error) {
	if len(opts.Dirs) == 0 || len(opts.Dirs) > maxDirs {
		return opts, fmt.Errorf("objmap: open: %d directories, want 1..%d", len(opts.Dirs), maxDirs)
	}
	if opts.FilesPerDir == 0 {
		opts.FilesPerDir = 1
	}
	if opts.FilesPerDir < 1 || opts.FilesPerDir > maxFilesPerDir {
		return opts, fmt.Errorf("objmap: open: FilesPerDir %d, want 1..%d", opts.FilesPerDir, maxFilesPerDir)
	}
	if opts.SegmentBytes == 0 {
		opts.SegmentBytes = DefaultSegmentBytes
	}
	if opts.SegmentBytes < 512 || opts.SegmentBytes > MaxSegmentBytes {
		return opts, fmt.Errorf("objmap: open: SegmentBytes %d, want 512..%d", opts.SegmentBytes, int64(MaxSegmentBytes))
	}
	if opts.MaxGroupBytes == 0 {
		opts.MaxGroupBytes = DefaultMaxGroupBytes
	}
	if opts.MaxGroupBytes < MaxRecordBytes+recordFrameBytes || opts.MaxGroupBytes > MaxGroupBytesLimit {
		return opts, fmt.Errorf("objmap: open: MaxGroupBytes %d, want %d..%d", opts.MaxGroupBytes, MaxRecordBytes+recordFrameBytes, MaxGroupBytesLimit)
	}
	if opts.RunWidth < 0 || opts.RunWidth > maxDirs {
		return opts, fmt.Errorf("objmap: open: RunWidth %d, want 0..%d", opts.RunWidth, maxDirs)
	}
	if opts.HeaderReaders == 0 {
		opts.HeaderReaders = 32
	}
	opts.HeaderReaders = min(max(opts.HeaderReaders, 1), 64)
	seen := map[string]bool{}
	for i, d := range opts.Dirs {
		abs, err := filepath.Abs(d)
		if err != nil {
			return opts, fmt.Errorf("objmap: open: Dirs[%d] %q: %w", i, d, err)
		}
		if seen[abs] {
			return opts, fmt.Errorf("objmap: open: Dirs[%d] %q listed twice", i, d)
		}
		seen[abs] = true
	}
	return opts, nil
}

// Geometry is the store's geometry (from its manifest).
func (m *Map) Geometry() kvshape.Geometry { return m.g }

// Dirs are the store directories in manifest order (pool file i lies in
// Dirs()[Layout().Device(i)]).
func (m *Map) Dirs() []string { return slices.Clone(m.dirs) }

// Layout is where the store's runs lie (layout.go): every read or write of
// a run's objects asks it.
func (m *Map) Layout() Layout { return m.lay }

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
	m.waitPrewrite()
	if m.pre.zero != nil {
		m.pre.zero.Free()
		m.pre.zero = nil
	}
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
