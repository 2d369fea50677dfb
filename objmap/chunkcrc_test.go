package objmap

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring"
)

func TestCombineCRC32C(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, lens := range [][2]int{{0, 0}, {0, 5}, {5, 0}, {1, 1}, {7, 4096}, {4096, 18432}, {100, 1 << 17}, {3, 2 << 20}} {
		a, b := make([]byte, lens[0]), make([]byte, lens[1])
		for i := range a {
			a[i] = byte(rng.Uint32())
		}
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		want := CRC32C(append(bytes.Clone(a), b...))
		if got := CombineCRC32C(CRC32C(a), CRC32C(b), int64(len(b))); got != want {
			t.Fatalf("lens %v: combine %08x, want %08x", lens, got, want)
		}
		if got := NewCRCShift(int64(len(b))).Combine(CRC32C(a), CRC32C(b)); got != want {
			t.Fatalf("lens %v: table combine %08x, want %08x", lens, got, want)
		}
	}
}

func TestLayerCRCsFromChunks(t *testing.T) {
	g := kvshape.Geometry{Layers: 3, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16, Planes: 1, PageTokens: 16, ChunkPages: 1} // 18432-byte chunks
	const chunks = 4
	rng := rand.New(rand.NewPCG(3, 4))
	var chunkCRCs, want []uint32
	for l := 0; l < g.Layers; l++ {
		obj := make([]byte, ObjectBytes(g, chunks))
		for i := range obj {
			obj[i] = byte(rng.Uint32())
		}
		want = append(want, CRC32C(obj))
		cb := int(g.ChunkBytesPerLayer())
		for c := 0; c < chunks; c++ {
			chunkCRCs = append(chunkCRCs, CRC32C(obj[c*cb:(c+1)*cb]))
		}
	}
	got, err := LayerCRCsFromChunks(g, chunkCRCs, chunks)
	if err != nil || !bytes.Equal(u32bytes(got), u32bytes(want)) {
		t.Fatalf("LayerCRCsFromChunks = %x %v, want %x", got, err, want)
	}
	if _, err := LayerCRCsFromChunks(g, chunkCRCs[1:], chunks); err == nil {
		t.Fatal("short chunk CRCs accepted")
	}
}

func u32bytes(v []uint32) []byte {
	var b []byte
	for _, x := range v {
		b = append(b, byte(x), byte(x>>8), byte(x>>16), byte(x>>24))
	}
	return b
}

func sampleTable(layers, chunks int) []uint32 {
	crcs := make([]uint32, layers*chunks)
	for i := range crcs {
		crcs[i] = uint32(i)*0x9e3779b9 + 7
	}
	return crcs
}

func TestChunkTableRoundTripAndRejects(t *testing.T) {
	for _, lc := range [][2]int{{1, 1}, {2, 3}, {80, MaxRunChunks(kvshape.Geometry{Layers: 80})}, {kvshape.MaxLayers, MaxRunChunks(kvshape.Geometry{Layers: kvshape.MaxLayers})}} {
		layers, chunks := lc[0], lc[1]
		crcs := sampleTable(layers, chunks)
		buf := make([]byte, chunkTableBytes(layers, chunks)+10)
		for i := range buf {
			buf[i] = 0xaa // the encoder must clear the padding
		}
		tc, err := EncodeChunkTable(buf, layers, chunks, crcs)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeChunkTable(buf, layers, chunks, tc)
		if err != nil || !bytes.Equal(u32bytes(got), u32bytes(crcs)) {
			t.Fatalf("%v: round trip: %v", lc, err)
		}
	}
	if tb := chunkTableBytes(kvshape.MaxLayers, MaxRunChunks(kvshape.Geometry{Layers: kvshape.MaxLayers})); tb+HeaderBytes > checkPieceBytes {
		t.Fatalf("largest header region %d exceeds the check buffer", tb+HeaderBytes)
	}
	layers, chunks := 2, 3
	good := make([]byte, chunkTableBytes(layers, chunks))
	tc, _ := EncodeChunkTable(good, layers, chunks, sampleTable(layers, chunks))
	for name, c := range map[string]struct {
		mut            func(b []byte) []byte
		layers, chunks int
		crc            uint32
	}{
		"entry":      {func(b []byte) []byte { b[5] ^= 1; return b }, layers, chunks, tc},
		"padding":    {func(b []byte) []byte { b[4000] = 1; return b }, layers, chunks, CRC32C(append(bytes.Clone(good[:4000]), append([]byte{1}, good[4001:]...)...))},
		"short":      {func(b []byte) []byte { return b[:100] }, layers, chunks, tc},
		"other crc":  {func(b []byte) []byte { return b }, layers, chunks, tc + 1},
		"no layers":  {func(b []byte) []byte { return b }, 0, chunks, tc},
		"no chunks":  {func(b []byte) []byte { return b }, layers, 0, tc},
		"too many":   {func(b []byte) []byte { return b }, layers, 10000, tc},
		"neg layers": {func(b []byte) []byte { return b }, -1, chunks, tc},
	} {
		b := c.mut(bytes.Clone(good))
		if _, err := DecodeChunkTable(b, c.layers, c.chunks, c.crc); !errors.Is(err, ErrBadChunkTable) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := EncodeChunkTable(good, layers, chunks, sampleTable(layers, chunks)[1:]); err == nil {
		t.Fatal("encoded a short table")
	}
	if _, err := EncodeChunkTable(good[:8], layers, chunks, sampleTable(layers, chunks)); err == nil {
		t.Fatal("encoded into a short buffer")
	}
}

func FuzzChunkTableDecode(f *testing.F) {
	b := make([]byte, chunkTableBytes(2, 3))
	tc, _ := EncodeChunkTable(b, 2, 3, sampleTable(2, 3))
	f.Add(b, uint16(2), uint16(3), tc)
	f.Add(make([]byte, BlockBytes), uint16(1), uint16(1), CRC32C(make([]byte, BlockBytes)))
	f.Add([]byte{1, 2, 3}, uint16(0), uint16(0), uint32(0))
	f.Fuzz(func(t *testing.T, data []byte, layers, chunks uint16, crc uint32) {
		crcs, err := DecodeChunkTable(data, int(layers), int(chunks), crc)
		if err != nil {
			if !errors.Is(err, ErrBadChunkTable) {
				t.Fatalf("error does not wrap ErrBadChunkTable: %v", err)
			}
			return
		}
		out := make([]byte, chunkTableBytes(int(layers), int(chunks)))
		got, err := EncodeChunkTable(out, int(layers), int(chunks), crcs)
		if err != nil || got != crc || !bytes.Equal(out, data[:len(out)]) {
			t.Fatalf("valid table does not round-trip: %v", err)
		}
	})
}

func TestChunkSpan(t *testing.T) {
	// 18432-byte chunks: most chunk boundaries are not block-aligned.
	g := kvshape.Geometry{Layers: 2, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16, Planes: 1, PageTokens: 16, ChunkPages: 1}
	const run = 5
	cb := g.ChunkBytesPerLayer()
	for layer := 0; layer < g.Layers; layer++ {
		objOff, _ := objectOffset1(g, run, layer)
		for first := 0; first < run; first++ {
			for k := 1; first+k <= run; k++ {
				s, err := chunkSpan1(g, run, layer, first, k)
				if err != nil {
					t.Fatal(err)
				}
				start, end := objOff+int64(first)*cb, objOff+int64(first+k)*cb
				switch {
				case s.Off%BlockBytes != 0 || s.IOBytes%BlockBytes != 0:
					t.Fatalf("%d,%d,%d: unaligned %+v", layer, first, k, s)
				case s.Off < objOff || s.Off+s.IOBytes > objOff+ObjectStride(g, run):
					t.Fatalf("%d,%d,%d: read outside the object %+v", layer, first, k, s)
				case s.Off > start || start-s.Off >= BlockBytes || s.Off+s.IOBytes < end || s.Off+s.IOBytes-end >= BlockBytes:
					t.Fatalf("%d,%d,%d: read is not the chunks rounded out to blocks %+v", layer, first, k, s)
				case s.Off+s.Skip != start || s.DataBytes != end-start:
					t.Fatalf("%d,%d,%d: skip/data %+v", layer, first, k, s)
				}
				for i := 0; i < k; i++ {
					if off, n := s.Chunk(i); s.Off+off != start+int64(i)*cb || n != cb {
						t.Fatalf("%d,%d,%d: chunk %d at %d+%d", layer, first, k, i, off, n)
					}
				}
				if first == 0 {
					off, io, data, err := layerSpan1(g, run, layer, k)
					if err != nil || off != s.Off || io != s.IOBytes || data != s.DataBytes {
						t.Fatalf("layerSpan1(%d,%d,%d) = %d %d %d %v, ChunkSpan %+v", run, layer, k, off, io, data, err, s)
					}
				}
			}
		}
	}
	for _, a := range [][3]int{{0, -1, 1}, {0, 0, 0}, {0, 4, 2}, {2, 0, 1}, {0, 5, 1}} {
		if _, err := chunkSpan1(g, run, a[0], a[1], a[2]); !errors.Is(err, kvshape.ErrOutOfRange) {
			t.Fatalf("chunkSpan1(%d, %v): %v", run, a, err)
		}
	}
}

func TestChunkVerifier(t *testing.T) {
	g := kvshape.Geometry{Layers: 2, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16, Planes: 1, PageTokens: 16, ChunkPages: 1}
	const run = 4
	seed := uint64(5)
	rng := rand.New(rand.NewPCG(seed, 6))
	cb := int(g.ChunkBytesPerLayer())
	objs := make([][]byte, g.Layers)
	info := RunInfo{ID: 9, Chain: make([]uint64, run)}
	for l := range objs {
		objs[l] = make([]byte, ObjectBytes(g, run))
		for i := range objs[l] {
			objs[l][i] = byte(rng.Uint32())
		}
		for c := 0; c < run; c++ {
			info.ChunkCRCs = append(info.ChunkCRCs, CRC32C(objs[l][c*cb:(c+1)*cb]))
		}
	}
	feed := func(v *ChunkVerifier, p []byte) error {
		for len(p) > 0 {
			n := min(len(p), 1+rng.IntN(3*BlockBytes))
			if err := v.Update(p[:n]); err != nil {
				return err
			}
			p = p[n:]
		}
		return nil
	}
	s, _ := chunkSpan1(g, run, 1, 1, 2)
	v, err := info.NewChunkVerifier(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := feed(&v, objs[1][cb:3*cb]); err != nil || v.Done() != nil || v.Verified() != 2 {
		t.Fatalf("seed %d: good chunks: %v %v %d", seed, err, v.Done(), v.Verified())
	}
	if err := v.Update([]byte{0}); !errors.Is(err, kvshape.ErrOutOfRange) {
		t.Fatalf("bytes past the span: %v", err)
	}
	bad := bytes.Clone(objs[1])
	bad[2*cb+100] ^= 0x40
	v, _ = info.NewChunkVerifier(s)
	err = feed(&v, bad[cb:3*cb])
	var ce *ChunkCRCError
	if !errors.As(err, &ce) || ce.Layer != 1 || ce.Chunk != 2 || !errors.Is(err, ErrChunkCRC) || v.Verified() != 1 {
		t.Fatalf("seed %d: corrupt chunk 2: %v (verified %d)", seed, err, v.Verified())
	}
	v, _ = info.NewChunkVerifier(s)
	if err := feed(&v, objs[1][cb:2*cb+5]); err != nil || v.Done() == nil {
		t.Fatalf("short span: %v %v", err, v.Done())
	}
	// VerifySpan on a read buffer laid out as ChunkSpan says.
	buf := make([]byte, s.IOBytes)
	objOff, _ := objectOffset1(g, run, 1)
	copy(buf[s.Skip:], objs[1][s.Off-objOff+s.Skip:][:s.DataBytes])
	if err := info.VerifySpan(s, buf); err != nil {
		t.Fatal(err)
	}
	if err := info.VerifySpan(s, buf[:10]); err == nil {
		t.Fatal("short buffer verified")
	}
	if v, err := NewChunkVerifier(info.LayerChunkCRCs(1), s); err != nil || v.Update(objs[1][cb:3*cb]) != nil || v.Done() != nil {
		t.Fatalf("package NewChunkVerifier: %v", err)
	}
	if _, err := (&RunInfo{Chain: make([]uint64, run)}).NewChunkVerifier(s); !errors.Is(err, kvshape.ErrOutOfRange) {
		t.Fatalf("run without CRCs: %v", err)
	}
}

// TestPartialSpanOnDisk saves a run, reads prefixes of it with ChunkSpan and
// verifies them; a corrupt chunk fails only the spans that include it.
func TestPartialSpanOnDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	m := mustOpen(t, testOpts(t, dir))
	r := save(t, m, 5)[0]
	g := m.Geometry()
	if r.Chunks() != 5 || len(r.ChunkCRCs) != g.Layers*5 {
		t.Fatalf("run of %d chunks, %d chunk CRCs", r.Chunks(), len(r.ChunkCRCs))
	}
	f := m.Files()[r.File]
	read := func(s Span) []byte { // off-heap and aligned, as O_DIRECT needs
		buf, err := uring.AllocBuffer(int(s.IOBytes))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { buf.Free() })
		if err := preadFull(int(f.FD), buf.Bytes(), r.Offset+s.Off); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	for k := 1; k <= 5; k++ {
		s, _ := chunkSpan1(g, 5, 1, 0, k)
		if err := r.VerifySpan(s, read(s)); err != nil {
			t.Fatalf("first %d chunks: %v", k, err)
		}
	}
	m.Close()
	objOff, _ := objectOffset1(g, 5, 1)
	pf, err := os.OpenFile(filepath.Join(dir, poolFileName(r.File)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	pf.WriteAt([]byte{0x5a}, r.Offset+objOff+3*g.ChunkBytesPerLayer()+1)
	pf.Close()
	m = mustOpen(t, testOpts(t, dir))
	defer m.Close()
	r, _ = m.Lookup(r.ID)
	f = m.Files()[r.File]
	for k := 1; k <= 5; k++ {
		s, _ := chunkSpan1(g, 5, 1, 0, k)
		err := r.VerifySpan(s, read(s))
		var ce *ChunkCRCError
		if (k <= 3) != (err == nil) || k > 3 && (!errors.As(err, &ce) || ce.Chunk != 3 || ce.Layer != 1) {
			t.Fatalf("first %d chunks with chunk 3 corrupt: %v", k, err)
		}
	}
	rep, err := m.Check()
	if err != nil || rep.Corrupt != 1 || !strings.Contains(rep.CorruptRuns[0].Reason, "layer 1 chunk 3: CRC32C") {
		t.Fatalf("check: %v %v", rep, err)
	}
}

func TestRecoveryDropsCorruptChunkTable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	m := mustOpen(t, testOpts(t, dir))
	runs := append(save(t, m, 2), save(t, m, 3)...)
	m.Close()
	pf, err := os.OpenFile(filepath.Join(dir, poolFileName(runs[0].File)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	pf.WriteAt([]byte{0xee}, runs[0].Offset+HeaderBytes+6) // an entry of the table
	pf.Close()
	m = mustOpen(t, testOpts(t, dir))
	defer m.Close()
	rep := m.Recovery()
	if rep.Recovered != 1 || rep.Dropped != 1 || rep.DroppedRuns[0].Run != runs[0].ID ||
		!strings.Contains(rep.DroppedRuns[0].Reason, "chunk CRC table") {
		t.Fatalf("report: %v", rep)
	}
	if _, ok := m.Lookup(runs[0].ID); ok {
		t.Fatal("run with a corrupt table served")
	}
	got, ok := m.Lookup(runs[1].ID)
	if !ok || !slicesEqual(got.ChunkCRCs, runs[1].ChunkCRCs) {
		t.Fatalf("intact run: %v %v", ok, got.ChunkCRCs)
	}
}

func slicesEqual(a, b []uint32) bool { return bytes.Equal(u32bytes(a), u32bytes(b)) }

// TestCommitCRCChecks: a request without chunk CRCs is refused (nothing is
// read back to make them up), LayerCRCs cross-check them, and refused commits
// leave the store clean.
func TestCommitCRCChecks(t *testing.T) {
	m := mustOpen(t, testOpts(t))
	defer m.Close()
	g := m.Geometry()
	run := func() CommitRequest {
		res, err := m.Allocate(3)
		if err != nil || len(res) != 1 {
			t.Fatal(res, err)
		}
		req := writeRun(t, m, res[0])
		for l := 0; l < g.Layers; l++ {
			req.LayerCRCs = append(req.LayerCRCs, CRC32C(payload(g, res[0].ID, 3, l)))
		}
		return req
	}
	noChunks := run()
	noChunks.ChunkCRCs = nil
	if err := m.Commit([]CommitRequest{noChunks}); err == nil || !strings.Contains(err.Error(), "chunk CRCs for") {
		t.Fatalf("commit without chunk CRCs: %v", err)
	}
	wrong := run()
	wrong.LayerCRCs = make([]uint32, g.Layers)
	if err := m.Commit([]CommitRequest{wrong}); err == nil || !strings.Contains(err.Error(), "LayerCRCs say") {
		t.Fatalf("wrong LayerCRCs committed: %v", err)
	}
	req := run()
	if err := m.Commit([]CommitRequest{req}); err != nil {
		t.Fatal(err)
	}
	info, ok := m.Lookup(req.Res.ID)
	if !ok || !slicesEqual(info.ChunkCRCs, req.ChunkCRCs) || !slicesEqual(info.LayerCRCs, req.LayerCRCs) {
		t.Fatalf("commit: %v %v", info.ChunkCRCs, req.ChunkCRCs)
	}
	if rep, err := m.Check(); err != nil || rep.Corrupt != 0 {
		t.Fatalf("check: %+v %v", rep, err)
	}
}

func TestUpdateChunkCRCs(t *testing.T) {
	g := kvshape.Geometry{Layers: 1, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16, Planes: 1, PageTokens: 16, ChunkPages: 1}
	const chunks = 4
	seed := uint64(11)
	rng := rand.New(rand.NewPCG(seed, 12))
	obj := make([]byte, ObjectBytes(g, chunks))
	for i := range obj {
		obj[i] = byte(rng.Uint32())
	}
	cb := int(g.ChunkBytesPerLayer())
	for trial := 0; trial < 20; trial++ {
		crcs := make([]uint32, chunks)
		for off := 0; off < len(obj); {
			n := min(len(obj)-off, 1+rng.IntN(2*cb))
			if err := UpdateChunkCRCs(g, crcs, int64(off), obj[off:off+n]); err != nil {
				t.Fatal(err)
			}
			off += n
		}
		for c := range crcs {
			if want := CRC32C(obj[c*cb : (c+1)*cb]); crcs[c] != want {
				t.Fatalf("seed %d trial %d: chunk %d CRC %08x, want %08x", seed, trial, c, crcs[c], want)
			}
		}
	}
	crcs := make([]uint32, chunks)
	if err := UpdateChunkCRCs(g, crcs, int64(len(obj)-1), obj[:2]); !errors.Is(err, kvshape.ErrOutOfRange) || crcs[chunks-1] != 0 {
		t.Fatalf("bytes past the last chunk: %v", err)
	}
	if err := UpdateChunkCRCs(g, crcs, -1, obj[:1]); !errors.Is(err, kvshape.ErrOutOfRange) {
		t.Fatalf("negative offset: %v", err)
	}
}
