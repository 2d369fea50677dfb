package tp

import (
	"fmt"

	"github.com/tutti-io/tutti/kvshape"
)

// CopyShard copies rank r's part of one page plane between the whole
// model's layout (full: [page_tokens, kv_heads, head_dim] of g, g being the
// whole model's geometry) and the rank's (shard: the same page plane of
// ShardGeometry(g, ranks)): for every token, the rank's heads
// [r*H/N, (r+1)*H/N). toShard chooses the direction. A replicated (MLA)
// page is copied whole. For tools that hold a whole-model KV memory and
// emulate the ranks' (the replay harness, benchmarks); an engine's ranks
// hold only their own shards and never call it.
func CopyShard(g kvshape.Geometry, ranks, r int, full, shard []byte, toShard bool) error {
	sg, err := ShardGeometry(g, ranks)
	if err != nil {
		return err
	}
	if r < 0 || r >= ranks {
		return fmt.Errorf("tp: CopyShard: rank %d out of range [0, %d)", r, ranks)
	}
	if int64(len(full)) != g.PageBytesPerPlane() || int64(len(shard)) != sg.PageBytesPerPlane() {
		return fmt.Errorf("tp: CopyShard: page planes of %d and %d bytes, want %d and %d",
			len(full), len(shard), g.PageBytesPerPlane(), sg.PageBytesPerPlane())
	}
	if Replicated(g) || ranks == 1 {
		if toShard {
			copy(shard, full)
		} else {
			copy(full, shard)
		}
		return nil
	}
	headBytes := g.HeadDim * g.DType.Bytes()
	span := sg.KVHeads * headBytes // the rank's heads of one token
	for tok := 0; tok < g.PageTokens; tok++ {
		f := full[(tok*g.KVHeads+r*sg.KVHeads)*headBytes:][:span]
		s := shard[tok*span:][:span]
		if toShard {
			copy(s, f)
		} else {
			copy(f, s)
		}
	}
	return nil
}
