package savewrite

import (
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover"
)

// TestWriteBytes: the write size is within the limit and a multiple of
// O_DIRECT blocks, of whole chunks where one fits and, on PathGPU, of
// whole pages; a chunk larger than the limit falls back to blocks (pages
// on PathGPU).
func TestWriteBytes(t *testing.T) {
	mla := kvshape.Geometry{Layers: 61, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16, Planes: 1, PageTokens: 16, ChunkPages: 32}
	llama := kvshape.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 32}
	for _, tc := range []struct {
		name  string
		g     kvshape.Geometry
		limit int64
		gpu   bool
		want  int64
	}{
		{"mla cpu", mla, 4 << 20, false, 7 * 576 << 10},
		{"mla gpu", mla, 4 << 20, true, 7 * 576 << 10},
		{"llama cpu", llama, 4 << 20, false, 4 << 20},
		{"chunk over limit cpu", llama, 1 << 20, false, 1 << 20},
		{"chunk over limit gpu", mla, 256 << 10, true, 7 * 36 << 10}, // whole 36 KiB page-and-block units
	} {
		unit := int64(0)
		if tc.gpu {
			unit = mover.BlockMultiple(tc.g.PageBytesPerLayer())
		}
		got := WriteBytes(tc.g, tc.limit, unit)
		if got != tc.want || got%objmap.BlockBytes != 0 || (tc.gpu && got%tc.g.PageBytesPerLayer() != 0) {
			t.Errorf("%s: %d bytes, want %d", tc.name, got, tc.want)
		}
	}
}
