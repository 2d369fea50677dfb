package objmap

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

func sampleHeader(layers, chunks int) Header {
	h := Header{Fingerprint: 0x1122334455667788, Generation: 7, RunID: 42, File: 3, Offset: 8192, ChunkBytesPerLayer: 65536,
		Parent: 0xabcdef, HasParent: chunks%2 == 1, TableCRC: 0x5eed1234,
		LayerCRCs: make([]uint32, layers), Chain: make([]uint64, chunks)}
	for i := range h.LayerCRCs {
		h.LayerCRCs[i] = uint32(i*2654435761) ^ 0xdeadbeef
	}
	for i := range h.Chain {
		h.Chain[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	return h
}

func TestHeaderRoundTrip(t *testing.T) {
	buf := make([]byte, HeaderBytes+100)
	for _, lc := range [][2]int{{1, 1}, {80, MaxRunChunks(kvshape.Geometry{Layers: 80})}, {kvshape.MaxLayers, MaxRunChunks(kvshape.Geometry{Layers: kvshape.MaxLayers})}, {32, 17}} {
		h := sampleHeader(lc[0], lc[1])
		if err := EncodeHeader(buf, &h); err != nil {
			t.Fatal(err)
		}
		got, err := DecodeHeader(buf)
		if err != nil {
			t.Fatalf("%v: %v", lc, err)
		}
		if !reflect.DeepEqual(got, h) {
			t.Fatalf("%v: round trip differs", lc)
		}
	}
	h := sampleHeader(80, MaxRunChunks(kvshape.Geometry{Layers: 80})+1)
	if err := EncodeHeader(buf, &h); err == nil {
		t.Fatal("encoded a header with too many chain ids")
	}
	if err := EncodeHeader(buf[:100], &h); err == nil {
		t.Fatal("encoded into a short buffer")
	}
}

func TestHeaderDecodeRejects(t *testing.T) {
	h := sampleHeader(4, 9)
	good := make([]byte, HeaderBytes)
	if err := EncodeHeader(good, &h); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(b []byte){
		"short":    nil,
		"magic":    func(b []byte) { b[0] ^= 1 },
		"crc":      func(b []byte) { b[HeaderBytes-1] ^= 1 },
		"payload":  func(b []byte) { b[100] ^= 1 },
		"zeros":    func(b []byte) { clear(b) },
		"trailing": func(b []byte) { b[3000] = 1 }, // padding is covered by the CRC
	} {
		b := bytes.Clone(good)
		if mut == nil {
			b = b[:HeaderBytes-1]
		} else {
			mut(b)
		}
		if _, err := DecodeHeader(b); !errors.Is(err, ErrBadHeader) {
			t.Errorf("%s: got %v, want ErrBadHeader", name, err)
		}
	}
}

func TestHeaderMatches(t *testing.T) {
	g := kvshape.Geometry{Layers: 4, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 1}
	h := sampleHeader(4, 3)
	h.Fingerprint, h.ChunkBytesPerLayer = Fingerprint(g), uint64(g.ChunkBytesPerLayer())
	run := RunInfo{ID: h.RunID, Generation: h.Generation, File: int(h.File), Offset: int64(h.Offset), Chain: h.Chain,
		Parent: h.Parent, HasParent: h.HasParent}
	if err := h.Matches(g, &run); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(r *RunInfo, g *kvshape.Geometry){
		"id":     func(r *RunInfo, _ *kvshape.Geometry) { r.ID++ },
		"gen":    func(r *RunInfo, _ *kvshape.Geometry) { r.Generation++ },
		"offset": func(r *RunInfo, _ *kvshape.Geometry) { r.Offset += 4096 },
		"file":   func(r *RunInfo, _ *kvshape.Geometry) { r.File++ },
		"chain":  func(r *RunInfo, _ *kvshape.Geometry) { r.Chain = []uint64{h.Chain[0], h.Chain[1], 5} },
		"shape":  func(_ *RunInfo, g *kvshape.Geometry) { g.HeadDim = 64 },
		"parent": func(r *RunInfo, _ *kvshape.Geometry) { r.Parent++ },
		"root":   func(r *RunInfo, _ *kvshape.Geometry) { r.HasParent = !r.HasParent },
	} {
		r, gg := run, g
		mut(&r, &gg)
		if err := h.Matches(gg, &r); err == nil {
			t.Errorf("%s: mismatch not found", name)
		}
	}
}

func sampleRecords(rng *rand.Rand) []Record {
	chain := make([]uint64, 1+rng.IntN(50))
	for i := range chain {
		chain[i] = rng.Uint64()
	}
	return []Record{
		{Type: RecSegment, Seq: 3},
		{Type: RecEpoch, Epoch: 9},
		{Type: RecCommit, Run: RunInfo{ID: 5, Generation: 9, File: 2, Offset: 4096 * 7, Length: 4096 * 3, Chain: chain, Kept: len(chain)}},
		{Type: RecCommit, Run: RunInfo{ID: 6, Generation: 9, File: 1, Offset: 0, Length: 4096 * 3, Chain: chain[:1], Parent: 77, HasParent: true, Kept: 1}},
		{Type: RecTrim, ID: 5, Keep: 1 + rng.IntN(len(chain))},
		{Type: RecFree, ID: 5},
		{Type: RecCheckpoint, Seq: 4, Epoch: 9, NextID: 77, Count: 1},
		{Type: RecCheckpointEnd, Count: 1},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var b []byte
	recs := sampleRecords(rng)
	for i := range recs {
		var err error
		if b, err = AppendRecord(b, &recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	p := 0
	for i := range recs {
		r, n, err := DecodeRecord(b[p:])
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if !reflect.DeepEqual(r, recs[i]) {
			t.Fatalf("record %d: got %+v, want %+v", i, r, recs[i])
		}
		p += n
	}
	if p != len(b) {
		t.Fatalf("decoded %d of %d bytes", p, len(b))
	}
	// Every cut inside a record is a truncation, never a wrong record.
	one, _ := AppendRecord(nil, &recs[2])
	for cut := 0; cut < len(one); cut++ {
		if _, _, err := DecodeRecord(one[:cut]); !errors.Is(err, ErrTruncatedRecord) {
			t.Fatalf("cut at %d: %v", cut, err)
		}
	}
	// Every single-bit flip is caught.
	for i := 0; i < len(one)*8; i++ {
		c := bytes.Clone(one)
		c[i/8] ^= 1 << (i % 8)
		if r, _, err := DecodeRecord(c); err == nil {
			t.Fatalf("flip of bit %d decoded as %+v", i, r)
		}
	}
}

func FuzzHeaderDecode(f *testing.F) {
	h := sampleHeader(3, 5)
	b := make([]byte, HeaderBytes)
	_ = EncodeHeader(b, &h)
	f.Add(b)
	f.Add(make([]byte, HeaderBytes))
	f.Add([]byte("TUTTIRUN"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := DecodeHeader(data)
		if err != nil {
			return
		}
		out := make([]byte, HeaderBytes)
		if err := EncodeHeader(out, &h); err != nil {
			t.Fatalf("decoded header does not encode: %v", err)
		}
		if !bytes.Equal(out, data[:HeaderBytes]) {
			t.Fatal("valid header does not round-trip")
		}
	})
}

func FuzzJournalDecode(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	var all []byte
	for _, r := range sampleRecords(rng) {
		one, _ := AppendRecord(nil, &r)
		f.Add(one)
		all = append(all, one...)
	}
	f.Add(all)
	f.Add(all[:len(all)-3])
	f.Fuzz(func(t *testing.T, data []byte) {
		for p := 0; p < len(data); {
			r, n, err := DecodeRecord(data[p:])
			if err != nil {
				if !errors.Is(err, ErrBadRecord) && !errors.Is(err, ErrTruncatedRecord) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				return
			}
			if n <= 0 || n > len(data)-p {
				t.Fatalf("decoded size %d with %d bytes left", n, len(data)-p)
			}
			out, err := AppendRecord(nil, &r)
			if err != nil {
				t.Fatalf("decoded record does not encode: %v", err)
			}
			if !bytes.Equal(out, data[p:p+n]) {
				t.Fatal("valid record does not round-trip")
			}
			p += n
		}
	})
}
