package harness

import (
	"context"
	"testing"

	"github.com/tutti-io/tutti/eval/model"
)

// mirrored is the dram backend keeping its "engine memory" in a second KV
// memory, as tutti-gpu keeps HBM: it exercises the driver's HostSyncer
// protocol without a GPU. skipToHost breaks the copy back, which
// verification must catch.
type mirrored struct {
	*DRAM
	host, mirror *KVMemory
	skipToHost   bool
}

func (m *mirrored) Name() string { return "mirrored" }

func (m *mirrored) Open(env Env) error {
	mirror, err := NewKVMemory(env.Geometry, env.KV.NumPages)
	if err != nil {
		return err
	}
	m.host, m.mirror = env.KV, mirror
	env.KV = mirror
	return m.DRAM.Open(env)
}

func (m *mirrored) Close() error {
	m.DRAM.Close()
	return m.mirror.Free()
}

func (m *mirrored) copy(dst, src *KVMemory, pages []int32) {
	g := dst.Geometry
	for l := 0; l < g.Layers; l++ {
		for p := 0; p < g.Planes; p++ {
			for _, pg := range pages {
				copy(dst.Page(l, p, pg), src.Page(l, p, pg))
			}
		}
	}
}

func (m *mirrored) Invalidate(req *Request) error {
	m.copy(m.mirror, m.host, req.Pages[:req.Hit*m.host.Geometry.ChunkPages])
	return nil
}

func (m *mirrored) ToHost(req *Request, blocks int) error {
	if !m.skipToHost {
		m.copy(m.host, m.mirror, req.Pages[:blocks*m.host.Geometry.ChunkPages])
	}
	return nil
}

func (m *mirrored) FromHost(req *Request) error {
	cp := m.host.Geometry.ChunkPages
	m.copy(m.mirror, m.host, req.Pages[req.Hit*cp:req.SaveEnd*cp])
	return nil
}

func TestHostSyncerProtocol(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, _ := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	for _, broken := range []bool{false, true} {
		m := &mirrored{DRAM: NewDRAM(), skipToHost: broken}
		res, err := Run(context.Background(), Config{Requests: synthetic(16), Profile: p, Dir: t.TempDir(),
			Backends: []Backend{m}, Compute: comp, CeilingBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		b := res.Backends[0]
		if b.HitBlocks == 0 {
			t.Fatal("nothing restored")
		}
		if got := b.VerifyMismatches > 0; got != broken {
			t.Fatalf("broken copy-back %v: %d mismatches", broken, b.VerifyMismatches)
		}
	}
}
