package harness

import (
	"context"
	"testing"
	"time"

	"github.com/tutti-io/tutti/eval/model"
)

// mirrored is the dram backend keeping its "engine memory" in a second KV
// memory, as tutti-gpu keeps HBM: it exercises the driver's HostSyncer
// protocol without a GPU. skipToHost breaks the copy back, which
// verification must catch; noopRestore restores nothing while claiming every
// block, which verification must catch too although the mirror's pages
// held those very blocks from the previous question of the document (the
// driver does not zero the host pages of an OwnMemory backend: Invalidate
// must clear the mirror's).
type mirrored struct {
	*DRAM
	host, mirror *KVMemory
	skipToHost   bool
	noopRestore  bool
}

func (m *mirrored) OwnMemory() bool { return true }

func (m *mirrored) Restore(req *Request) (RestoreResult, error) {
	if m.noopRestore {
		return RestoreResult{Blocks: req.Hit, LayerReady: make([]time.Duration, m.host.Geometry.Layers)}, nil
	}
	return m.DRAM.Restore(req)
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
	m.mirror.Scribble(req.Pages[:req.Hit*m.host.Geometry.ChunkPages])
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
	for _, tc := range []struct {
		name                    string
		skipToHost, noopRestore bool
	}{{"ok", false, false}, {"no copy back", true, false}, {"restore writes nothing", false, true}} {
		m := &mirrored{DRAM: NewDRAM(), skipToHost: tc.skipToHost, noopRestore: tc.noopRestore}
		res, err := Run(context.Background(), Config{Requests: synthetic(16), Profile: p, Dir: t.TempDir(),
			Backends: []Backend{m}, Compute: comp, CeilingBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		b := res.Backends[0]
		if b.HitBlocks == 0 {
			t.Fatalf("%s: nothing restored", tc.name)
		}
		broken := tc.skipToHost || tc.noopRestore
		if got := b.VerifyMismatches > 0; got != broken {
			t.Fatalf("%s: %d mismatches", tc.name, b.VerifyMismatches)
		}
		ph := b.Phases
		if ph == nil || ph.ScribbleS != 0 || ph.VerifiedBytes == 0 {
			t.Fatalf("%s: phases %+v: want verified bytes and no host scribble for an OwnMemory backend", tc.name, ph)
		}
	}
}
