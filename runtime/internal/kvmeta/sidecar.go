package kvmeta

// The sidecar keeps the engine's metadata of saved blocks (token ids,
// its own hash; SaveWithMeta) across restarts, so a restarted store publishes
// the same token-derived keys. It is a file next to the object map, not part
// of it: the store serves the same bytes with or without it, and losing it
// (or its unsynced tail in a crash) only makes blocks hashes-only.
//
// Format, version 1 (little-endian):
//
//	header: "TUTTIKVM" | u32 version | u32 block tokens
//	record: u32 body bytes | u32 CRC32C(body) | body
//	body:   u16 blocks, then per block: u64 chain id | u8 hash bytes | hash |
//	        u16 token ids (0 or the block tokens) | u32 token ids...
//
// Records are appended at commit (no fsync). At Open the file is read (at
// most its size bound; a torn or corrupt tail ends the read), the entries of
// blocks the recovery indexed are kept, and the file is rewritten with those
// only. Past its size bound nothing more is appended until the next Open
// (counted).

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/tutti-io/tutti/kvevents"
)

// FileName is the sidecar's name in the store's first directory.
const FileName = "kvmeta"

const (
	kvmetaMagic   = "TUTTIKVM"
	kvmetaVersion = 1
	kvmetaHeader  = 16
	// kvmetaMaxRecordBlocks bounds one record (one commit's run).
	kvmetaMaxRecordBlocks = 1 << 12
	kvmetaMaxBody         = 16 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errKVMeta is wrapped by every sidecar parse error.
var errKVMeta = errors.New("kvmeta")

// metaRecord is one parsed sidecar record.
type metaRecord struct {
	ids   []uint64
	metas []Meta
}

// appendMetaRecord encodes the blocks ids with their metadata.
func appendMetaRecord(dst []byte, ids []uint64, metas []Meta) []byte {
	var body []byte
	body = binary.LittleEndian.AppendUint16(body, uint16(len(ids)))
	for i, id := range ids {
		m := metas[i]
		body = binary.LittleEndian.AppendUint64(body, id)
		body = append(body, byte(len(m.Hash)))
		body = append(body, m.Hash...)
		body = binary.LittleEndian.AppendUint16(body, uint16(len(m.Tokens)))
		for _, t := range m.Tokens {
			body = binary.LittleEndian.AppendUint32(body, t)
		}
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(body)))
	dst = binary.LittleEndian.AppendUint32(dst, crc32.Checksum(body, castagnoli))
	return append(dst, body...)
}

func kvmetaHeaderBytes(blockTokens int) []byte {
	h := append([]byte(kvmetaMagic), 0, 0, 0, 0, 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(h[8:], kvmetaVersion)
	binary.LittleEndian.PutUint32(h[12:], uint32(blockTokens))
	return h
}

// parseKVMeta reads a sidecar image: fn gets every whole record in order.
// It returns how many bytes were whole records (after the header) and why
// it stopped before the end, if it did; an error only for a wrong header.
func parseKVMeta(p []byte, blockTokens int, fn func(metaRecord)) (good int, stop error, err error) {
	if len(p) < kvmetaHeader || string(p[:8]) != kvmetaMagic {
		return 0, nil, fmt.Errorf("%w: not a kvmeta file", errKVMeta)
	}
	if v := binary.LittleEndian.Uint32(p[8:]); v != kvmetaVersion {
		return 0, nil, fmt.Errorf("%w: version %d, this build reads %d", errKVMeta, v, kvmetaVersion)
	}
	if bt := binary.LittleEndian.Uint32(p[12:]); int(bt) != blockTokens {
		return 0, nil, fmt.Errorf("%w: written for blocks of %d tokens, the store has %d", errKVMeta, bt, blockTokens)
	}
	off := kvmetaHeader
	for off < len(p) {
		if len(p)-off < 8 {
			return off, fmt.Errorf("%w: torn record header at byte %d", errKVMeta, off), nil
		}
		n := int(binary.LittleEndian.Uint32(p[off:]))
		crc := binary.LittleEndian.Uint32(p[off+4:])
		if n > kvmetaMaxBody || n > len(p)-off-8 {
			return off, fmt.Errorf("%w: record of %d bytes at byte %d", errKVMeta, n, off), nil
		}
		body := p[off+8 : off+8+n]
		if crc32.Checksum(body, castagnoli) != crc {
			return off, fmt.Errorf("%w: CRC mismatch at byte %d", errKVMeta, off), nil
		}
		rec, perr := parseMetaBody(body, blockTokens)
		if perr != nil {
			return off, fmt.Errorf("%w at byte %d", perr, off), nil
		}
		fn(rec)
		off += 8 + n
	}
	return off, nil, nil
}

func parseMetaBody(b []byte, blockTokens int) (metaRecord, error) {
	r := bytes.NewReader(b)
	var n uint16
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil || n == 0 || n > kvmetaMaxRecordBlocks {
		return metaRecord{}, fmt.Errorf("%w: record of %d blocks", errKVMeta, n)
	}
	rec := metaRecord{ids: make([]uint64, n), metas: make([]Meta, n)}
	for i := range int(n) {
		var id uint64
		var hl uint8
		if binary.Read(r, binary.LittleEndian, &id) != nil || binary.Read(r, binary.LittleEndian, &hl) != nil || hl > kvevents.MaxHashBytes {
			return metaRecord{}, fmt.Errorf("%w: block %d: bad id or hash length", errKVMeta, i)
		}
		var m Meta
		if hl > 0 {
			m.Hash = make([]byte, hl)
			if _, err := io.ReadFull(r, m.Hash); err != nil {
				return metaRecord{}, fmt.Errorf("%w: block %d: short hash", errKVMeta, i)
			}
		}
		var nt uint16
		if binary.Read(r, binary.LittleEndian, &nt) != nil || (nt != 0 && int(nt) != blockTokens) {
			return metaRecord{}, fmt.Errorf("%w: block %d: %d token ids, blocks have %d", errKVMeta, i, nt, blockTokens)
		}
		if nt > 0 {
			m.Tokens = make([]uint32, nt)
			if err := binary.Read(r, binary.LittleEndian, m.Tokens); err != nil {
				return metaRecord{}, fmt.Errorf("%w: block %d: short token ids", errKVMeta, i)
			}
		}
		rec.ids[i], rec.metas[i] = id, m
	}
	if r.Len() != 0 {
		return metaRecord{}, fmt.Errorf("%w: %d bytes after the last block", errKVMeta, r.Len())
	}
	return rec, nil
}

// metaFile is the open sidecar (appends serialised by mu).
type metaFile struct {
	mu          sync.Mutex
	path        string
	f           *os.File
	size        int64
	maxSize     int64
	blockTokens int
	opened      bool   // rewrite ran: appends go to f from now on
	unpersisted int64  // blocks whose record did not fit maxSize or failed to write
	loadNote    string // what Open found wrong with the file, if anything
}

// loadMetaFile reads dir's sidecar into metas (bounded by maxSize and by
// metas' own bound). A missing file is empty; a file of another version or
// block size is ignored (noted) and replaced at rewrite.
func loadMetaFile(dir string, blockTokens int, maxSize int64, metas *blockMetas) (*metaFile, error) {
	mf := &metaFile{path: filepath.Join(dir, FileName), maxSize: maxSize, blockTokens: blockTokens}
	f, err := os.Open(mf.path)
	if errors.Is(err, os.ErrNotExist) {
		return mf, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kvmeta: opening %s: %w", mf.path, err)
	}
	defer f.Close()
	p, err := io.ReadAll(io.LimitReader(f, maxSize))
	if err != nil {
		return nil, fmt.Errorf("kvmeta: reading %s: %w", mf.path, err)
	}
	_, stop, perr := parseKVMeta(p, blockTokens, func(r metaRecord) {
		for i, id := range r.ids {
			metas.put(id, r.metas[i])
		}
	})
	switch {
	case perr != nil:
		mf.loadNote = perr.Error()
	case stop != nil:
		mf.loadNote = stop.Error()
	}
	return mf, nil
}

// rewrite replaces the file with the metadata of the blocks keep says are
// served (forgetting the others in metas) and opens it for appends.
func (mf *metaFile) rewrite(metas *blockMetas, keep func(id uint64) bool) error {
	buf := kvmetaHeaderBytes(mf.blockTokens)
	var ids []uint64
	var ms []Meta
	flush := func() {
		if len(ids) > 0 {
			buf = appendMetaRecord(buf, ids, ms)
			ids, ms = ids[:0], ms[:0]
		}
	}
	metas.mu.Lock()
	for id, m := range metas.m {
		if !keep(id) {
			metas.bytes -= m.size()
			delete(metas.m, id)
			continue
		}
		ids, ms = append(ids, id), append(ms, m)
		if len(ids) == kvmetaMaxRecordBlocks {
			flush()
		}
	}
	metas.mu.Unlock()
	flush()
	tmp := mf.path + ".tmp"
	if err := os.WriteFile(tmp, buf, 0o644); err != nil {
		return fmt.Errorf("kvmeta: writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, mf.path); err != nil {
		return fmt.Errorf("kvmeta: replacing %s: %w", mf.path, err)
	}
	f, err := os.OpenFile(mf.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("kvmeta: opening %s: %w", mf.path, err)
	}
	mf.f, mf.size, mf.opened = f, int64(len(buf)), true
	return nil
}

// appendRecord persists the metadata of committed blocks (those without
// any are left out). A record past the size bound or a failed write is
// counted, never waited for or retried.
func (mf *metaFile) appendRecord(ids []uint64, metas *blockMetas) {
	var keep []uint64
	var ms []Meta
	for _, id := range ids {
		if m, ok := metas.get(id); ok {
			keep, ms = append(keep, id), append(ms, m)
		}
	}
	if len(keep) == 0 {
		return
	}
	blocks := int64(len(keep))
	var rec []byte
	for len(keep) > 0 {
		n := min(len(keep), kvmetaMaxRecordBlocks)
		rec = appendMetaRecord(rec, keep[:n], ms[:n])
		keep, ms = keep[n:], ms[n:]
	}
	mf.mu.Lock()
	defer mf.mu.Unlock()
	if mf.f == nil && !mf.opened {
		return // the recovery's own commits: rewrite writes what they keep
	}
	if mf.f == nil || mf.size+int64(len(rec)) > mf.maxSize {
		mf.unpersisted += blocks
		return
	}
	if _, err := mf.f.Write(rec); err != nil {
		mf.unpersisted += blocks
		return
	}
	mf.size += int64(len(rec))
}

func (mf *metaFile) stats() (unpersisted int64, note string) {
	mf.mu.Lock()
	defer mf.mu.Unlock()
	return mf.unpersisted, mf.loadNote
}

func (mf *metaFile) close() error {
	mf.mu.Lock()
	defer mf.mu.Unlock()
	if mf.f == nil {
		return nil
	}
	err := mf.f.Close()
	mf.f = nil
	return err
}
