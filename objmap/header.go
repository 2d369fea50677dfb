package objmap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/tutti-io/tutti/kvshape"
)

// HeaderBytes is the size of a run header: one O_DIRECT block.
const HeaderBytes = 4096

// HeaderVersion is the run header format version. Version 2 added the
// chunk CRC table after the header (TableCRC in the former reserved word);
// a version 1 header is dropped by recovery like any other bad header.
const HeaderVersion = 2

var headerMagic = [8]byte{'T', 'U', 'T', 'T', 'I', 'R', 'U', 'N'}

// Header layout (little endian):
//
//	0   magic "TUTTIRUN"
//	8   version u32
//	12  layers u32
//	16  geometry fingerprint u64
//	24  generation u64
//	32  run id u64
//	40  file index u32
//	44  chunks u32
//	48  extent offset u64 (self-locating: a header copied elsewhere fails)
//	56  chunk bytes per layer u64
//	64  parent chain id u64
//	72  flags u32 (bit 0: has a parent)
//	76  chunk table CRC32C u32 (see EncodeChunkTable)
//	80  per-layer CRC32C [layers]u32, then chain ids [chunks]u64
//	4092 CRC32C of bytes [0, 4092)
//
// The chunk CRC table (layers x chunks u32) follows at HeaderBytes, padded
// to BlockBytes; header and table are one read (HeaderRegionBytes).
const (
	headerFixedBytes = 80
	headerCRCOffset  = HeaderBytes - 4
)

// MaxRunChunks is the most chunks a run may hold: its chain ids and one CRC
// per layer must fit in the header: 461 chunks for 80 layers, 501 for one,
// 372 for MaxLayers. The chunk table it implies stays small: at most
// 4*Layers*MaxRunChunks bytes (372 KiB at MaxLayers, 144 KiB for 80 layers).
// A longer save is split into several runs by the caller of Allocate
// (Allocate never returns a longer one).
func MaxRunChunks(g kvshape.Geometry) int {
	return (headerCRCOffset - headerFixedBytes - 4*g.Layers) / 8
}

// RunID names a run; ids are assigned by Allocate, increase monotonically and
// are never reused by one store.
type RunID uint64

// Header is the commit record of a run, stored in the run's first block.
type Header struct {
	Fingerprint        uint64
	Generation         uint64
	RunID              RunID
	File               uint32
	Offset             uint64
	ChunkBytesPerLayer uint64
	Parent             uint64 // chain id the first block follows, if HasParent
	HasParent          bool
	// LayerCRCs holds CRC32C (Castagnoli) of each object's payload
	// (ObjectBytes, without padding); its length is the layer count. They
	// are derived from the chunk CRCs (LayerCRCsFromChunks).
	LayerCRCs []uint32
	// TableCRC is the CRC32C of the run's padded chunk CRC table, which
	// follows the header (DecodeChunkTable verifies against it).
	TableCRC uint32
	// Chain holds the chain ids of the run's chunks, in order; its length is
	// the chunk count.
	Chain []uint64
}

// ErrBadHeader is wrapped by every DecodeHeader error.
var ErrBadHeader = errors.New("objmap: bad run header")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C is the checksum used for headers, journal records and objects.
func CRC32C(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// UpdateCRC32C continues a CRC32C over more bytes (objects read in pieces).
func UpdateCRC32C(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

// EncodeHeader writes h into dst[:HeaderBytes] (zero-padded, CRC last).
// dst is the caller's memory, typically the first block of an off-heap
// uring.Buffer that is then written at the run's offset.
func EncodeHeader(dst []byte, h *Header) error {
	if len(dst) < HeaderBytes {
		return fmt.Errorf("objmap: encoding header into %d bytes, need %d", len(dst), HeaderBytes)
	}
	layers, chunks := len(h.LayerCRCs), len(h.Chain)
	if layers < 1 || layers > kvshape.MaxLayers {
		return fmt.Errorf("objmap: encoding header of run %d: %d layer CRCs, want 1..%d", h.RunID, layers, kvshape.MaxLayers)
	}
	if chunks < 1 || chunks > MaxRunChunks(kvshape.Geometry{Layers: layers}) {
		return fmt.Errorf("objmap: encoding header of run %d: %d chain ids, want 1..%d for %d layers",
			h.RunID, chunks, MaxRunChunks(kvshape.Geometry{Layers: layers}), layers)
	}
	b := dst[:HeaderBytes]
	clear(b)
	copy(b[0:8], headerMagic[:])
	le := binary.LittleEndian
	le.PutUint32(b[8:], HeaderVersion)
	le.PutUint32(b[12:], uint32(layers))
	le.PutUint64(b[16:], h.Fingerprint)
	le.PutUint64(b[24:], h.Generation)
	le.PutUint64(b[32:], uint64(h.RunID))
	le.PutUint32(b[40:], h.File)
	le.PutUint32(b[44:], uint32(chunks))
	le.PutUint64(b[48:], h.Offset)
	le.PutUint64(b[56:], h.ChunkBytesPerLayer)
	le.PutUint64(b[64:], h.Parent)
	if h.HasParent {
		le.PutUint32(b[72:], 1)
	}
	le.PutUint32(b[76:], h.TableCRC)
	p := headerFixedBytes
	for _, c := range h.LayerCRCs {
		le.PutUint32(b[p:], c)
		p += 4
	}
	for _, id := range h.Chain {
		le.PutUint64(b[p:], id)
		p += 8
	}
	le.PutUint32(b[headerCRCOffset:], CRC32C(b[:headerCRCOffset]))
	return nil
}

// DecodeHeader parses and validates a header: size, magic, version, CRC and
// that the counts fit. It never panics on garbage. It does not compare the
// header with what the journal expects (see Header.Matches).
func DecodeHeader(src []byte) (Header, error) {
	if len(src) < HeaderBytes {
		return Header{}, fmt.Errorf("%w: %d bytes, need %d", ErrBadHeader, len(src), HeaderBytes)
	}
	b := src[:HeaderBytes]
	if [8]byte(b[0:8]) != headerMagic {
		return Header{}, fmt.Errorf("%w: bad magic %q", ErrBadHeader, b[0:8])
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[headerCRCOffset:]), CRC32C(b[:headerCRCOffset]); got != want {
		return Header{}, fmt.Errorf("%w: header CRC %08x, computed %08x", ErrBadHeader, got, want)
	}
	if v := le.Uint32(b[8:]); v != HeaderVersion {
		return Header{}, fmt.Errorf("%w: version %d, want %d", ErrBadHeader, v, HeaderVersion)
	}
	layers := int(le.Uint32(b[12:]))
	if layers < 1 || layers > kvshape.MaxLayers {
		return Header{}, fmt.Errorf("%w: %d layers, want 1..%d", ErrBadHeader, layers, kvshape.MaxLayers)
	}
	chunks := int(le.Uint32(b[44:]))
	if maxc := MaxRunChunks(kvshape.Geometry{Layers: layers}); chunks < 1 || chunks > maxc {
		return Header{}, fmt.Errorf("%w: %d chunks, want 1..%d for %d layers", ErrBadHeader, chunks, maxc, layers)
	}
	flags := le.Uint32(b[72:])
	if flags > 1 {
		return Header{}, fmt.Errorf("%w: flags %#x", ErrBadHeader, flags)
	}
	h := Header{
		Parent:             le.Uint64(b[64:]),
		HasParent:          flags == 1,
		Fingerprint:        le.Uint64(b[16:]),
		Generation:         le.Uint64(b[24:]),
		RunID:              RunID(le.Uint64(b[32:])),
		File:               le.Uint32(b[40:]),
		Offset:             le.Uint64(b[48:]),
		ChunkBytesPerLayer: le.Uint64(b[56:]),
		TableCRC:           le.Uint32(b[76:]),
		LayerCRCs:          make([]uint32, layers),
		Chain:              make([]uint64, chunks),
	}
	p := headerFixedBytes
	for i := range h.LayerCRCs {
		h.LayerCRCs[i] = le.Uint32(b[p:])
		p += 4
	}
	for i := range h.Chain {
		h.Chain[i] = le.Uint64(b[p:])
		p += 8
	}
	for _, x := range b[p:headerCRCOffset] {
		if x != 0 {
			return Header{}, fmt.Errorf("%w: nonzero padding after the chain ids", ErrBadHeader)
		}
	}
	return h, nil
}

// Matches reports why a decoded header is not the one the journal committed
// for run (nil if it is): fingerprint, generation, run id, location, shape
// and chain ids must all agree.
func (h *Header) Matches(g kvshape.Geometry, run *RunInfo) error {
	switch {
	case h.Fingerprint != Fingerprint(g):
		return fmt.Errorf("geometry fingerprint %016x, store %016x", h.Fingerprint, Fingerprint(g))
	case h.RunID != run.ID:
		return fmt.Errorf("run id %d, journal %d", h.RunID, run.ID)
	case h.Generation != run.Generation:
		return fmt.Errorf("generation %d, journal %d", h.Generation, run.Generation)
	case h.File != uint32(run.File) || h.Offset != uint64(run.Offset):
		return fmt.Errorf("located at file %d offset %d, journal file %d offset %d", h.File, h.Offset, run.File, run.Offset)
	case len(h.LayerCRCs) != g.Layers:
		return fmt.Errorf("%d layers, geometry %d", len(h.LayerCRCs), g.Layers)
	case h.ChunkBytesPerLayer != uint64(g.ChunkBytesPerLayer()):
		return fmt.Errorf("chunk bytes per layer %d, geometry %d", h.ChunkBytesPerLayer, g.ChunkBytesPerLayer())
	case h.HasParent != run.HasParent || h.Parent != run.Parent:
		return fmt.Errorf("parent %016x (set %v), journal %016x (set %v)", h.Parent, h.HasParent, run.Parent, run.HasParent)
	case len(h.Chain) != len(run.Chain):
		return fmt.Errorf("%d chunks, journal %d", len(h.Chain), len(run.Chain))
	}
	for i, id := range h.Chain {
		if id != run.Chain[i] {
			return fmt.Errorf("chain id %d is %016x, journal %016x", i, id, run.Chain[i])
		}
	}
	return nil
}
