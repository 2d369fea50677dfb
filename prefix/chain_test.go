package prefix

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"math/rand/v2"
	"testing"
)

func TestXXH64Vectors(t *testing.T) {
	// Published XXH64 values (seed 0), as in the reference implementation's test suites.
	for _, tc := range []struct {
		in   string
		want uint64
	}{
		{"", 0xef46db3751d8e999},
		{"a", 0xd24ec4f1a98c6e5b},
		{"as", 0x1c330fb2d66be179},
		{"asd", 0x631c37ce72a97393},
		{"asdf", 0x415872f599cea71e},
		{"Call me Ishmael. Some years ago--never mind how long precisely-", 0x02a2e85470d6fd96},
	} {
		if got := xxh64([]byte(tc.in), 0); got != tc.want {
			t.Errorf("xxh64(%q) = %#x, want %#x", tc.in, got, tc.want)
		}
	}
}

func encodeChunk(parent uint64, tokens []uint32) []byte {
	b := binary.LittleEndian.AppendUint64(nil, parent)
	for _, tok := range tokens {
		b = binary.LittleEndian.AppendUint32(b, tok)
	}
	return b
}

func TestChunkHashIsXXH64OfStream(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 80; n++ {
		tokens := make([]uint32, n)
		for i := range tokens {
			tokens[i] = rng.Uint32()
		}
		parent, seed := rng.Uint64(), rng.Uint64()
		if got, want := chunkHash(parent, tokens, seed), xxh64(encodeChunk(parent, tokens), seed); got != want {
			t.Fatalf("%d tokens: chunkHash %#x, xxh64 of the stream %#x", n, got, want)
		}
	}
}

func TestChainFromTokens(t *testing.T) {
	tokens := make([]uint32, 50)
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	full, err := ChainFromTokens(nil, tokens, 16, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Golden values: ids must never change across releases (stores outlive binaries).
	golden := []uint64{0x8652dd9847d8bf6b, 0x5a3fb85ec81cad8e, 0x41907955c36fac88}
	if len(full) != 3 {
		t.Fatalf("50 tokens in chunks of 16: %d ids, want 3 (the partial chunk is not hashed)", len(full))
	}
	for i := range golden {
		if full[i] != golden[i] {
			t.Errorf("id[%d] = %#x, want golden %#x", i, full[i], golden[i])
		}
	}
	var parent uint64
	for i, id := range full {
		if want := xxh64(encodeChunk(parent, tokens[i*16:(i+1)*16]), 0); id != want {
			t.Errorf("id[%d] = %#x, spec says %#x", i, id, want)
		}
		parent = id
	}

	tests := []struct {
		name      string
		tokens    []uint32
		chunk     int
		seed      uint64
		wantLen   int
		samePrefx int // leading ids equal to full's
		err       error
	}{
		{"prefix of tokens gives prefix of chain", tokens[:32], 16, 0, 2, 2, nil},
		{"partial trailing chunk ignored", tokens[:47], 16, 0, 2, 2, nil},
		{"shorter than a chunk", tokens[:15], 16, 0, 0, 0, nil},
		{"empty", nil, 16, 0, 0, 0, nil},
		{"other seed, other ids", tokens, 16, 1, 3, 0, nil},
		{"changed token in chunk 1 changes ids from 1 on", append(append(append([]uint32{}, tokens[:20]...), 9999), tokens[21:]...), 16, 0, 3, 1, nil},
		{"zero chunk", tokens, 0, 0, 0, 0, ErrBadArg},
		{"negative chunk", tokens, -1, 0, 0, 0, ErrBadArg},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChainFromTokens(nil, tc.tokens, tc.chunk, tc.seed)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if len(got) != tc.wantLen {
				t.Fatalf("%d ids, want %d", len(got), tc.wantLen)
			}
			for i := range got {
				if same := got[i] == full[i]; same != (i < tc.samePrefx) {
					t.Errorf("id[%d] equal to the full chain's: %v, want %v", i, same, i < tc.samePrefx)
				}
			}
		})
	}
	// dst is appended to.
	got, _ := ChainFromTokens([]uint64{42}, tokens, 16, 0)
	if len(got) != 4 || got[0] != 42 || got[1] != full[0] {
		t.Errorf("append to dst: %v", got)
	}
}

func TestChainFromTokensDistinct(t *testing.T) {
	// 20,000 random 20-token sequences over 8 symbols (so prefixes repeat) in 4-token chunks.
	rng := rand.New(rand.NewPCG(3, 4))
	root := make([]uint32, 4)
	// Distinct prefixes ⇒ distinct ids: count distinct prefixes exactly with string keys.
	prefixes := make(map[string]uint64)
	for i := 0; i < 20000; i++ {
		tokens := append([]uint32{}, root...)
		for j := 0; j < 16; j++ {
			tokens = append(tokens, uint32(rng.IntN(8)))
		}
		ids, _ := ChainFromTokens(nil, tokens, 4, 0)
		for k, id := range ids {
			key := string(encodeChunk(0, tokens[:(k+1)*4]))
			if old, ok := prefixes[key]; ok && old != id {
				t.Fatalf("same prefix, different ids %#x %#x", old, id)
			}
			prefixes[key] = id
		}
	}
	ids := make(map[uint64]struct{}, len(prefixes))
	for _, id := range prefixes {
		ids[id] = struct{}{}
	}
	if len(ids) != len(prefixes) {
		t.Fatalf("%d distinct prefixes but %d distinct ids", len(prefixes), len(ids))
	}
}

// xxh64 is plain XXH64 over bytes; the tests check chunkHash against it and it against published
// vectors.
func xxh64(b []byte, seed uint64) uint64 {
	n := len(b)
	var h uint64
	if n >= 32 {
		v1 := seed + xxPrime1 + xxPrime2
		v2 := seed + xxPrime2
		v3 := seed
		v4 := seed - xxPrime1
		for ; len(b) >= 32; b = b[32:] {
			v1 = xxRound(v1, binary.LittleEndian.Uint64(b[0:8]))
			v2 = xxRound(v2, binary.LittleEndian.Uint64(b[8:16]))
			v3 = xxRound(v3, binary.LittleEndian.Uint64(b[16:24]))
			v4 = xxRound(v4, binary.LittleEndian.Uint64(b[24:32]))
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = xxMerge(h, v1)
		h = xxMerge(h, v2)
		h = xxMerge(h, v3)
		h = xxMerge(h, v4)
	} else {
		h = seed + xxPrime5
	}
	h += uint64(n)
	for ; len(b) >= 8; b = b[8:] {
		h ^= xxRound(0, binary.LittleEndian.Uint64(b[:8]))
		h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
	}
	if len(b) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(b[:4])) * xxPrime1
		h = bits.RotateLeft64(h, 23)*xxPrime2 + xxPrime3
		b = b[4:]
	}
	for _, c := range b {
		h ^= uint64(c) * xxPrime5
		h = bits.RotateLeft64(h, 11) * xxPrime1
	}
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	h ^= h >> 32
	return h
}
