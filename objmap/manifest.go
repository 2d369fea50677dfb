package objmap

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
	manifestVersion = 1
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
)

// manifest describes the store; every directory has one naming its index.
type manifest struct {
	Version       int      `json:"version"`
	StoreID       string   `json:"store_id"`
	DirIndex      int      `json:"dir_index"`
	Dirs          int      `json:"dirs"`
	Geometry      Geometry `json:"geometry"`
	Fingerprint   string   `json:"fingerprint"`
	FilesPerDir   int      `json:"files_per_dir"`
	FileBytes     int64    `json:"file_bytes"`
	CapacityBytes int64    `json:"capacity_bytes"` // as requested at creation
}

func readManifest(dir string) (*manifest, error) {
	path := filepath.Join(dir, manifestName)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("objmap: reading %s: %w", path, err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorruptStore, path, err)
	}
	switch {
	case m.Version != manifestVersion:
		return nil, fmt.Errorf("%w: %s: version %d, want %d", ErrCorruptStore, path, m.Version, manifestVersion)
	case m.Dirs < 1 || m.DirIndex < 0 || m.DirIndex >= m.Dirs:
		return nil, fmt.Errorf("%w: %s: directory index %d of %d", ErrCorruptStore, path, m.DirIndex, m.Dirs)
	case m.FilesPerDir < 1 || m.FileBytes < BlockBytes || m.FileBytes%BlockBytes != 0:
		return nil, fmt.Errorf("%w: %s: pool of %d files of %d bytes", ErrCorruptStore, path, m.FilesPerDir, m.FileBytes)
	}
	if err := m.Geometry.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorruptStore, path, err)
	}
	if fp := fmt.Sprintf("%016x", m.Geometry.Fingerprint()); fp != m.Fingerprint {
		return nil, fmt.Errorf("%w: %s: fingerprint %s, geometry gives %s", ErrCorruptStore, path, m.Fingerprint, fp)
	}
	return &m, nil
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
