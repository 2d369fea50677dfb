package objmap

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/uring"
)

// checkPieceBytes bounds the memory Check reads
// through; it also holds the largest header region (under 400 KiB).
const checkPieceBytes = 1 << 20

// Check verifies every served run in full: its header and chunk table again,
// every chunk of every object against the table, and each object's CRC
// (combined from its chunks) against the header. It returns the recovery
// report with Corrupt filled in. It only reads; the caller decides what to
// do with corrupt runs (fsck reports them, the runtime may Free them). A
// run freed while Check reads it is skipped, not reported.
func (m *Map) Check() (RecoveryReport, error) {
	rep := m.Recovery()
	rep.PayloadChecked = true
	var list []RunInfo
	m.Runs(func(r RunInfo) bool { list = append(list, r); return true })
	buf, err := uring.AllocBuffer(checkPieceBytes)
	if err != nil {
		return rep, fmt.Errorf("objmap: check: %w", err)
	}
	defer buf.Free()
	for i := range list {
		r := &list[i]
		why := m.verifyRun(r, buf.Bytes()).why
		if why == "" {
			continue
		}
		if cur, ok := m.Lookup(r.ID); !ok || cur.Offset != r.Offset {
			continue
		}
		rep.CorruptRuns = append(rep.CorruptRuns, Problem{Run: r.ID, File: r.File, Offset: r.Offset, Reason: why})
	}
	rep.Corrupt = len(rep.CorruptRuns)
	return rep, nil
}

// verifyRun is checkHeader plus the payload: every chunk of every object
// against the chunk table and each object's CRC against the header (buf
// must hold HeaderRegionBytes(r.Chunks()) and at least one block).
func (m *Map) verifyRun(r *RunInfo, buf []byte) runCheck {
	h, table, why, io := m.checkHeader(r, buf)
	if why != "" {
		return runCheck{why: why, io: io}
	}
	n := r.Chunks()
	got, err := m.readChunkCRCs(r.Place(), buf)
	if err != nil {
		return runCheck{why: err.Error(), io: errors.Is(err, errRead)}
	}
	for i, c := range got {
		if c != table[i] {
			return runCheck{why: (&ChunkCRCError{Layer: i / n, Chunk: i % n, Got: c, Want: table[i]}).Error()}
		}
	}
	layers, err := LayerCRCsFromChunks(m.g, got, n)
	if err != nil {
		return runCheck{why: err.Error()}
	}
	for l, c := range layers {
		if c != h.LayerCRCs[l] {
			return runCheck{why: fmt.Sprintf("layer %d CRC32C %08x, header says %08x", l, c, h.LayerCRCs[l])}
		}
	}
	return runCheck{crcs: runCRCs{chunks: table, layers: h.LayerCRCs}}
}

// errRead marks a payload read that failed (not a mismatch).
var errRead = errors.New("read failed")

// readChunkCRCs reads every object of the run at p, each where the Layout
// puts it, through buf (BlockBytes-aligned pieces) and returns the CRC32C
// of each (layer, chunk), layer-major.
func (m *Map) readChunkCRCs(p Place, buf []byte) ([]uint32, error) {
	piece := int64(len(buf)) &^ (BlockBytes - 1)
	if piece == 0 {
		return nil, fmt.Errorf("objmap: read buffer of %d bytes", len(buf))
	}
	chunks := p.Chunks
	out := make([]uint32, m.g.Layers*chunks)
	for l := 0; l < m.g.Layers; l++ {
		obj, err := m.lay.Where(p, l, 0)
		if err != nil {
			return nil, err
		}
		f := m.files[obj.File]
		layer := out[l*chunks : (l+1)*chunks]
		for done := int64(0); done < ObjectBytes(m.g, chunks); {
			n := min(ObjectBytes(m.g, chunks)-done, piece)
			if err := preadFull(int(f.FD), buf[:alignUp(n)], obj.Offset+done); err != nil {
				return nil, fmt.Errorf("%w: reading layer %d at %s offset %d: %v", errRead, l, f.Path, obj.Offset+done, err)
			}
			if err := UpdateChunkCRCs(m.g, layer, done, buf[:n]); err != nil {
				return nil, err
			}
			done += n
		}
	}
	return out, nil
}
