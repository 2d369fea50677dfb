package kernels

import (
	"encoding/binary"
	"fmt"
)

// GenWord is the deterministic KV content used by the tests and gpubench: the
// 8-byte word w (counted across the page's planes) of saved page srcPage of
// layer. The CUDA verifier (tk_kv_verify) computes the same function, so a
// restore is checked on the GPU against what was written to disk.
func GenWord(seed uint64, layer, srcPage int, w uint64) uint64 {
	return splitmix64(seed ^ uint64(layer)<<40 ^ uint64(srcPage)<<20 ^ w)
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// FillObject writes layer's object bytes for saved pages [firstPage,
// firstPage+pages) into dst in object layout (page-major, planes contiguous);
// dst must hold pages*g.PageBytes() bytes (little-endian words).
func FillObject(dst []byte, g Geometry, seed uint64, layer, firstPage, pages int) error {
	pb := g.PageBytes()
	if pb%8 != 0 || int64(len(dst)) < int64(pages)*pb {
		return fmt.Errorf("fill object: %d bytes for %d pages of %d: %w", len(dst), pages, pb, ErrInvalid)
	}
	for i := 0; i < pages; i++ {
		page := dst[int64(i)*pb : int64(i+1)*pb]
		for w := uint64(0); w < uint64(pb/8); w++ {
			binary.LittleEndian.PutUint64(page[w*8:], GenWord(seed, layer, firstPage+i, w))
		}
	}
	return nil
}
