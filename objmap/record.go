package objmap

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// RunInfo is a committed run: where its extent is and which chain blocks it holds.
type RunInfo struct {
	ID         RunID
	Generation uint64 // epoch of the store open that wrote it
	File       int    // home pool file index (see Map.Files): its header is here; the run spans File's stripe group (Layout)
	Offset     int64  // extent start (BlockBytes-aligned), the same in every file the run spans; the header is here in File
	Length     int64  // extent length in each of those files: Layout.RunBytes(len(Chain))
	Chain      []uint64
	// Parent is the chain id the run's first block follows (HasParent false
	// for a run that starts a prefix), so the prefix index can be rebuilt
	// from the runs alone; it is journaled with the commit, atomically.
	Parent    uint64
	HasParent bool
	// Kept is how many leading chunks of Chain the run still serves:
	// len(Chain) when committed, less once Map.Trim cut its tail (blocks
	// its owner evicted or discarded). The chunks past Kept are not served
	// again; their bytes stay on disk, unchanged, until the run is freed.
	Kept int
	// ChunkCRCs are the CRC32C of each (layer, chunk), layer-major
	// (ChunkCRCs[l*Chunks()+c]; LayerChunkCRCs(l) is layer l's), from the
	// run's verified chunk table: filled by Commit and by recovery (which
	// reads header and table in one read), not journaled. Read-only. A
	// caller keeping them in RAM pays 4 bytes per (layer, chunk): 4 B per
	// 2 MiB for Llama-3-70B at 512-token chunks.
	ChunkCRCs []uint32
	// LayerCRCs are the per-layer CRC32C of whole objects from the run's
	// verified header (derived from ChunkCRCs; filled with them). Read-only.
	LayerCRCs []uint32
}

// Chunks is the number of chain blocks in the run.
func (r *RunInfo) Chunks() int { return len(r.Chain) }

// RecordType is the kind of a journal (or checkpoint) record.
type RecordType uint8

const (
	// RecCommit commits a run (RunInfo).
	RecCommit RecordType = 1 + iota
	// RecFree frees a run (ID).
	RecFree
	// RecSegment opens a journal segment: Seq is its number. It is the
	// checkpoint marker: segment Seq follows the checkpoint that named it.
	RecSegment
	// RecEpoch records a store open (Epoch); headers carry it as generation.
	RecEpoch
	// RecCheckpoint heads a checkpoint: Seq (the segment that follows it),
	// Epoch, NextID and Count (the runs that follow).
	RecCheckpoint
	// RecCheckpointEnd closes a checkpoint: Count again, so a short file is caught.
	RecCheckpointEnd
	// RecTrim cuts a run to its first Keep chunks (ID, Keep): the rest is no
	// longer served. In a checkpoint it follows its run's commit record.
	// Stores whose journal may hold it have manifest version 2.
	RecTrim
	maxRecordType = RecTrim
)

func (t RecordType) String() string {
	switch t {
	case RecCommit:
		return "commit"
	case RecFree:
		return "free"
	case RecSegment:
		return "segment"
	case RecEpoch:
		return "epoch"
	case RecCheckpoint:
		return "checkpoint"
	case RecCheckpointEnd:
		return "checkpoint-end"
	case RecTrim:
		return "trim"
	}
	return fmt.Sprintf("RecordType(%d)", uint8(t))
}

// Record is one decoded journal record; which fields are meaningful depends on Type.
type Record struct {
	Type   RecordType
	Run    RunInfo // RecCommit
	ID     RunID   // RecFree, RecTrim
	Keep   int     // RecTrim: the leading chunks the run keeps (at least 1)
	Seq    uint64  // RecSegment, RecCheckpoint
	Epoch  uint64  // RecEpoch, RecCheckpoint
	NextID RunID   // RecCheckpoint
	Count  uint64  // RecCheckpoint, RecCheckpointEnd
}

// Record framing: [u32 body length][u32 CRC32C of (length bytes, body)][body],
// body = [u8 type][payload]. The CRC covers the length so that a corrupted
// length is caught rather than trusted.
const (
	recordFrameBytes = 8
	// MaxRecordBytes bounds one record's body: a commit of MaxRunChunks chain
	// ids is about 4 KiB, so anything above 64 KiB is garbage.
	MaxRecordBytes = 64 << 10
	maxRecordChain = (MaxRecordBytes - 64) / 8
	commitFixed    = 1 + 8 + 8 + 4 + 8 + 8 + 4 + 8 + 4
)

// Decode errors. ErrTruncatedRecord means the bytes end inside a record (a
// torn tail); ErrBadRecord means the bytes there are not a valid record.
var (
	ErrTruncatedRecord = errors.New("objmap: truncated journal record")
	ErrBadRecord       = errors.New("objmap: bad journal record")
)

// AppendRecord appends r's encoding to dst.
func AppendRecord(dst []byte, r *Record) ([]byte, error) {
	start := len(dst)
	dst = append(dst, make([]byte, recordFrameBytes)...)
	dst = append(dst, byte(r.Type))
	le := binary.LittleEndian
	switch r.Type {
	case RecCommit:
		if len(r.Run.Chain) == 0 || len(r.Run.Chain) > maxRecordChain {
			return dst[:start], fmt.Errorf("objmap: encoding commit of run %d: %d chain ids, want 1..%d", r.Run.ID, len(r.Run.Chain), maxRecordChain)
		}
		if r.Run.File < 0 || r.Run.File > 1<<31-1 || r.Run.Offset < 0 || r.Run.Length < 0 {
			return dst[:start], fmt.Errorf("objmap: encoding commit of run %d: bad extent file %d [%d,+%d)", r.Run.ID, r.Run.File, r.Run.Offset, r.Run.Length)
		}
		dst = le.AppendUint64(dst, uint64(r.Run.ID))
		dst = le.AppendUint64(dst, r.Run.Generation)
		dst = le.AppendUint32(dst, uint32(r.Run.File))
		dst = le.AppendUint64(dst, uint64(r.Run.Offset))
		dst = le.AppendUint64(dst, uint64(r.Run.Length))
		dst = le.AppendUint32(dst, uint32(len(r.Run.Chain)))
		dst = le.AppendUint64(dst, r.Run.Parent)
		var flags uint32
		if r.Run.HasParent {
			flags = 1
		}
		dst = le.AppendUint32(dst, flags)
		for _, id := range r.Run.Chain {
			dst = le.AppendUint64(dst, id)
		}
	case RecFree:
		dst = le.AppendUint64(dst, uint64(r.ID))
	case RecTrim:
		if r.Keep < 1 || r.Keep > maxRecordChain {
			return dst[:start], fmt.Errorf("objmap: encoding trim of run %d to %d chunks, want 1..%d", r.ID, r.Keep, maxRecordChain)
		}
		dst = le.AppendUint64(dst, uint64(r.ID))
		dst = le.AppendUint32(dst, uint32(r.Keep))
	case RecSegment:
		dst = le.AppendUint64(dst, r.Seq)
	case RecEpoch:
		dst = le.AppendUint64(dst, r.Epoch)
	case RecCheckpoint:
		dst = le.AppendUint64(dst, r.Seq)
		dst = le.AppendUint64(dst, r.Epoch)
		dst = le.AppendUint64(dst, uint64(r.NextID))
		dst = le.AppendUint64(dst, r.Count)
	case RecCheckpointEnd:
		dst = le.AppendUint64(dst, r.Count)
	default:
		return dst[:start], fmt.Errorf("objmap: encoding record of unknown type %d", r.Type)
	}
	body := len(dst) - start - recordFrameBytes
	le.PutUint32(dst[start:], uint32(body))
	le.PutUint32(dst[start+4:], recordCRC(dst[start:start+4], dst[start+recordFrameBytes:]))
	return dst, nil
}

func recordCRC(lenBytes, body []byte) uint32 {
	return UpdateCRC32C(CRC32C(lenBytes), body)
}

// DecodeRecord decodes the record at the start of src and returns it with its
// encoded size. It never panics: a record cut short is ErrTruncatedRecord,
// anything else invalid is ErrBadRecord.
func DecodeRecord(src []byte) (Record, int, error) {
	le := binary.LittleEndian
	if len(src) < recordFrameBytes {
		return Record{}, 0, fmt.Errorf("%w: %d bytes left, frame is %d", ErrTruncatedRecord, len(src), recordFrameBytes)
	}
	n := int(le.Uint32(src))
	if n < 1 || n > MaxRecordBytes {
		return Record{}, 0, fmt.Errorf("%w: body length %d, want 1..%d", ErrBadRecord, n, MaxRecordBytes)
	}
	if len(src) < recordFrameBytes+n {
		return Record{}, 0, fmt.Errorf("%w: %d bytes left, record is %d", ErrTruncatedRecord, len(src), recordFrameBytes+n)
	}
	body := src[recordFrameBytes : recordFrameBytes+n]
	if got, want := le.Uint32(src[4:]), recordCRC(src[:4], body); got != want {
		return Record{}, 0, fmt.Errorf("%w: CRC %08x, computed %08x", ErrBadRecord, got, want)
	}
	r := Record{Type: RecordType(body[0])}
	p := body[1:]
	need := func(k int) error {
		if len(p) != k {
			return fmt.Errorf("%w: %s payload of %d bytes, want %d", ErrBadRecord, r.Type, len(p), k)
		}
		return nil
	}
	switch r.Type {
	case RecCommit:
		if len(p) < commitFixed-1 {
			return Record{}, 0, fmt.Errorf("%w: commit payload of %d bytes, want at least %d", ErrBadRecord, len(p), commitFixed-1)
		}
		chunks := int(le.Uint32(p[36:]))
		if chunks < 1 || chunks > maxRecordChain {
			return Record{}, 0, fmt.Errorf("%w: commit of %d chunks, want 1..%d", ErrBadRecord, chunks, maxRecordChain)
		}
		if err := need(commitFixed - 1 + 8*chunks); err != nil {
			return Record{}, 0, err
		}
		file, off, length := le.Uint32(p[16:]), le.Uint64(p[20:]), le.Uint64(p[28:])
		if file > 1<<31-1 || off > 1<<62 || length > 1<<62 {
			return Record{}, 0, fmt.Errorf("%w: commit extent file %d [%d,+%d) out of range", ErrBadRecord, file, off, length)
		}
		flags := le.Uint32(p[48:])
		if flags > 1 {
			return Record{}, 0, fmt.Errorf("%w: commit flags %#x", ErrBadRecord, flags)
		}
		r.Run = RunInfo{ID: RunID(le.Uint64(p)), Generation: le.Uint64(p[8:]), File: int(file),
			Offset: int64(off), Length: int64(length), Chain: make([]uint64, chunks),
			Parent: le.Uint64(p[40:]), HasParent: flags == 1, Kept: chunks}
		for i := range r.Run.Chain {
			r.Run.Chain[i] = le.Uint64(p[52+8*i:])
		}
	case RecFree:
		if err := need(8); err != nil {
			return Record{}, 0, err
		}
		r.ID = RunID(le.Uint64(p))
	case RecTrim:
		if err := need(12); err != nil {
			return Record{}, 0, err
		}
		r.ID, r.Keep = RunID(le.Uint64(p)), int(le.Uint32(p[8:]))
		if r.Keep < 1 || r.Keep > maxRecordChain {
			return Record{}, 0, fmt.Errorf("%w: trim of run %d to %d chunks, want 1..%d", ErrBadRecord, r.ID, r.Keep, maxRecordChain)
		}
	case RecSegment, RecEpoch, RecCheckpointEnd:
		if err := need(8); err != nil {
			return Record{}, 0, err
		}
		v := le.Uint64(p)
		switch r.Type {
		case RecSegment:
			r.Seq = v
		case RecEpoch:
			r.Epoch = v
		default:
			r.Count = v
		}
	case RecCheckpoint:
		if err := need(32); err != nil {
			return Record{}, 0, err
		}
		r.Seq, r.Epoch, r.NextID, r.Count = le.Uint64(p), le.Uint64(p[8:]), RunID(le.Uint64(p[16:])), le.Uint64(p[24:])
	default:
		return Record{}, 0, fmt.Errorf("%w: unknown type %d", ErrBadRecord, body[0])
	}
	return r, recordFrameBytes + n, nil
}
