package prefix

import (
	"fmt"
	"math/bits"
)

// ChainFromTokens appends to dst the chain ids of tokens cut into chunks of chunkTokens tokens and
// returns the extended slice. Block i's id is
//
//	id[i] = XXH64(LE64(id[i-1]) ‖ LE32(tokens[i*chunkTokens]) ‖ … ‖ LE32(tokens[(i+1)*chunkTokens-1]), seed)
//
// with id[-1] = 0: XXH64 (the xxHash 64-bit algorithm, seeded) of the parent's id as 8 little-endian
// bytes followed by the chunk's token ids as 4 little-endian bytes each. Equal ids therefore mean
// an equal whole prefix (up to 64-bit collisions: about n²/2⁶⁵ for n distinct blocks, 3·10⁻⁶ at
// 10 million). The seed separates namespaces (e.g. a model or geometry fingerprint, so one store
// never mixes KV of two models). A trailing partial chunk (len(tokens) % chunkTokens tokens) is not
// hashed: it is not a whole block, so it is neither looked up nor saved. Deterministic across
// platforms and releases; allocates only when dst grows. chunkTokens must be > 0.
func ChainFromTokens(dst []uint64, tokens []uint32, chunkTokens int, seed uint64) ([]uint64, error) {
	if chunkTokens <= 0 {
		return dst, fmt.Errorf("chain from tokens: chunk of %d tokens: %w", chunkTokens, ErrBadArg)
	}
	var parent uint64
	for i := 0; i+chunkTokens <= len(tokens); i += chunkTokens {
		parent = chunkHash(parent, tokens[i:i+chunkTokens], seed)
		dst = append(dst, parent)
	}
	return dst, nil
}

const (
	xxPrime1 uint64 = 11400714785074694791
	xxPrime2 uint64 = 14029467366897019727
	xxPrime3 uint64 = 1609587929392839161
	xxPrime4 uint64 = 9650029242287828579
	xxPrime5 uint64 = 2870177450012600261
)

func xxRound(acc, lane uint64) uint64 {
	acc += lane * xxPrime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * xxPrime1
}

func xxMerge(acc, val uint64) uint64 {
	acc ^= xxRound(0, val)
	return acc*xxPrime1 + xxPrime4
}

// laneReader yields the byte stream LE64(parent) ‖ LE32(tokens...) as 64-bit little-endian lanes
// without materializing it.
type laneReader struct {
	parent uint64
	tokens []uint32
	pos    int // lanes consumed; lane 0 is the parent
}

func (r *laneReader) next() uint64 {
	if r.pos == 0 {
		r.pos++
		return r.parent
	}
	t := 2 * (r.pos - 1)
	r.pos++
	return uint64(r.tokens[t]) | uint64(r.tokens[t+1])<<32
}

// chunkHash is XXH64(LE64(parent) ‖ LE32(tokens...), seed), computed lane by lane.
func chunkHash(parent uint64, tokens []uint32, seed uint64) uint64 {
	n := 8 + 4*len(tokens) // bytes in the stream
	r := laneReader{parent: parent, tokens: tokens}
	left := n
	var h uint64
	if n >= 32 {
		v1 := seed + xxPrime1 + xxPrime2
		v2 := seed + xxPrime2
		v3 := seed
		v4 := seed - xxPrime1
		for ; left >= 32; left -= 32 {
			v1 = xxRound(v1, r.next())
			v2 = xxRound(v2, r.next())
			v3 = xxRound(v3, r.next())
			v4 = xxRound(v4, r.next())
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
	for ; left >= 8; left -= 8 {
		h ^= xxRound(0, r.next())
		h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
	}
	if left >= 4 { // the stream is 8 + 4k bytes, so at most one 4-byte tail and no single bytes
		h ^= uint64(tokens[len(tokens)-1]) * xxPrime1
		h = bits.RotateLeft64(h, 23)*xxPrime2 + xxPrime3
	}
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	h ^= h >> 32
	return h
}
