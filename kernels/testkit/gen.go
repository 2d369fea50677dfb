package testkit

import (
	"fmt"

	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
)

// FillObject writes layer's object bytes for saved pages [firstPage,
// firstPage+pages) into dst in object layout (page-major, planes contiguous),
// with internal/kvdata's content for one page per chain block: page i is
// kvdata.Key{Block: base + i, Layer: layer, Plane: p, Page: 0}. VerifyKV checks
// the same content on the GPU. dst must hold pages*g.PageBytesPerLayer() bytes.
func FillObject(dst []byte, g kvshape.Geometry, base uint64, layer, firstPage, pages int) error {
	pb := g.PageBytesPerLayer()
	if pb%8 != 0 || int64(len(dst)) < int64(pages)*pb {
		return fmt.Errorf("fill object: %d bytes for %d pages of %d: %w", len(dst), pages, pb, kernels.ErrInvalid)
	}
	c := kvdata.ChunkLayout{Pages: 1, Planes: g.Planes, PageBytes: int(g.PageBytesPerPlane())}
	for i := 0; i < pages; i++ {
		kvdata.FillChunk(dst[int64(i)*pb:int64(i+1)*pb], c, base+uint64(firstPage+i), layer)
	}
	return nil
}
