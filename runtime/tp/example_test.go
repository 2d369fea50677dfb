package tp_test

import (
	"fmt"
	"os"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
	"github.com/tutti-io/tutti/runtime/tp"
)

// Two tensor-parallel ranks: each gets half the KV heads, its own store and
// its own KV memory; a prefix is a hit only once both committed it.
func Example() {
	model := kvshape.Geometry{Layers: 2, KVHeads: 4, HeadDim: 8, DType: kvshape.BF16, Planes: 2, PageTokens: 4, ChunkPages: 1}
	root, _ := os.MkdirTemp("", "tutti-tp-example-")
	defer os.RemoveAll(root)
	cfg := tp.Config{Ranks: 2, Store: runtime.Config{CapacityBytes: 16 << 20, Geometry: model,
		Layout: kvshape.LayoutPerLayer, NumPages: 8, StagingBytes: 1 << 20}}
	for r := 0; r < 2; r++ {
		d, _ := os.MkdirTemp(root, "rank")
		cfg.Dirs = append(cfg.Dirs, []string{d})
	}
	g, err := tp.Open(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer g.Close()
	fmt.Println("KV heads per rank:", g.ShardGeometry().KVHeads)
	for r := 0; r < 2; r++ {
		kv, _ := runtime.AllocHostKV(g.ShardGeometry(), kvshape.LayoutPerLayer, 8)
		defer kv.Free()
		if err := g.RegisterKV(r, kv.Memory()); err != nil {
			fmt.Println(err)
			return
		}
	}

	chain := []uint64{0xa1, 0xa2, 0xa3}
	sv, _ := g.Save(chain, []int32{0, 1, 2}) // the same block table on every rank
	sv.Wait()
	fmt.Println("saved on every rank:", sv.Saved(), "failed:", sv.Failed())
	fmt.Println("group hit:", g.Lookup(chain))

	l, _ := g.Load(chain, []int32{5, 6, 7})
	for layer := 0; layer < model.Layers; layer++ {
		_ = l.WaitLayer(layer) // every rank has this layer
	}
	_ = l.Wait()
	fmt.Println("restored on every rank:", l.Blocks())

	_, err = tp.ShardGeometry(model, 3)
	fmt.Println(err)
	// Output:
	// KV heads per rank: 2
	// saved on every rank: 3 failed: <nil>
	// group hit: 3
	// restored on every rank: 3
	// tp: invalid config: Store.Geometry.KVHeads: 4 KV heads cannot be split evenly over 3 ranks (KVHeads % Ranks = 1)
}
