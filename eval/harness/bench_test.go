package harness

import (
	"testing"
	"time"

	"github.com/tutti-io/tutti/eval/model"
)

// BenchmarkRestoreOneBlock restores one saved 512-token block of the tiny
// shape (the most common hit of the conversation trace: the shared first
// block) through each storage backend: the fixed cost of a small restore.
// us-layer0 is when layer 0 was in KV memory.
func BenchmarkRestoreOneBlock(b *testing.B) {
	p, _ := model.Lookup("tiny")
	g, _ := p.Geometry()
	kv, err := NewKVMemory(g, 64*g.ChunkPages)
	if err != nil {
		b.Fatal(err)
	}
	defer kv.Free()
	for _, be := range []Backend{NewTuttiCPU(nil), NewPerBlock(), NewCuFileStandIn(), NewPageCache(), NewDRAM()} {
		b.Run(be.Name(), func(b *testing.B) {
			env := Env{Profile: p, Geometry: g, Dir: b.TempDir(), CapacityBlocks: 64,
				CapacityBytes: 64 * g.ChunkBytes(), KV: kv, QueueDepth: 64}
			if err := be.Open(env); err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			pages, err := kv.Alloc(g.ChunkPages)
			if err != nil {
				b.Fatal(err)
			}
			defer kv.Release(pages)
			kv.FillBlock(7, pages)
			req := &Request{Chain: []uint64{7}, Pages: pages, SaveEnd: 1}
			if _, err := be.Save(req); err != nil {
				b.Fatal(err)
			}
			req.Hit = 1
			var ready time.Duration
			b.SetBytes(g.ChunkBytes())
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				rr, err := be.Restore(req)
				if err != nil || rr.Blocks != 1 {
					b.Fatalf("restore: %v (%d blocks)", err, rr.Blocks)
				}
				ready += rr.LayerReady[0]
			}
			b.ReportMetric(float64(ready.Microseconds())/float64(b.N), "us-layer0")
		})
	}
}
