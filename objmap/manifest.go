package objmap

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tutti-io/tutti/kvshape"
)

// A store directory holds:
//
//	LOCK                 flock'ed by the process that has the store open (holds its pid)
//	MANIFEST             JSON: store id, this directory's index, geometry, pool shape
//	pool-NNNN.dat        preallocated pool files (global index NNNN, NNNN % dirs == dir index)
//	checkpoint           (directory 0 only) snapshot of live runs
//	journal-<seq>.log    (directory 0 only) journal segments
//
// Files are created 0600 and directories 0700: KV cache contents are as
// sensitive as the prompts they were computed from.

const (
	lockName        = "LOCK"
	manifestName    = "MANIFEST"
	manifestTmpName = "MANIFEST.tmp"
	// manifestVersion 2: the journal and the checkpoint may hold trim
	// records (RecTrim), which a version 1 reader does not know; such a
	// reader refuses the store by its manifest instead of taking the
	// records for damage. A writable Open upgrades a version 1 store
	// (whose journal holds none) before it writes anything.
	//
	// Version 3: the store's runs spread over run_width devices
	// (layout.go). A version 2 reader would take each run to lie whole in
	// its home file and serve other runs' bytes: it refuses the store by
	// its version instead. A store whose runs lie on one device (run width
	// 1: one directory, or a store made before version 3) is still written
	// as version 2 (manifestVersionFor), so that older builds read it.
	manifestVersion = 3
	// minManifestVersion is the oldest version this build reads.
	minManifestVersion = 1
)

// Sentinel errors callers branch on.
var (
	ErrLocked           = errors.New("objmap: store directory is locked")
	ErrNoStore          = errors.New("objmap: no store in directory")
	ErrGeometryMismatch = errors.New("objmap: geometry differs from the store's")
	ErrCorruptStore     = errors.New("objmap: store metadata is corrupt")
	ErrNoSpace          = errors.New("objmap: no space in the pool")
	ErrReadOnly         = errors.New("objmap: store opened read-only")
	ErrClosed           = errors.New("objmap: store closed")
	ErrUnknownRun       = errors.New("objmap: unknown run")
	// ErrMissingDir: a directory of the store is not there: a listed one
	// does not exist or holds no part of a store the others hold, or the
	// store spans more directories than were listed.
	ErrMissingDir = errors.New("objmap: store directory missing")
	// ErrSettingsMismatch: the store was created with settings other than
	// those asked for on reopen (its capacity); the error names both.
	ErrSettingsMismatch = errors.New("objmap: settings differ from the store's")
)

// manifest describes the store; every directory has one naming its index.
type manifest struct {
	Version       int              `json:"version"`
	StoreID       string           `json:"store_id"`
	DirIndex      int              `json:"dir_index"`
	Dirs          int              `json:"dirs"`
	Geometry      kvshape.Geometry `json:"geometry"`
	Fingerprint   string           `json:"fingerprint"`
	FilesPerDir   int              `json:"files_per_dir"`
	FileBytes     int64            `json:"file_bytes"`
	CapacityBytes int64            `json:"capacity_bytes"` // as requested at creation
	// RunWidth is the devices each run spreads over (layout.go); absent
	// (0) before version 3, which means 1: each run on one device.
	RunWidth int `json:"run_width,omitempty"`
}

// width is the manifest's run width (1 when it names none).
func (m *manifest) width() int { return max(m.RunWidth, 1) }

// manifestVersionFor is the version a store of run width w is written as:
// 3 where its runs spread (older builds must refuse it), 2 where each lies
// on one device (their layout).
func manifestVersionFor(w int) int {
	if w > 1 {
		return manifestVersion
	}
	return 2
}

// maxManifestBytes bounds a MANIFEST file (a few hundred bytes of JSON).
const maxManifestBytes = 64 << 10

// maxFileBytes bounds a pool file's size as a manifest records it.
const maxFileBytes = 1 << 50

func readManifest(dir string) (*manifest, error) {
	path := filepath.Join(dir, manifestName)
	b, found, err := readBounded(path, maxManifestBytes)
	if errors.Is(err, errTooLarge) {
		return nil, fmt.Errorf("%w: %v", ErrCorruptStore, err)
	}
	if err != nil || !found {
		return nil, err
	}
	m, err := parseManifest(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorruptStore, path, err)
	}
	return m, nil
}

// parseManifest decodes and bounds a MANIFEST: every count and size within
// what Open accepts, the geometry valid and matching its fingerprint. It
// never panics on garbage.
func parseManifest(b []byte) (*manifest, error) {
	if len(b) > maxManifestBytes {
		return nil, fmt.Errorf("%d bytes, at most %d", len(b), maxManifestBytes)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	switch {
	case m.Version < minManifestVersion || m.Version > manifestVersion:
		return nil, fmt.Errorf("version %d, this build reads versions %d to %d (a newer build wrote it?)", m.Version, minManifestVersion, manifestVersion)
	case m.Dirs < 1 || m.Dirs > maxDirs || m.DirIndex < 0 || m.DirIndex >= m.Dirs:
		return nil, fmt.Errorf("directory index %d of %d (at most %d directories)", m.DirIndex, m.Dirs, maxDirs)
	case m.FilesPerDir < 1 || m.FilesPerDir > maxFilesPerDir || m.FileBytes < BlockBytes || m.FileBytes > maxFileBytes || m.FileBytes%BlockBytes != 0:
		return nil, fmt.Errorf("pool of %d files of %d bytes per directory (want 1..%d files of %d..%d bytes, block-aligned)",
			m.FilesPerDir, m.FileBytes, maxFilesPerDir, BlockBytes, int64(maxFileBytes))
	case m.CapacityBytes < 1:
		return nil, fmt.Errorf("capacity %d bytes", m.CapacityBytes)
	case m.Version < 3 && m.RunWidth != 0:
		return nil, fmt.Errorf("run width %d in a version %d manifest (run widths came with version 3)", m.RunWidth, m.Version)
	case m.Version >= 3 && m.RunWidth < 1:
		return nil, fmt.Errorf("version %d manifest without a run width", m.Version)
	}
	if err := checkGeometry(m.Geometry); err != nil {
		return nil, err
	}
	if fp := fmt.Sprintf("%016x", Fingerprint(m.Geometry)); fp != m.Fingerprint {
		return nil, fmt.Errorf("fingerprint %s, geometry gives %s", m.Fingerprint, fp)
	}
	lay, err := NewLayout(m.Geometry, m.Dirs, m.FilesPerDir, m.width())
	if err != nil {
		return nil, err
	}
	if m.FileBytes < lay.RunBytes(1) {
		return nil, fmt.Errorf("pool files of %d bytes, smaller than one run (%d)", m.FileBytes, lay.RunBytes(1))
	}
	return &m, nil
}

// upgradeManifests rewrites the manifests older than their layout's
// version (manifestVersionFor: a version 1 store becomes version 2) at that
// version (each atomically; a crash between two directories leaves
// versions a reader of either takes).
func upgradeManifests(dirs []string, mans []*manifest) error {
	for i, man := range mans {
		v := manifestVersionFor(man.width())
		if man.Version >= v {
			continue
		}
		up := *man
		up.Version = v
		if err := writeManifest(dirs[i], &up); err != nil {
			return fmt.Errorf("objmap: open: upgrading the manifest of %s from version %d: %w", dirs[i], man.Version, err)
		}
		mans[i] = &up
	}
	return nil
}

// writeManifest writes atomically: temp file, fsync, rename, fsync dir.
func writeManifest(dir string, m *manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("objmap: encoding manifest: %w", err)
	}
	return writeFileAtomic(dir, manifestTmpName, manifestName, append(b, '\n'))
}

func writeFileAtomic(dir, tmpName, name string, b []byte) error {
	tmp := filepath.Join(dir, tmpName)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("objmap: writing %s: %w", tmp, err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("objmap: writing %s in %s: %w", name, dir, err)
	}
	return nil
}

func newStoreID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("objmap: store id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

func poolFileName(global int) string { return fmt.Sprintf("pool-%04d.dat", global) }
