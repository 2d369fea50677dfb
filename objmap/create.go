package objmap

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// createStore makes the pool files, the first journal segment and, last,
// the manifests (a store without manifests is not a store yet, so a crash
// during creation leaves nothing that Open would trust).
func createStore(opts Options) ([]*manifest, error) {
	g := opts.Geometry
	if err := checkGeometry(g); err != nil {
		return nil, fmt.Errorf("objmap: creating store: %w", err)
	}
	nfiles := int64(len(opts.Dirs) * opts.FilesPerDir)
	if opts.CapacityBytes <= 0 {
		return nil, fmt.Errorf("objmap: creating store: CapacityBytes %d, want > 0", opts.CapacityBytes)
	}
	lay, err := NewLayout(g, len(opts.Dirs), opts.FilesPerDir, opts.RunWidth)
	if err != nil {
		return nil, fmt.Errorf("objmap: creating store: %w", err)
	}
	fileBytes := opts.CapacityBytes / nfiles &^ (BlockBytes - 1)
	if fileBytes < lay.RunBytes(1) {
		return nil, fmt.Errorf("objmap: creating store: CapacityBytes %d gives %d-byte pool files, smaller than one run of one chunk (%d bytes)",
			opts.CapacityBytes, fileBytes, lay.RunBytes(1))
	}
	id, err := newStoreID()
	if err != nil {
		return nil, err
	}
	mans := make([]*manifest, len(opts.Dirs))
	for _, d := range opts.Dirs {
		// Leftovers of an interrupted creation (no manifest was written) hold
		// nothing committed; remove only our own file names.
		for _, pat := range storeFilePatterns {
			old, _ := filepath.Glob(filepath.Join(d, pat))
			for _, p := range old {
				if err := os.Remove(p); err != nil {
					return nil, fmt.Errorf("objmap: creating store: removing leftover %s: %w", p, err)
				}
			}
		}
	}
	if err := createPoolFiles(opts, fileBytes); err != nil {
		return nil, err
	}
	for i, d := range opts.Dirs {
		if err := syncDir(d); err != nil {
			return nil, fmt.Errorf("objmap: creating store: %w", err)
		}
		mans[i] = &manifest{Version: manifestVersionFor(lay.Width()), StoreID: id, DirIndex: i, Dirs: len(opts.Dirs), Geometry: g,
			Fingerprint: fmt.Sprintf("%016x", Fingerprint(g)), FilesPerDir: opts.FilesPerDir, FileBytes: fileBytes,
			CapacityBytes: opts.CapacityBytes}
		if lay.Width() > 1 {
			mans[i].RunWidth = lay.Width()
		}
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

// createPoolFiles makes every directory's pool files, the directories at
// once (one goroutine each: with WritePool, creation writes the whole
// capacity, and each directory is its own device).
func createPoolFiles(opts Options, fileBytes int64) error {
	errs := make([]error, len(opts.Dirs))
	var wg sync.WaitGroup
	for i, d := range opts.Dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < opts.FilesPerDir && errs[i] == nil; k++ {
				global := k*len(opts.Dirs) + i
				errs[i] = createPoolFile(filepath.Join(d, poolFileName(global)), fileBytes, opts.WritePool, opts.Buffered)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// poolWriteBytes is one write of WritePool's zeros.
const poolWriteBytes = 4 << 20

// createPoolFile makes an owner-only file with sizeBytes of real blocks
// (fallocate, not a sparse file: the space is promised at creation and
// later writes do not fail with ENOSPC). With write, every byte is then
// written with zeros (O_DIRECT unless buffered), so the file system's
// extents are written ones: a save into a fresh pool then overwrites, as
// every later save does, instead of converting unwritten extents at each
// write's completion.
func createPoolFile(path string, sizeBytes int64, write, buffered bool) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("objmap: creating pool file %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Fallocate(fd, 0, 0, sizeBytes); err != nil {
		return fmt.Errorf("objmap: preallocating %d bytes for pool file %s: %w", sizeBytes, path, err)
	}
	if write {
		if err := writeZeros(path, sizeBytes, buffered); err != nil {
			return err
		}
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("objmap: fsync of pool file %s: %w", path, err)
	}
	return nil
}

// writeZeros writes sizeBytes of zeros over the pool file at path, in
// poolWriteBytes writes from one page-aligned buffer.
func writeZeros(path string, sizeBytes int64, buffered bool) error {
	flags := unix.O_WRONLY | unix.O_CLOEXEC
	if !buffered {
		flags |= unix.O_DIRECT
	}
	fd, err := unix.Open(path, flags, 0)
	if err != nil {
		return fmt.Errorf("objmap: opening pool file %s to write it: %w", path, err)
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, poolWriteBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("objmap: writing pool file %s: buffer: %w", path, err)
	}
	defer unix.Munmap(buf)
	for off := int64(0); off < sizeBytes; {
		n := int(min(int64(len(buf)), sizeBytes-off))
		w, err := unix.Pwrite(fd, buf[:n], off)
		if err != nil {
			return fmt.Errorf("objmap: writing pool file %s at %d: %w", path, off, err)
		}
		if w <= 0 {
			return fmt.Errorf("objmap: writing pool file %s at %d: %w", path, off, io.ErrShortWrite)
		}
		off += int64(w)
	}
	if err := unix.Fdatasync(fd); err != nil {
		return fmt.Errorf("objmap: fdatasync of pool file %s: %w", path, err)
	}
	return nil
}

func (m *Map) adoptManifests(mans []*manifest) error {
	first := mans[0]
	if first.Dirs > len(mans) {
		return fmt.Errorf("%w: store %s spans %d directories, %d given: %d missing from the list", ErrMissingDir, first.StoreID, first.Dirs, len(mans), first.Dirs-len(mans))
	}
	if first.Dirs != len(mans) {
		return fmt.Errorf("%w: store %s spans %d directories, %d given", ErrCorruptStore, first.StoreID, first.Dirs, len(mans))
	}
	m.dirs = make([]string, len(mans))
	for i, man := range mans {
		if man.StoreID != first.StoreID || man.Dirs != first.Dirs || man.FilesPerDir != first.FilesPerDir ||
			man.FileBytes != first.FileBytes || man.Geometry != first.Geometry || man.width() != first.width() {
			return fmt.Errorf("%w: %s belongs to store %s, %s to store %s (or their pool shapes differ)",
				ErrCorruptStore, m.opts.Dirs[i], man.StoreID, m.opts.Dirs[0], first.StoreID)
		}
		if m.dirs[man.DirIndex] != "" {
			return fmt.Errorf("%w: %s and %s both claim directory index %d", ErrCorruptStore, m.dirs[man.DirIndex], m.opts.Dirs[i], man.DirIndex)
		}
		m.dirs[man.DirIndex] = m.opts.Dirs[i]
	}
	if m.opts.Geometry != (kvshape.Geometry{}) && m.opts.Geometry != first.Geometry {
		return fmt.Errorf("%w: store %s has %v, asked for %v", ErrGeometryMismatch, m.dirs[0], first.Geometry, m.opts.Geometry)
	}
	if m.opts.CapacityBytes != 0 && m.opts.CapacityBytes != first.CapacityBytes {
		return fmt.Errorf("%w: store %s was created with CapacityBytes %d, asked for %d (resizing is not supported)",
			ErrSettingsMismatch, m.dirs[0], first.CapacityBytes, m.opts.CapacityBytes)
	}
	if m.opts.RunWidth != 0 && m.opts.RunWidth != first.width() {
		return fmt.Errorf("%w: store %s spreads each run over %d devices, asked for %d (the width is fixed at creation)",
			ErrSettingsMismatch, m.dirs[0], first.width(), m.opts.RunWidth)
	}
	lay, err := NewLayout(first.Geometry, first.Dirs, first.FilesPerDir, first.width())
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCorruptStore, err)
	}
	m.g, m.lay = first.Geometry, lay
	m.fileSize = first.FileBytes
	m.opts.FilesPerDir = first.FilesPerDir
	return nil
}

func (m *Map) openPool() error {
	n := m.lay.Files() // adoptManifests set the layout
	flags := unix.O_RDWR
	if m.readOnly {
		flags = unix.O_RDONLY
	}
	if !m.opts.Buffered {
		flags |= unix.O_DIRECT
	}
	for i := 0; i < n; i++ {
		path := filepath.Join(m.dirs[m.lay.Device(i)], poolFileName(i))
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
	}
	m.alloc = newAllocator(m.lay, m.fileSize)
	return nil
}

// storeFilePatterns are the names a store creates in its directories (LOCK
// aside): leftovers of an interrupted creation, and what a failed Open that
// created the store removes.
var storeFilePatterns = []string{"pool-*.dat", "journal-*.log", checkpointName, checkpointTmpName, manifestName, manifestTmpName}

// mkdirAllList is os.MkdirAll(dir, 0o700) that also returns the
// directories it created, outermost first.
func mkdirAllList(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	var missing []string
	for p := abs; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	slices.Reverse(missing)
	var made []string
	for _, p := range missing {
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return made, err
		}
		made = append(made, p)
	}
	return made, nil
}

// undoOpen is a failed Open's cleanup: it closes what Open opened and
// removes what it created (the store files if it created the store, LOCK
// files it created, directories it made), so the directory is as Open found
// it. It never removes files of a store that existed before (created is
// false then) and only empty directories.
func (m *Map) undoOpen(created bool, madeDirs []string) {
	for _, j := range []*journal{m.j} {
		if j != nil && j.fd >= 0 {
			unix.Close(j.fd)
			j.fd = -1
		}
	}
	for _, f := range m.files {
		if f.FD >= 0 {
			f.Close()
		}
	}
	for i, l := range m.locks {
		if created {
			for _, pat := range storeFilePatterns {
				old, _ := filepath.Glob(filepath.Join(m.opts.Dirs[i], pat))
				for _, p := range old {
					_ = os.Remove(p)
				}
			}
		}
		_ = l.unlockRemove()
	}
	for i := len(madeDirs) - 1; i >= 0; i-- {
		_ = os.Remove(madeDirs[i]) // fails, as it should, when not empty
	}
}
