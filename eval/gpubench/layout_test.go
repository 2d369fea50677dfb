package gpubench

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	evalmodel "github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// 70B-like (GQA, K and V) and MLA-like (one 576-dim latent plane) shapes,
// with the model profiles' 32-page chain blocks and with vLLM's 1-page ones.
func shape70B(chunkPages int) kvshape.Geometry {
	return kvshape.Geometry{Layers: 80, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: chunkPages}
}

func shapeMLA(chunkPages int) kvshape.Geometry {
	return kvshape.Geometry{Layers: 61, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16, Planes: 1, PageTokens: 16, ChunkPages: chunkPages}
}

// TestPlacementTable: every (layer, page) lies in exactly one piece, pieces
// are cut alike for every layer, never overlap on a device, stay within the
// bytes writeData writes per device, sit where the object store puts a
// run's objects (objmap.Layout), and balance the devices when the pages
// divide evenly; --stripe layers is gpubench's old layout exactly.
func TestPlacementTable(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		shape                 kvshape.Geometry
		pages, devices        int
		stripe                string
		runPages              int // asked for
		wantRunPages, wantRun int // laid out: pages per run, runs per layer
	}{
		{"70B 32K 4 devices", shape70B(32), 2048, 4, StripeRuns, 0, 512, 4},
		{"70B 32K 1 device", shape70B(32), 2048, 1, StripeRuns, 0, 2048, 1},
		{"70B 32K 4 devices 1-page blocks", shape70B(1), 2048, 4, StripeRuns, 0, 256, 8},
		{"70B 32K 1 device 1-page blocks", shape70B(1), 2048, 1, StripeRuns, 0, 410, 5},
		{"70B 32K 3 devices", shape70B(32), 2048, 3, StripeRuns, 0, 704, 3},
		{"70B runs of 256", shape70B(32), 2048, 4, StripeRuns, 256, 256, 8},
		{"70B 100K 4 devices", shape70B(32), 6250, 4, StripeRuns, 0, 1568, 4},
		{"70B short prefix", shape70B(32), 40, 4, StripeRuns, 0, 32, 2},
		{"MLA 32K 4 devices", shapeMLA(32), 2048, 4, StripeRuns, 0, 512, 4},
		{"MLA 32K 1 device", shapeMLA(32), 2048, 1, StripeRuns, 0, 2048, 1},
		{"MLA odd runs", shapeMLA(1), 1001, 4, StripeRuns, 7, 7, 143},
		{"MLA 1-page blocks 2 devices", shapeMLA(1), 2047, 2, StripeRuns, 0, 342, 6},
		{"70B 32K 4 devices, runs on one device", shape70B(32), 2048, 4, StripeRunsOneDevice, 0, 512, 4},
		{"MLA 1-page blocks 2 devices, runs on one device", shapeMLA(1), 2047, 2, StripeRunsOneDevice, 0, 342, 6},
		{"70B layers 4 devices", shape70B(32), 2048, 4, StripeLayers, 0, 2048, 1},
		{"70B layers 3 devices", shape70B(32), 2048, 3, StripeLayers, 0, 2048, 1},
		{"MLA layers 4 devices", shapeMLA(32), 2047, 4, StripeLayers, 0, 2047, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lay, err := newBenchLayout(tc.shape, tc.pages, tc.devices, tc.stripe, tc.runPages)
			if err != nil {
				t.Fatal(err)
			}
			if lay.runPages != tc.wantRunPages || lay.piecesPerLayer() != tc.wantRun {
				t.Fatalf("run pages %d, %d pieces per layer; want %d, %d", lay.runPages, lay.piecesPerLayer(), tc.wantRunPages, tc.wantRun)
			}
			pb := tc.shape.PageBytesPerLayer()
			devBytes := lay.devBytes()
			shape0 := lay.pieces(0, nil)
			type span struct{ lo, hi int64 }
			spans := make([][]span, tc.devices)
			held := make([]int64, tc.devices) // object bytes per device
			for l := 0; l < tc.shape.Layers; l++ {
				ps := lay.pieces(l, nil)
				if len(ps) != len(shape0) {
					t.Fatalf("layer %d: %d pieces, layer 0 %d", l, len(ps), len(shape0))
				}
				page := 0
				for k, pc := range ps {
					if pc.first != page || pc.pages < 1 || pc.pages != shape0[k].pages {
						t.Fatalf("layer %d piece %d: %+v after page %d (layer 0's: %+v)", l, k, pc, page, shape0[k])
					}
					page += pc.pages
					if pc.dev < 0 || pc.dev >= tc.devices || pc.off%4096 != 0 {
						t.Fatalf("layer %d piece %d: %+v", l, k, pc)
					}
					end := pc.off + lay.objStride(pc.pages)
					if end > devBytes[pc.dev] {
						t.Fatalf("layer %d piece %d: ends at %d, device %d holds %d", l, k, end, pc.dev, devBytes[pc.dev])
					}
					spans[pc.dev] = append(spans[pc.dev], span{pc.off, end})
					held[pc.dev] += int64(pc.pages) * pb
					switch tc.stripe {
					case StripeLayers: // gpubench's layerDev and layerOff before the runs
						stride := (int64(tc.pages)*pb + 4095) / 4096 * 4096
						if pc.dev != l%tc.devices || pc.off != int64(l/tc.devices)*stride {
							t.Fatalf("layer %d: device %d at %d, the old layout had %d at %d", l, pc.dev, pc.off, l%tc.devices, int64(l/tc.devices)*stride)
						}
					case StripeRuns, StripeRunsOneDevice:
						r := k
						home := r % tc.devices
						if tc.stripe == StripeRunsOneDevice && pc.dev != home {
							t.Fatalf("run %d on device %d, want %d", r, pc.dev, home)
						}
						if tc.stripe == StripeRuns && pc.dev != (home+l)%tc.devices {
							t.Fatalf("layer %d of run %d on device %d, want (r+l)%%D = %d", l, r, pc.dev, (home+l)%tc.devices)
						}
						if loc, err := lay.store.Where(lay.runs[r], l, 0); err != nil || loc.Device != pc.dev || loc.Offset != pc.off {
							t.Fatalf("layer %d run %d on device %d at %d, the store's layout: %+v %v", l, r, pc.dev, pc.off, loc, err)
						}
					}
				}
				if page != tc.pages {
					t.Fatalf("layer %d: pieces cover %d of %d pages", l, page, tc.pages)
				}
			}
			for d, ss := range spans {
				sort.Slice(ss, func(i, j int) bool { return ss[i].lo < ss[j].lo })
				var end int64
				for i, s := range ss {
					if i > 0 && s.lo < ss[i-1].hi {
						t.Fatalf("device %d: [%d,%d) overlaps [%d,%d)", d, s.lo, s.hi, ss[i-1].lo, ss[i-1].hi)
					}
					end = max(end, s.hi)
				}
				if end != devBytes[d] {
					t.Fatalf("device %d: objects end at %d, devBytes %d", d, end, devBytes[d])
				}
			}
			if tc.stripe != StripeLayers && tc.pages%(tc.devices*lay.runPages) == 0 {
				// Spread runs end their last objects within one slot of each
				// other (an empty slot ends a device's extent early).
				for d := range held {
					if held[d] != held[0] || max(devBytes[d]-devBytes[0], devBytes[0]-devBytes[d]) > lay.objStride(lay.runPages) {
						t.Fatalf("pages divide evenly, devices unbalanced: object bytes %v, device bytes %v", held, devBytes)
					}
				}
			}
			// The host page map: pieces in page order, each from a 4 KiB
			// boundary of the slot, as kernels.BuildPlan places extents, and
			// within the slot a Restorer bound with MaxExtents pieces has.
			offs, used := lay.slotOffsets()
			dst := make([]int32, tc.pages)
			for i := range dst {
				dst[i] = int32(tc.pages - 1 - i)
			}
			pm := lay.pageMap(dst)
			k := 0
			for i, p := range pm {
				if k+1 < len(shape0) && i == shape0[k+1].first {
					k++
				}
				if want := offs[k] + int64(i-shape0[k].first)*pb; int64(p.SlotOff) != want || p.DstPage != uint32(dst[i]) {
					t.Fatalf("page %d: %+v, want slot %d engine page %d", i, p, want, dst[i])
				}
			}
			if slot := (int64(tc.pages)*pb+4095)/4096*4096 + int64(lay.piecesPerLayer())*4096; used > slot || offs[0] != 0 {
				t.Fatalf("slot bytes %d (offsets %v), a Restorer's slot %d", used, offs[:min(4, len(offs))], slot)
			}
		})
	}
}

// TestStripeHeaderLines: the layout as the header line prints it, for the
// model profiles gpubench runs at 32K tokens.
func TestStripeHeaderLines(t *testing.T) {
	for _, tc := range []struct {
		model   string
		devices int
		stripe  string
		want    string
	}{
		{"llama3-70b", 4, StripeRuns, "runs of 512 pages spread over 4 devices (layer l of run r on device (r+l)%4), 4 runs; 32.0 MiB per layer piece"},
		{"llama3-70b", 4, StripeRunsOneDevice, "runs of 512 pages striped over 4 devices, 1 per device; 32.0 MiB per layer piece"},
		{"llama3-70b", 1, StripeRuns, "runs of 2048 pages striped over 1 device, 1 per device; 128.0 MiB per layer piece"},
		{"deepseek-v3", 4, StripeRuns, "runs of 512 pages spread over 4 devices (layer l of run r on device (r+l)%4), 4 runs; 9.0 MiB per layer piece"},
		{"deepseek-v3", 1, StripeRuns, "runs of 2048 pages striped over 1 device, 1 per device; 36.0 MiB per layer piece"},
		{"llama3-70b", 4, StripeLayers, "layers striped over 4 devices (layer l on device l%4), 20 per device; 128.0 MiB per layer piece"},
		{"deepseek-v3", 4, StripeLayers, "layers striped over 4 devices (layer l on device l%4), 15 or 16 per device; 36.0 MiB per layer piece"},
	} {
		prof, err := evalmodel.Lookup(tc.model)
		if err != nil {
			t.Fatal(err)
		}
		lay, err := newBenchLayout(prof.Shape, 32768/prof.Shape.PageTokens, tc.devices, tc.stripe, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := lay.String(); got != tc.want {
			t.Errorf("%s over %d, %s:\n got %q\nwant %q", tc.model, tc.devices, tc.stripe, got, tc.want)
		}
	}
	lay, err := newBenchLayout(shape70B(1), 2048, 1, StripeRuns, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := lay.String(), "runs of 410 pages (the last 408) striped over 1 device, 5 per device; 25.6 MiB per layer piece"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestStripeRefusals: bad --stripe and --run-pages are refused naming the
// flag, before the GPU is asked for.
func TestStripeRefusals(t *testing.T) {
	for _, tc := range []struct {
		stripe   string
		runPages int
		want     string
	}{
		{"runs", 33, "--run-pages 33: want a multiple of the 32 pages"},
		{"runs", -32, "--run-pages -32"},
		{"runs", 461*32 + 32, "--run-pages 14784"},
		{"layers", 64, "--run-pages 64: runs are laid out only with --stripe runs"},
		{"pages", 0, `--stripe "pages": want runs, runs-one-device or layers`},
	} {
		if _, err := newBenchLayout(shape70B(32), 2048, 4, tc.stripe, tc.runPages); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--stripe %s --run-pages %d: %v, want %q", tc.stripe, tc.runPages, err, tc.want)
		}
	}
	if _, err := newBenchLayout(shape70B(32), 2048, 4, StripeRuns, 461*32); err != nil {
		t.Errorf("the longest run: %v", err)
	}
}

// TestGpubenchReadPathsCPU writes the data files as gpubench does and reads
// them back through every path's reads, without a GPU: the host uring
// reads (a) and (b), pread on the O_DIRECT and the buffered files, cuFile's
// batches and the GPU path's plan (kernels.BuildPlan of its request), each
// run with pread(2) into a slot as the path would fill it. Every layer's
// slot must equal the DRAM path's copy (fillSlot), whose pages the host map
// finds as testkit.FillObject writes them. --reuse keeps files of this
// layout and rewrites those of another.
func TestGpubenchReadPathsCPU(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name     string
		shape    kvshape.Geometry
		pages    int
		stripe   string
		runPages int
		maxIO    int
	}{
		{"70B-like runs", shape70B(1), 11, StripeRuns, 2, 96 << 10},
		{"70B-like default runs", shape70B(1), 11, StripeRuns, 0, 128 << 10},
		{"70B-like layers", shape70B(1), 11, StripeLayers, 0, 96 << 10},
		{"MLA-like odd runs", shapeMLA(1), 23, StripeRuns, 3, 8 << 10},
		{"MLA-like layers", shapeMLA(1), 23, StripeLayers, 0, 8 << 10},
		{"MLA-like chunks of 2", shapeMLA(2), 23, StripeRuns, 4, 16 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shape := tc.shape
			shape.Layers = 5
			var stderr bytes.Buffer
			b := readBackBench(t, shape, tc.pages, tc.stripe, tc.runPages, tc.maxIO, dir, &stderr)
			if err := b.writeData(true); err != nil {
				t.Fatal(err)
			}
			defer b.closeFiles()
			checkReadBack(t, b)

			// Same layout again: reused. The other stripe over the same
			// files: rewritten, never read as if it were this one.
			stderr.Reset()
			b2 := readBackBench(t, shape, tc.pages, tc.stripe, tc.runPages, tc.maxIO, dir, &stderr)
			if err := b2.writeData(true); err != nil {
				t.Fatal(err)
			}
			b2.closeFiles()
			if !strings.Contains(stderr.String(), "reusing") {
				t.Fatalf("same layout not reused: %q", stderr.String())
			}
			other := StripeLayers
			if tc.stripe == StripeLayers {
				other = StripeRuns
			}
			stderr.Reset()
			b3 := readBackBench(t, shape, tc.pages, other, 0, tc.maxIO, dir, &stderr)
			if err := b3.writeData(true); err != nil {
				t.Fatal(err)
			}
			defer b3.closeFiles()
			if strings.Contains(stderr.String(), "reusing") {
				t.Fatalf("%s files reused for --stripe %s", tc.stripe, other)
			}
			checkReadBack(t, b3)
		})
	}
}

// readBackBench is a gpuBench over 3 files in dir, set up as runGPUBench
// sets it up (without a GPU).
func readBackBench(t *testing.T, shape kvshape.Geometry, pages int, stripe string, runPages, maxIO int, dir string, stderr *bytes.Buffer) *gpuBench {
	t.Helper()
	g := shape
	b := &gpuBench{g: g, model: "test", pages: pages, numPages: pages + 8, objBytes: int64(pages) * g.PageBytesPerLayer(), seed: 77, maxIO: maxIO, stderr: stderr, ctx: context.Background()}
	perm := rand.New(rand.NewPCG(5, 7)).Perm(b.numPages)
	for i := 0; i < pages; i++ {
		b.dst = append(b.dst, int32(perm[i]))
	}
	for d := 0; d < 3; d++ {
		b.paths = append(b.paths, filepath.Join(dir, fmt.Sprintf("dev%d.dat", d)))
	}
	var err error
	if b.lay, err = newBenchLayout(shape, pages, len(b.paths), stripe, runPages); err != nil {
		t.Fatal(err)
	}
	b.pm = b.lay.pageMap(b.dst)
	return b
}

func checkReadBack(t *testing.T, b *gpuBench) {
	t.Helper()
	L := b.g.Layers
	pb := b.g.PageBytesPerLayer()
	need := b.lay.devBytes()
	for i, p := range b.paths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil || st.Size != need[i] {
			t.Fatalf("%s: %d bytes (%v), device holds %d", p, st.Size, err, need[i])
		}
	}
	_, used := b.lay.slotOffsets()
	want := make([]byte, int64(L)*used)
	page := make([]byte, pb)
	for l := 0; l < L; l++ {
		slot := want[int64(l)*used : int64(l+1)*used]
		if err := b.fillSlot(slot, l); err != nil {
			t.Fatal(err)
		}
		for i, p := range b.pm {
			if err := testkit.FillObject(page, b.g, b.seed, l, i, 1); err != nil {
				t.Fatal(err)
			}
			if p.DstPage != uint32(b.dst[i]) || !bytes.Equal(slot[p.SlotOff:int64(p.SlotOff)+pb], page) {
				t.Fatalf("layer %d page %d: the DRAM copy at the host map's %+v is not FillObject's", l, i, p)
			}
		}
	}
	buf, err := uring.AllocBuffer(len(want))
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	bounce, err := uring.AllocBuffer(int(pb + 8192))
	if err != nil {
		t.Fatal(err)
	}
	defer bounce.Free()
	slot := func(l int) int64 { return int64(l) * used }
	check := func(path string, fill func() error) {
		t.Helper()
		clear(buf.Bytes())
		if err := fill(); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for l := 0; l < L; l++ {
			if !bytes.Equal(buf.Bytes()[slot(l):slot(l)+used], want[slot(l):slot(l)+used]) {
				t.Fatalf("%s: layer %d read back differs from the DRAM copy", path, l)
			}
		}
	}
	pread := func(fd int32, at int64, n int, off int64, need int) error {
		got, err := unix.Pread(int(fd), buf.Bytes()[at:at+int64(n)], off)
		if err == nil && got < need {
			err = fmt.Errorf("short read at %d: %d of %d", off, got, need)
		}
		return err
	}
	for _, perBlock := range []bool{false, true} {
		check(fmt.Sprintf("uring per-block=%v", perBlock), func() error {
			for _, io := range b.hostReads(perBlock) {
				if io.slot >= 0 {
					if err := pread(b.direct[io.dev].FD, slot(io.layer)+io.slot, io.len, io.off, io.len); err != nil {
						return err
					}
					continue
				}
				if got, err := unix.Pread(int(b.direct[io.dev].FD), bounce.Bytes()[:io.len], io.off); err != nil || got != io.len {
					return fmt.Errorf("bounce read at %d: %d of %d: %v", io.off, got, io.len, err)
				}
				at := slot(io.layer) + io.dstAt
				copy(buf.Bytes()[at:at+int64(io.copyN)], bounce.Bytes()[io.skip:io.skip+io.copyN])
			}
			return nil
		})
	}
	for _, files := range [][]*uring.File{b.direct, b.buffered} {
		check(fmt.Sprintf("pread align %d", files[0].DirectAlign), func() error {
			for l := 0; l < L; l++ {
				rs := b.lay.reads(l, int64(b.maxIO), files[0].DirectAlign != 0, nil)
				if err := preadLayer(files, buf.Addr()+uintptr(slot(l)), rs, 3); err != nil {
					return err
				}
			}
			return nil
		})
	}
	check("cufile batches", func() error {
		for l := 0; l < L; l++ {
			seen := map[int]bool{}
			for _, c := range b.cufileBatches(l) {
				if seen[c.dev] {
					return fmt.Errorf("layer %d: two batches for device %d", l, c.dev)
				}
				seen[c.dev] = true
				for i := range c.lens {
					if int64(c.dstOff[i])+int64(c.lens[i]) > used {
						return fmt.Errorf("layer %d: read %d leaves the %d-byte device buffer", l, i, used)
					}
					if err := pread(b.direct[c.dev].FD, slot(l)+int64(c.dstOff[i]), int(c.lens[i]), int64(c.fileOff[i]), int(c.lens[i])); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	check("gpu plan", func() error {
		n := b.lay.piecesPerLayer()
		slotBytes := (b.objBytes+4095)/4096*4096 + int64(n)*4096 // the Restorer's, MaxExtents n
		lim := kernels.Limits{Layers: L, NumPages: b.numPages, MaxPages: b.pages, SlotBytes: slotBytes,
			MaxEntries: int((slotBytes+int64(b.maxIO)-1)/int64(b.maxIO)) + n, MaxIOBytes: b.maxIO}
		var p kernels.Plan
		if err := kernels.BuildPlan(b.g, lim, b.gpuRequest(), &p); err != nil {
			return err
		}
		if p.SlotBytesUsed != used || len(p.Pages) != len(b.pm) {
			return fmt.Errorf("plan slot %d bytes, %d pages; host map's %d, %d", p.SlotBytesUsed, len(p.Pages), used, len(b.pm))
		}
		for i, pm := range p.Pages {
			if pm.DstPage != b.pm[i].DstPage || pm.SlotOff != b.pm[i].SlotOff {
				return fmt.Errorf("page %d: plan %+v, host map %+v", i, pm, b.pm[i])
			}
		}
		for k, e := range p.Entries {
			if err := pread(e.FD, slot(k/p.EntriesPerLayer)+int64(e.SlotOff), int(e.Len), int64(e.Offset), int(e.MinLen)); err != nil {
				return err
			}
		}
		return nil
	})
}
