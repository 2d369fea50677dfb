package runtime_test

import (
	"bytes"
	"fmt"
	"os"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

// exampleGeometry is a toy model: 2 layers, K and V, 4-token pages, one page
// per chain block (vLLM-style block hashing).
var exampleGeometry = kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 8, DType: kvshape.BF16,
	Planes: 2, PageTokens: 4, ChunkPages: 1}

// Open a store, register host KV memory, save a prefix and restore it into
// other pages, layer by layer.
func Example() {
	dir, _ := os.MkdirTemp("", "tutti-example-")
	defer os.RemoveAll(dir)

	s, err := runtime.Open(runtime.Config{
		Dirs:          []string{dir},
		CapacityBytes: 16 << 20,
		Geometry:      exampleGeometry,
		Layout:        kvshape.LayoutPerLayer,
		NumPages:      8,
		StagingBytes:  1 << 20, // two 512 KiB slots
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	kv, _ := runtime.AllocHostKV(exampleGeometry, kvshape.LayoutPerLayer, 8)
	defer kv.Free()
	if err := s.RegisterKV(kv.Memory()); err != nil {
		fmt.Println(err)
		return
	}

	// A request's prefix: 3 chain blocks in pages 0, 1, 2 (the engine's
	// prefill wrote them; here a recognisable byte per page).
	chain := []uint64{0xa1, 0xa2, 0xa3}
	for i := 0; i < 3; i++ {
		for l := 0; l < 2; l++ {
			for p := 0; p < 2; p++ {
				copy(kv.Page(l, p, int32(i)), bytes.Repeat([]byte{byte(0x10*i + 4*l + p)}, 256))
			}
		}
	}
	sv, _ := s.Save(chain, []int32{0, 1, 2})
	<-sv.Gathered() // pages 0..2 may be reused from here on
	sv.Wait()
	fmt.Println("saved blocks:", sv.Saved())

	// A later request with the same prefix: restore into pages 5, 6, 7.
	fmt.Println("cached blocks:", s.Lookup(chain))
	l, _ := s.Load(chain, []int32{5, 6, 7})
	for layer := 0; layer < 2; layer++ {
		if err := l.WaitLayer(layer); err != nil { // layer's attention may start now
			fmt.Println(err)
		}
	}
	l.Wait()
	fmt.Println("restored blocks:", l.Blocks())
	fmt.Println("page 6 layer 1 plane 1 equals page 1's:", bytes.Equal(kv.Page(1, 1, 6), kv.Page(1, 1, 1)))
	// Output:
	// saved blocks: 3
	// cached blocks: 3
	// restored blocks: 3
	// page 6 layer 1 plane 1 equals page 1's: true
}

// Config.Validate names the field that is wrong.
func ExampleConfig_Validate() {
	cfg := runtime.Config{Dirs: []string{"/tmp/kv"}, CapacityBytes: 1 << 30, Geometry: exampleGeometry,
		Layout: kvshape.LayoutPerLayer, NumPages: 0}
	fmt.Println(cfg.Validate())
	// Output: runtime: invalid config: NumPages: must be in [1, 2^31), got 0
}

// A block table entry out of range is an error that names it; nothing is
// read or written.
func ExampleStore_Load_badPage() {
	dir, _ := os.MkdirTemp("", "tutti-example-")
	defer os.RemoveAll(dir)
	s, _ := runtime.Open(runtime.Config{Dirs: []string{dir}, CapacityBytes: 16 << 20, Geometry: exampleGeometry,
		Layout: kvshape.LayoutCrossLayer, NumPages: 4, StagingBytes: 1 << 20})
	defer s.Close()
	kv, _ := runtime.AllocHostKV(exampleGeometry, kvshape.LayoutCrossLayer, 4)
	defer kv.Free()
	_ = s.RegisterKV(kv.Memory())
	_, err := s.Load([]uint64{1, 2}, []int32{0, 9})
	fmt.Println(err)
	// Output: runtime: load: pages[1] = 9 out of range [0, 4): runtime: bad KV memory
}
