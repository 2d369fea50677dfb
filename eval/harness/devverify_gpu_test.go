package harness

import (
	"strings"
	"testing"

	"github.com/tutti-io/tutti/internal/trace"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
)

// On the GPU machine: tutti-gpu saves blocks from HBM, restores them into
// HBM and verifies them there, against the host's content for them
// (PageKey); a page poisoned in HBM afterwards is caught.
func TestTuttiGPUVerifiesInHBM(t *testing.T) {
	if !gpuComputeAvailable(t) {
		t.Skip("GPU test skipped: no GPU or kernels library")
	}
	tu := NewTuttiGPU(nil)
	env, done := openChunkBackend(t, tu, 8)
	defer done()
	if !strings.Contains(tu.Label(), "verified in HBM") {
		t.Fatalf("label %q: the test kit did not load, so verification would copy to the host", tu.Label())
	}
	g := env.Geometry
	chain := []uint64{21, 22, 23, 24}
	pages, err := env.KV.Alloc(len(chain) * g.ChunkPages)
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{Trace: trace.Request{HashIDs: chain}, Chain: chain, Pages: pages, SaveEnd: len(chain)}
	for b, id := range chain {
		env.KV.FillBlock(id, req.BlockPages(g.ChunkPages, b))
	}
	if err := tu.FromHost(req); err != nil {
		t.Fatal(err)
	}
	if _, err := tu.Save(req); err != nil {
		t.Fatal(err)
	}
	req.Hit = tu.Lookup(chain)
	if req.Hit != len(chain) {
		t.Fatalf("lookup after the save: %d of %d blocks", req.Hit, len(chain))
	}
	if err := tu.Invalidate(req); err != nil {
		t.Fatal(err)
	}
	if bad, ok, err := tu.VerifyOnDevice(req, req.Hit); err != nil || !ok || bad == 0 {
		t.Fatalf("cleared pages: %d mismatched words, ok %v, %v: want mismatches", bad, ok, err)
	}
	rr, err := tu.Restore(req)
	if err != nil || rr.Blocks != len(chain) {
		t.Fatalf("restore: %d blocks, %v", rr.Blocks, err)
	}
	if bad, ok, err := tu.VerifyOnDevice(req, rr.Blocks); err != nil || !ok || bad != 0 {
		t.Fatalf("restored blocks: %d mismatched words, ok %v, %v", bad, ok, err)
	}
	off, err := g.PageOffset(kvshape.LayoutPerLayer, env.KV.NumPages, g.Layers-1, g.Planes-1, int(req.BlockPages(g.ChunkPages, 2)[1]))
	if err != nil {
		t.Fatal(err)
	}
	if err := kernels.MemsetDevice(tu.devLayers[g.Layers-1]+uint64(off)+64, 0x5a, 16); err != nil {
		t.Fatal(err)
	}
	if bad, _, err := tu.VerifyOnDevice(req, rr.Blocks); err != nil || bad != 2 {
		t.Fatalf("one poisoned 16-byte run: %d mismatched words, %v: want 2", bad, err)
	}
}
