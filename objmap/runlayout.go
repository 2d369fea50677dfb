package objmap

import (
	"encoding/binary"
	"fmt"
	"hash/crc64"

	"github.com/tutti-io/tutti/kvshape"
)

// checkGeometry is the geometry's own rules (kvshape) and the one a store
// adds: a run header holds at least one chain id beside one CRC per layer.
func checkGeometry(g kvshape.Geometry) error {
	if err := g.Validate(); err != nil {
		return err
	}
	if MaxRunChunks(g) < 1 {
		return fmt.Errorf("%w: Layers = %d leaves no room for a chain id in the %d-byte header", kvshape.ErrGeometry, g.Layers, HeaderBytes)
	}
	return nil
}

// fingerprintVersion is mixed into the fingerprint so that a change of the
// on-disk object layout (not only of the shape) invalidates old stores.
const fingerprintVersion = 1

var crc64Table = crc64.MakeTable(crc64.ECMA)

// Fingerprint is a stable hash over every field of g (and the object
// layout version). It is stored in each run header and in the manifest: a store
// written for another shape, dtype or block size is never served.
func Fingerprint(g kvshape.Geometry) uint64 {
	var b [8 * 8]byte
	for i, v := range []uint64{fingerprintVersion, uint64(g.Layers), uint64(g.KVHeads), uint64(g.HeadDim),
		uint64(g.DType), uint64(g.Planes), uint64(g.PageTokens), uint64(g.ChunkPages)} {
		binary.LittleEndian.PutUint64(b[i*8:], v)
	}
	return crc64.Checksum(b[:], crc64Table)
}

// Object layout on disk. A run of n chunks (consecutive chain blocks saved
// together) has a header region (header and chunk CRC table) and one object
// per layer; where each lies is the store's Layout (layout.go), the one home
// of placement:
//
//	home file:   [header: HeaderBytes][chunk CRC table: ChunkTableBytes(n)][objects...]
//	other files: [unused: HeaderRegionBytes(n)][objects...]
//
// Object l holds layer l for the whole run, chunk-major, then page, then
// plane: [chunk0: page0 plane0, page0 plane1, page1 plane0, ...][chunk1 ...].
// K and V of a page are stored together so that one read per (layer, run)
// restores both, and the first k chunks of a run are one contiguous read per
// layer. Each object starts on a BlockBytes boundary (padded), so every read
// satisfies O_DIRECT alignment whatever the shape.

// BlockBytes is the alignment of every extent, object and I/O length (O_DIRECT).
const BlockBytes = 4096

func alignUp(n int64) int64 { return (n + BlockBytes - 1) &^ (BlockBytes - 1) }

// ObjectBytes is the payload of one layer of a run of chunks chunks (no padding).
func ObjectBytes(g kvshape.Geometry, chunks int) int64 { return int64(chunks) * g.ChunkBytesPerLayer() }

// ObjectStride is the on-disk size of one object of a run of chunks chunks:
// ObjectBytes rounded up to BlockBytes.
func ObjectStride(g kvshape.Geometry, chunks int) int64 { return alignUp(ObjectBytes(g, chunks)) }

// ChunkTableBytes is the on-disk size of the chunk CRC table of a run of
// chunks chunks: 4 bytes per (layer, chunk), padded to BlockBytes.
func ChunkTableBytes(g kvshape.Geometry, chunks int) int64 { return chunkTableBytes(g.Layers, chunks) }

// HeaderRegionBytes is the header plus the chunk CRC table of a run of
// chunks chunks: what recovery reads, in one read, per run; the objects
// start right after it (in every file the run spans).
func HeaderRegionBytes(g kvshape.Geometry, chunks int) int64 {
	return HeaderBytes + ChunkTableBytes(g, chunks)
}

// MaxFootprint is the most pool bytes a run of chunks chunks of g takes in
// any store (whatever its directories and run width: each of the Width
// files a run spans holds a header region and ceil(Layers/Width) object
// slots; RunWidth keeps the empty slots within a third of the layers):
// what sizing a pool for runs of that length may count on.
func MaxFootprint(g kvshape.Geometry, chunks int) int64 {
	w := int64(min(g.Layers, maxDirs))
	return w*HeaderRegionBytes(g, chunks) + int64(g.Layers+g.Layers/maxSlotWaste)*ObjectStride(g, chunks)
}

// MinSlotFill is the least share of a run's object slots its layers fill
// in any store of g (Layout.SlotFill; RunWidth's bound).
func MinSlotFill(g kvshape.Geometry) float64 {
	return float64(g.Layers) / float64(g.Layers+g.Layers/maxSlotWaste)
}

// ChunkPageOffset is where (chunk, page within the chunk, plane) lies inside
// an object (relative to the object's start); the span is PageBytesPerPlane.
func ChunkPageOffset(g kvshape.Geometry, chunk, page, plane int) (int64, error) {
	if chunk < 0 {
		return 0, fmt.Errorf("objmap: chunk %d: %w", chunk, kvshape.ErrOutOfRange)
	}
	if page < 0 || page >= g.ChunkPages {
		return 0, fmt.Errorf("objmap: page %d of a %d-page chunk: %w", page, g.ChunkPages, kvshape.ErrOutOfRange)
	}
	if plane < 0 || plane >= g.Planes {
		return 0, fmt.Errorf("objmap: plane %d of %d: %w", plane, g.Planes, kvshape.ErrOutOfRange)
	}
	return ((int64(chunk)*int64(g.ChunkPages)+int64(page))*int64(g.Planes) + int64(plane)) * g.PageBytesPerPlane(), nil
}
