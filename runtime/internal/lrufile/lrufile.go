// Package lrufile is the lru sidecar: it keeps the prefix index's eviction
// order across a Close, so that a reopened store evicts what was least
// recently used before it closed, not what it happens to rebuild first. It lies in the store's
// first directory in the object map's order (whatever order Config.Dirs
// lists them in). It is a hint next to the object map, not part of it: the
// store serves the same blocks with or without it. Close writes it (once
// the journal is durable, so it names the blocks the next Open finds); Open
// orders its eviction list by it (prefix.Index.RestoreLRU), blocks it does
// not name (saved after it was written, before a crash) being the most
// recently used. A missing, torn or foreign file leaves the rebuilt order
// (runs in id order), said in RecoveryReport.LRUNote.
//
// Format, version 1 (little-endian):
//
//	"TUTTILRU" | u32 version | u32 0 | u64 ids | ids × u64 (next victim first) | u32 CRC32C of all before
package lrufile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
)

// Name is the sidecar's file name in the store's first directory.
const Name = "lru"

const (
	lruTmpName    = "lru.tmp"
	lruMagic      = "TUTTILRU"
	lruVersion    = 1
	lruHeaderSize = 24
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Write replaces dir's lru sidecar with ids. Not synced: a file the
// crash cut short fails its CRC and only costs the order.
func Write(dir string, ids []uint64) error {
	b := make([]byte, 0, lruHeaderSize+8*len(ids)+4)
	b = append(b, lruMagic...)
	b = binary.LittleEndian.AppendUint32(b, lruVersion)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint64(b, id)
	}
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	tmp := filepath.Join(dir, lruTmpName)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("lrufile: writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, Name)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("lrufile: writing %s: %w", filepath.Join(dir, Name), err)
	}
	return nil
}

// Read reads dir's lru sidecar, at most maxIDs ids. ids is nil and note
// says why when there is none to use (note is empty for a missing file).
func Read(dir string, maxIDs int) (ids []uint64, note string) {
	path := filepath.Join(dir, Name)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ""
	}
	if err != nil {
		return nil, fmt.Sprintf("%s: %v", path, err)
	}
	defer f.Close()
	limit := int64(lruHeaderSize) + 8*int64(maxIDs) + 4
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	switch {
	case err != nil:
		return nil, fmt.Sprintf("%s: %v", path, err)
	case int64(len(b)) > limit:
		return nil, fmt.Sprintf("%s: more than the %d ids the index holds", path, maxIDs)
	case len(b) < lruHeaderSize+4 || string(b[:8]) != lruMagic:
		return nil, fmt.Sprintf("%s: not an lru file (%d bytes)", path, len(b))
	case binary.LittleEndian.Uint32(b[8:]) != lruVersion:
		return nil, fmt.Sprintf("%s: version %d, this build reads %d", path, binary.LittleEndian.Uint32(b[8:]), lruVersion)
	}
	n := binary.LittleEndian.Uint64(b[16:])
	if n > uint64(maxIDs) || uint64(len(b)) != lruHeaderSize+8*n+4 {
		return nil, fmt.Sprintf("%s: %d ids in %d bytes (torn?)", path, n, len(b))
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, fmt.Sprintf("%s: CRC mismatch (torn?)", path)
	}
	ids = make([]uint64, n)
	for i := range ids {
		ids[i] = binary.LittleEndian.Uint64(body[lruHeaderSize+8*i:])
	}
	return ids, ""
}
