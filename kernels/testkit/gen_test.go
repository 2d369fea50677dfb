package testkit

import (
	"errors"
	"testing"

	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
)

func TestFillObjectIsKVData(t *testing.T) {
	g := kvshape.Geometry{Layers: 61, Planes: 1, PageTokens: 16, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16}
	buf := make([]byte, 3*g.PageBytesPerLayer())
	if err := FillObject(buf, g, 9, 4, 10, 3); err != nil {
		t.Fatal(err)
	}
	c := kvdata.ChunkLayout{Pages: 1, Planes: g.Planes, PageBytes: int(g.PageBytesPerPlane())}
	for i := 0; i < 3; i++ {
		if bad := kvdata.VerifyChunk(buf[int64(i)*g.PageBytesPerLayer():], c, uint64(9+10+i), 4); bad >= 0 {
			t.Fatalf("page %d differs from kvdata at byte %d", i, bad)
		}
	}
	if err := FillObject(buf[:10], g, 0, 0, 0, 1); !errors.Is(err, kernels.ErrInvalid) {
		t.Fatalf("short buffer: %v", err)
	}
}
