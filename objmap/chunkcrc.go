package objmap

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/kvshape"
)

// Per-chunk checksums.
//
// Every run stores one CRC32C per (layer, chunk) in a table right after its
// header (see HeaderRegionBytes), so a restore of the first k
// chunks reads exactly those chunks of each object and verifies each one;
// with one CRC per object it had to read the whole object. The header
// records the table's CRC (Header.TableCRC) and stays the commit record; it
// also keeps each object's whole-payload CRC (Header.LayerCRCs), derived from
// the chunk CRCs by CRC combination (CombineCRC32C), so the two never
// disagree and a whole-object read can still be verified with one CRC.
//
// Table layout: u32 little endian, layer-major: entry l*chunks+c is CRC32C of
// chunk c of object l (the ChunkBytesPerLayer bytes at Layout.Where(run, l,
// c)), zero-padded to BlockBytes. The table CRC is CRC32C of
// the whole padded region.
//
// Memory: a caller that keeps a run's chunk CRCs in RAM (RunInfo.ChunkCRCs)
// pays 4 bytes per (layer, chunk): for Llama-3-70B (80 layers, 8 KV heads,
// head dim 128, bf16, K and V) at 512-token chunks, 4 B per 2 MiB of payload,
// i.e. 320 B per chunk of 160 MiB.

// ErrBadChunkTable is wrapped by every DecodeChunkTable error.
var ErrBadChunkTable = errors.New("objmap: bad chunk CRC table")

// ErrChunkCRC is wrapped (by *ChunkCRCError) when payload bytes do not match
// their chunk's CRC32C.
var ErrChunkCRC = errors.New("objmap: chunk CRC32C mismatch")

// ChunkCRCError names the chunk that failed verification.
type ChunkCRCError struct {
	Layer, Chunk int // chunk index within the run
	Got, Want    uint32
}

func (e *ChunkCRCError) Error() string {
	return fmt.Sprintf("objmap: layer %d chunk %d: CRC32C %08x, table says %08x", e.Layer, e.Chunk, e.Got, e.Want)
}

// Unwrap makes errors.Is(err, ErrChunkCRC) hold.
func (e *ChunkCRCError) Unwrap() error { return ErrChunkCRC }

// chunkTableBytes is the padded on-disk size of the table of layers x chunks.
func chunkTableBytes(layers, chunks int) int64 { return alignUp(4 * int64(layers) * int64(chunks)) }

// checkTableShape bounds a table's shape as the header bounds it.
func checkTableShape(layers, chunks int) error {
	if layers < 1 || layers > kvshape.MaxLayers {
		return fmt.Errorf("%d layers, want 1..%d", layers, kvshape.MaxLayers)
	}
	if maxc := MaxRunChunks(kvshape.Geometry{Layers: layers}); chunks < 1 || chunks > maxc {
		return fmt.Errorf("%d chunks, want 1..%d for %d layers", chunks, maxc, layers)
	}
	return nil
}

// EncodeChunkTable writes the chunk CRCs of a run of layers x chunks
// (layer-major, len layers*chunks) into dst[:chunkTableBytes], zero-padded,
// and returns the table CRC to put in the header (Header.TableCRC).
func EncodeChunkTable(dst []byte, layers, chunks int, crcs []uint32) (uint32, error) {
	if err := checkTableShape(layers, chunks); err != nil {
		return 0, fmt.Errorf("objmap: encoding chunk table: %w", err)
	}
	if len(crcs) != layers*chunks {
		return 0, fmt.Errorf("objmap: encoding chunk table: %d CRCs for %d layers x %d chunks", len(crcs), layers, chunks)
	}
	n := chunkTableBytes(layers, chunks)
	if int64(len(dst)) < n {
		return 0, fmt.Errorf("objmap: encoding chunk table into %d bytes, need %d", len(dst), n)
	}
	b := dst[:n]
	for i, c := range crcs {
		binary.LittleEndian.PutUint32(b[4*i:], c)
	}
	clear(b[4*len(crcs):])
	return CRC32C(b), nil
}

// DecodeChunkTable parses and verifies the chunk table of a run of layers x
// chunks at the start of src against wantCRC (the header's TableCRC). The
// padding must be zero. It never panics on garbage; the result is a new
// slice, layer-major.
func DecodeChunkTable(src []byte, layers, chunks int, wantCRC uint32) ([]uint32, error) {
	if err := checkTableShape(layers, chunks); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadChunkTable, err)
	}
	n := chunkTableBytes(layers, chunks)
	if int64(len(src)) < n {
		return nil, fmt.Errorf("%w: %d bytes, need %d", ErrBadChunkTable, len(src), n)
	}
	b := src[:n]
	if got := CRC32C(b); got != wantCRC {
		return nil, fmt.Errorf("%w: CRC %08x, header says %08x", ErrBadChunkTable, got, wantCRC)
	}
	entries := layers * chunks
	for _, x := range b[4*entries:] {
		if x != 0 {
			return nil, fmt.Errorf("%w: nonzero padding", ErrBadChunkTable)
		}
	}
	out := make([]uint32, entries)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out, nil
}

// CombineCRC32C returns CRC32C(A || B) from crcA = CRC32C(A), crcB =
// CRC32C(B) and lenB = len(B), without the bytes (zlib's crc32_combine for
// the Castagnoli polynomial). Cost: O(log lenB) 32x32 bit-matrix products.
func CombineCRC32C(crcA, crcB uint32, lenB int64) uint32 {
	if lenB <= 0 {
		return crcA ^ crcB // crcB is 0 for empty B
	}
	op := zerosOperator(lenB)
	return gf2Times(&op, crcA) ^ crcB
}

// gf2Times multiplies the 32x32 GF(2) matrix mat (column i = image of bit i)
// by vec.
func gf2Times(mat *[32]uint32, vec uint32) uint32 {
	var sum uint32
	for i := 0; vec != 0; i, vec = i+1, vec>>1 {
		if vec&1 != 0 {
			sum ^= mat[i]
		}
	}
	return sum
}

// gf2Compose returns a∘b.
func gf2Compose(a, b *[32]uint32) [32]uint32 {
	var out [32]uint32
	for i := range out {
		out[i] = gf2Times(a, b[i])
	}
	return out
}

// zerosOperator is the linear map that advances a raw (reflected) CRC32C
// register over n zero bytes: CRC32C(A||B) = op(CRC32C(A)) ^ CRC32C(B) for
// len(B) = n (the pre and post inversions cancel).
func zerosOperator(n int64) [32]uint32 {
	var bit [32]uint32  // one zero bit
	bit[0] = 0x82f63b78 // Castagnoli, reflected
	for i := 1; i < 32; i++ {
		bit[i] = 1 << (i - 1)
	}
	op := bit
	for range 3 { // 8 bits: one zero byte
		op = gf2Compose(&op, &op)
	}
	var acc [32]uint32
	for i := range acc {
		acc[i] = 1 << i
	}
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			acc = gf2Compose(&op, &acc)
		}
		op = gf2Compose(&op, &op)
	}
	return acc
}

// CRCShift is CombineCRC32C for one length of B, made once (a zerosOperator
// in byte-indexed tables): four lookups per combination, for the many
// combinations of one length (a chunk, a page plane). It is read-only once
// made: goroutines may share it.
type CRCShift [4][256]uint32

// NewCRCShift makes the CRCShift of B's of n bytes (n > 0).
func NewCRCShift(n int64) *CRCShift {
	op := zerosOperator(n)
	s := new(CRCShift)
	for b := range 4 {
		for v := range 256 {
			s[b][v] = gf2Times(&op, uint32(v)<<(8*b))
		}
	}
	return s
}

// Combine is CombineCRC32C(crcA, crcB, n) for the n s was made for.
func (s *CRCShift) Combine(crcA, crcB uint32) uint32 {
	return s[0][crcA&0xff] ^ s[1][crcA>>8&0xff] ^ s[2][crcA>>16&0xff] ^ s[3][crcA>>24] ^ crcB
}

// LayerCRCsFromChunks derives each object's whole-payload CRC32C (what the
// header stores) from the chunk CRCs of a run of chunks chunks (layer-major,
// len Layers*chunks).
func LayerCRCsFromChunks(g kvshape.Geometry, chunkCRCs []uint32, chunks int) ([]uint32, error) {
	if chunks < 1 || len(chunkCRCs) != g.Layers*chunks {
		return nil, fmt.Errorf("objmap: %d chunk CRCs for %d layers x %d chunks", len(chunkCRCs), g.Layers, chunks)
	}
	sh := NewCRCShift(g.ChunkBytesPerLayer())
	out := make([]uint32, g.Layers)
	for l := range out {
		var crc uint32
		for _, c := range chunkCRCs[l*chunks : (l+1)*chunks] {
			crc = sh.Combine(crc, c)
		}
		out[l] = crc
	}
	return out, nil
}

// UpdateChunkCRCs continues the chunk CRCs of one object (crcs[c] is chunk
// c's running CRC32C, e.g. a writer's layer slice of the ChunkCRCs it will
// commit, zero to start) over payload bytes p that start at payload offset
// off of the object. Pieces may cut chunks anywhere; each chunk's bytes must
// arrive in order (as for any running CRC; the caller tracks that). Bytes
// past len(crcs) chunks are an error and change nothing.
func UpdateChunkCRCs(g kvshape.Geometry, crcs []uint32, off int64, p []byte) error {
	cb := g.ChunkBytesPerLayer()
	if off < 0 || cb < 1 || off+int64(len(p)) > int64(len(crcs))*cb {
		return fmt.Errorf("objmap: payload [%d,+%d) outside %d chunks of %d bytes: %w", off, len(p), len(crcs), cb, kvshape.ErrOutOfRange)
	}
	for len(p) > 0 {
		c := off / cb
		n := min(int64(len(p)), (c+1)*cb-off)
		crcs[c] = UpdateCRC32C(crcs[c], p[:n])
		p, off = p[n:], off+n
	}
	return nil
}

// Span is one read of chunks [First, First+K) of one layer's object
// (Layout.Span).
type Span struct {
	Layer, First, K int
	// Device and File are where the layer's object lies (Layout.Where);
	// Off is the read's offset in the file and IOBytes its length, both
	// BlockBytes-aligned: the read stays inside the object (its padding
	// included) and holds chunks [First, First+K) plus less than
	// BlockBytes of alignment slack on each side.
	Device, File int
	Off, IOBytes int64
	// Skip is where chunk First starts inside the read buffer (0 unless
	// First*ChunkBytesPerLayer is unaligned); DataBytes = K*ChunkBytesPerLayer
	// payload bytes follow it.
	Skip, DataBytes int64
	// ChunkBytes is ChunkBytesPerLayer.
	ChunkBytes int64
}

// Chunk is where chunk First+i lies inside the read buffer: [off, off+n).
func (s Span) Chunk(i int) (off, n int64) { return s.Skip + int64(i)*s.ChunkBytes, s.ChunkBytes }

// LayerChunkCRCs is the chunk CRCs of one layer of the run (a view of
// ChunkCRCs, read-only); nil when layer is out of range or the CRCs are
// not known.
func (r *RunInfo) LayerChunkCRCs(layer int) []uint32 {
	n := len(r.Chain)
	if layer < 0 || n == 0 || len(r.ChunkCRCs) < (layer+1)*n {
		return nil
	}
	return r.ChunkCRCs[layer*n : (layer+1)*n : (layer+1)*n]
}

// VerifySpan checks every chunk of a completed read of s (buf holds the
// IOBytes read at s.Off) against the run's chunk CRCs. The error is a
// *ChunkCRCError for the first bad chunk (errors.Is ErrChunkCRC).
func (r *RunInfo) VerifySpan(s Span, buf []byte) error {
	v, err := r.NewChunkVerifier(s)
	if err != nil {
		return err
	}
	if int64(len(buf)) < s.Skip+s.DataBytes {
		return fmt.Errorf("objmap: verifying run %d layer %d: %d bytes read, span needs %d", r.ID, s.Layer, len(buf), s.Skip+s.DataBytes)
	}
	if err := v.Update(buf[s.Skip : s.Skip+s.DataBytes]); err != nil {
		return err
	}
	return v.Done()
}

// ChunkVerifier checks chunks [First, First+K) of one layer of a run as
// their payload bytes arrive in order, in pieces of any size (a staging
// slot may end inside a chunk). It allocates nothing; keep one per (layer,
// run) read in flight.
type ChunkVerifier struct {
	want       []uint32 // want[i] is chunk first+i
	layer      int
	first      int
	chunkBytes int64
	i          int   // chunk being accumulated (index into want)
	have       int64 // bytes of it seen
	crc        uint32
}

// NewChunkVerifier starts verifying the chunks of s against r.ChunkCRCs.
func (r *RunInfo) NewChunkVerifier(s Span) (ChunkVerifier, error) {
	v, err := NewChunkVerifier(r.LayerChunkCRCs(s.Layer), s)
	if err != nil {
		return ChunkVerifier{}, fmt.Errorf("verifying run %d: %w", r.ID, err)
	}
	return v, nil
}

// NewChunkVerifier starts verifying the chunks of s against layerCRCs, the
// chunk CRCs of s.Layer of the whole run (len = the run's chunk count), for
// a caller that keeps CRCs in its own structures rather than a RunInfo.
func NewChunkVerifier(layerCRCs []uint32, s Span) (ChunkVerifier, error) {
	if s.First < 0 || s.K < 1 || s.First+s.K > len(layerCRCs) || s.ChunkBytes < 1 {
		return ChunkVerifier{}, fmt.Errorf("objmap: verifying layer %d chunks [%d,+%d) against %d chunk CRCs: %w",
			s.Layer, s.First, s.K, len(layerCRCs), kvshape.ErrOutOfRange)
	}
	return ChunkVerifier{want: layerCRCs[s.First : s.First+s.K], layer: s.Layer, first: s.First, chunkBytes: s.ChunkBytes}, nil
}

// Update feeds the next payload bytes (padding excluded). It returns a
// *ChunkCRCError as soon as a chunk completed in p is wrong, and an error
// if p runs past the last chunk.
func (v *ChunkVerifier) Update(p []byte) error {
	for len(p) > 0 {
		if v.i >= len(v.want) {
			return fmt.Errorf("objmap: %d payload bytes past chunk %d of layer %d: %w", len(p), v.first+len(v.want)-1, v.layer, kvshape.ErrOutOfRange)
		}
		n := min(int64(len(p)), v.chunkBytes-v.have)
		v.crc = UpdateCRC32C(v.crc, p[:n])
		v.have += n
		p = p[n:]
		if v.have == v.chunkBytes {
			if v.crc != v.want[v.i] {
				return &ChunkCRCError{Layer: v.layer, Chunk: v.first + v.i, Got: v.crc, Want: v.want[v.i]}
			}
			v.i, v.have, v.crc = v.i+1, 0, 0
		}
	}
	return nil
}

// Verified is the number of leading chunks of the span verified so far.
func (v *ChunkVerifier) Verified() int { return v.i }

// Done reports an error unless every chunk of the span was fed and verified.
func (v *ChunkVerifier) Done() error {
	if v.i != len(v.want) {
		return fmt.Errorf("objmap: layer %d: %d of %d chunks verified (%d bytes into chunk %d)",
			v.layer, v.i, len(v.want), v.have, v.first+v.i)
	}
	return nil
}
