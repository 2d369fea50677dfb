package prefix

import (
	"encoding/binary"
	"slices"
	"testing"
)

// FuzzIndexOps drives the index and the reference model with an operation sequence decoded from
// the fuzz input (each byte picks the next choice) and fails on any divergence or broken invariant.
func FuzzIndexOps(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("reserve commit lookup pin unpin remove evict"))
	f.Add(slices.Repeat([]byte{3, 11, 7, 200, 19, 5, 1, 0, 13, 42}, 40))
	f.Fuzz(func(t *testing.T, data []byte) {
		pos := 0
		next := func(n int) (int, bool) {
			if pos >= len(data) {
				return 0, false
			}
			if n <= 1 {
				return 0, true
			}
			v := int(data[pos])
			pos++
			if n > 256 && pos < len(data) {
				v = v<<8 | int(data[pos])
				pos++
			}
			return v % n, true
		}
		if err := simulate(next, 10000); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzChainFromTokens checks the chain helper against its specification (XXH64 of the parent id
// and the chunk's tokens) and the prefix property on arbitrary token sequences and chunk sizes.
func FuzzChainFromTokens(f *testing.F) {
	f.Add([]byte("hello, world: some tokens"), uint8(3), uint64(0))
	f.Add(make([]byte, 64), uint8(1), uint64(7))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8, seed uint64) {
		tokens := make([]uint32, len(data)/4)
		for i := range tokens {
			tokens[i] = binary.LittleEndian.Uint32(data[4*i:])
		}
		c := int(chunk)%64 + 1
		ids, err := ChainFromTokens(nil, tokens, c, seed)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != len(tokens)/c {
			t.Fatalf("%d tokens, chunk %d: %d ids", len(tokens), c, len(ids))
		}
		var parent uint64
		for i, id := range ids {
			if want := xxh64(encodeChunk(parent, tokens[i*c:(i+1)*c]), seed); id != want {
				t.Fatalf("id[%d] %#x, spec %#x", i, id, want)
			}
			parent = id
		}
		if len(ids) > 0 {
			short, _ := ChainFromTokens(nil, tokens[:len(tokens)-1], c, seed)
			if !slices.Equal(short, ids[:len(short)]) {
				t.Fatal("chain of a prefix of the tokens is not a prefix of the chain")
			}
		}
	})
}
