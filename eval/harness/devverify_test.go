package harness

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kernels/testkit"
)

// The host's content of a block (FillBlock) is byte for byte what
// testkit.FillObject makes for base BlockContentBase(id), the content the GPU
// verify kernel checks: if the two drifted, every tutti-gpu restore would
// fail verification in HBM (or a wrong one pass).
func TestPageKeyIsTheGPUVerifyContent(t *testing.T) {
	p, _ := model.Lookup("tiny")
	g, err := p.Geometry()
	if err != nil {
		t.Fatal(err)
	}
	kv, err := NewKVMemory(g, 2*g.ChunkPages)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Free()
	pages, _ := kv.Alloc(g.ChunkPages)
	for _, id := range []uint64{0, 1, 2, 0xFFFFFFFFFFFFFFFF, 0x1234_5678_9ABC_DEF0} {
		kv.FillBlock(id, pages)
		obj := make([]byte, g.PageBytesPerLayer())
		for l := 0; l < g.Layers; l++ {
			for i, pg := range pages {
				if err := testkit.FillObject(obj, g, BlockContentBase(id), l, i, 1); err != nil {
					t.Fatal(err)
				}
				for pl := 0; pl < g.Planes; pl++ {
					want := obj[int64(pl)*g.PageBytesPerPlane() : int64(pl+1)*g.PageBytesPerPlane()]
					if !bytes.Equal(kv.Page(l, pl, pg), want) {
						t.Fatalf("block %#x layer %d page %d plane %d: host content is not FillObject's", id, l, i, pl)
					}
				}
			}
		}
	}
}

// Consecutive chain ids (a synthetic trace's) must not share page keys: the
// bases are spread, so page i of block a never names page j of block b.
func TestBlockContentBaseSpreadsIDs(t *testing.T) {
	const blocks, pages = 4096, 64
	seen := make(map[uint64]uint64, blocks*pages)
	for id := uint64(0); id < blocks; id++ {
		for i := uint64(0); i < pages; i++ {
			k := BlockContentBase(id) + i
			if prev, ok := seen[k]; ok {
				t.Fatalf("block %d page %d shares key %#x with block %d", id, i, k, prev)
			}
			seen[k] = id
		}
	}
}

// devMirrored is mirrored verifying in its own memory (as tutti-gpu in
// HBM): the driver must then neither copy to the host nor check there, and
// a restore that wrote nothing must still be caught; refuse makes it decline,
// and the driver falls back to ToHost.
type devMirrored struct {
	mirrored
	refuse  bool
	toHosts int
}

func (d *devMirrored) ToHost(req *Request, blocks int) error {
	d.toHosts++
	return d.mirrored.ToHost(req, blocks)
}

func (d *devMirrored) VerifyOnDevice(req *Request, blocks int) (int64, bool, error) {
	if d.refuse {
		return 0, false, nil
	}
	var bad int64
	for b := 0; b < blocks; b++ {
		bad += int64(d.mirror.VerifyBlock(req.Chain[b], req.BlockPages(d.host.Geometry.ChunkPages, b)))
	}
	return bad, true, nil
}

func TestDeviceVerifierProtocol(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, _ := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	for _, tc := range []struct {
		name                string
		refuse, noopRestore bool
	}{{"verified on the device", false, false}, {"device catches an empty restore", false, true},
		{"declined: host check", true, false}, {"declined: host catches an empty restore", true, true}} {
		d := &devMirrored{mirrored: mirrored{DRAM: NewDRAM(), noopRestore: tc.noopRestore}, refuse: tc.refuse}
		res, err := Run(context.Background(), Config{Requests: synthetic(16), Profile: p, Dir: t.TempDir(),
			Backends: []Backend{d}, Compute: comp, CeilingBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		b := res.Backends[0]
		if b.HitBlocks == 0 {
			t.Fatalf("%s: nothing restored", tc.name)
		}
		if got := b.VerifyMismatches > 0; got != tc.noopRestore {
			t.Fatalf("%s: %d mismatches", tc.name, b.VerifyMismatches)
		}
		if copied := d.toHosts > 0; copied != tc.refuse {
			t.Fatalf("%s: %d ToHost calls", tc.name, d.toHosts)
		}
		if ph := b.Phases; ph == nil || ph.VerifiedBytes == 0 || (!tc.refuse && ph.ToHostS != 0) {
			t.Fatalf("%s: phases %+v", tc.name, ph)
		}
	}
}

// pendingCheck is devMirrored noting, at each verify on its device, whether
// the replay's live prefill was still in flight.
type pendingCheck struct {
	devMirrored
	gpu                *GPUCompute
	verifies, inFlight int
}

func (d *pendingCheck) VerifyOnDevice(req *Request, blocks int) (int64, bool, error) {
	d.verifies++
	if d.gpu.pending != nil {
		d.inFlight++
	}
	return d.devMirrored.VerifyOnDevice(req, blocks)
}

// A restore is verified after the live prefill beside it is collected: a
// verify on the GPU (a kernel over every restored page, the test kit's
// device-wide syncs) beside the prefill is harness work no engine has, and
// would be measured as the restore's contention.
func TestVerifyAfterLivePrefill(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, _ := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	g, runs := fakeGPU(t, 100*time.Microsecond)
	g.prof = p
	d, err := dimsOf(p)
	if err != nil {
		t.Fatal(err)
	}
	g.dims = d
	g.every = 1 // every request's prefill runs live next to its restore
	b := &pendingCheck{devMirrored: devMirrored{mirrored: mirrored{DRAM: NewDRAM()}}, gpu: g}
	res, err := Run(context.Background(), Config{Requests: synthetic(16), Profile: p, Dir: t.TempDir(),
		Backends: []Backend{b}, Compute: comp, GPU: g, CeilingBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Backends[0].HitBlocks == 0 || b.verifies == 0 || len(*runs) == 0 {
		t.Fatalf("nothing to check: %d hit blocks, %d verifies, %d prefills", res.Backends[0].HitBlocks, b.verifies, len(*runs))
	}
	if b.inFlight != 0 {
		t.Fatalf("%d of %d verifies ran while the live prefill was in flight", b.inFlight, b.verifies)
	}
}
