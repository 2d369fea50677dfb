package harness

import (
	"fmt"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
)

// DeviceVerifier is a HostSyncer that can check its restored pages where
// they landed (tutti-gpu: in HBM, with testkit's verify kernel), so the
// driver skips ToHost and the host check for them: copying every restored
// byte back over PCIe only to verify it would add harness time to the
// backend's wall that no other backend pays.
type DeviceVerifier interface {
	HostSyncer
	// VerifyOnDevice counts the 8-byte words of blocks Chain[:blocks] in
	// the backend's own memory that differ from KVMemory's content for them
	// (PageKey), after Restore returned. ok false: the backend cannot verify
	// there (its label says why) and the driver copies the pages to the host
	// (ToHost) and checks them there, as for any HostSyncer.
	VerifyOnDevice(req *Request, blocks int) (mismatchedWords int64, ok bool, err error)
}

// deviceVerify decides, at Open, whether tutti-gpu verifies in HBM: the
// test kit's library must load. The returned text goes into the label.
func deviceVerify() (bool, string) {
	if err := testkit.Load(); err != nil {
		return false, fmt.Sprintf("restored pages copied to the host to verify them (the test kit's verify kernel did not load: %v)", err)
	}
	return true, "restored pages verified in HBM by the test kit's kernel (no copy to the host)"
}

// VerifyOnDevice implements DeviceVerifier: one verify kernel per restored
// block, its pages keyed from BlockContentBase(its chain id).
func (t *Tutti) VerifyOnDevice(req *Request, blocks int) (int64, bool, error) {
	if t.devLayers == nil || !t.devVerify {
		return 0, false, nil
	}
	g := t.env.Geometry
	cfg := kernels.Config{Device: t.store.Config().GPU.Device, Geometry: g, Layout: kernels.LayoutPerLayer,
		NumPages: t.env.KV.NumPages, KV: t.devLayers}
	pm := make([]kernels.PageMap, g.ChunkPages)
	var bad int64
	for b := 0; b < blocks; b++ {
		for i, p := range req.BlockPages(g.ChunkPages, b) {
			pm[i] = kernels.PageMap{DstPage: uint32(p)}
		}
		n, err := testkit.VerifyTensors(cfg, BlockContentBase(req.Chain[b]), pm, 0, g.Layers)
		if err != nil {
			return bad, true, fmt.Errorf("%s: verifying block %d of request %d in HBM: %w", t.Name(), b, req.Seq, err)
		}
		bad += int64(n)
	}
	return bad, true, nil
}
