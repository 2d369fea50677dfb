package kernels

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

var (
	llama = kvshape.Geometry{Layers: 80, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16} // 64 KiB pages
	mla   = kvshape.Geometry{Layers: 61, Planes: 1, PageTokens: 16, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16} // 18 KiB pages
)

func limitsFor(g kvshape.Geometry, pages int) Limits {
	return Limits{Layers: g.Layers, NumPages: 4096, MaxPages: pages, MaxEntries: 4096,
		SlotBytes: roundUp(int64(pages)*g.PageBytesPerLayer(), StagingAlign) + 64*StagingAlign, MaxIOBytes: 1 << 20}
}

// request builds a request of runs (pages per extent) for layers
// [first, first+layers), objects of layer l at base + l*stride.
func request(g kvshape.Geometry, first, layers int, runs []int, stride int64) Request {
	req := Request{FirstLayer: first}
	n := 0
	for _, r := range runs {
		n += r
	}
	for i := 0; i < n; i++ {
		req.Pages = append(req.Pages, int32(n-1-i)) // reversed block table
	}
	for l := 0; l < layers; l++ {
		var xs []Extent
		off := int64(first+l) * stride
		for k, r := range runs {
			xs = append(xs, Extent{FD: int32(3 + k), Align: 4096, Offset: off, Pages: r})
			off += roundUp(int64(r)*g.PageBytesPerLayer(), StagingAlign)
		}
		req.Layers = append(req.Layers, xs)
	}
	return req
}

func TestBuildPlanRejects(t *testing.T) {
	g := llama
	lim := limitsFor(g, 64)
	good := func() Request { return request(g, 0, 2, []int{8, 8}, 1<<30) }
	cases := []struct {
		name string
		mut  func(r *Request, l *Limits)
	}{
		{"no pages", func(r *Request, l *Limits) { r.Pages = nil }},
		{"too many pages", func(r *Request, l *Limits) { l.MaxPages = 4 }},
		{"page out of range", func(r *Request, l *Limits) { r.Pages[3] = 4096 }},
		{"negative page", func(r *Request, l *Limits) { r.Pages[0] = -1 }},
		{"duplicate page", func(r *Request, l *Limits) { r.Pages[1] = r.Pages[0] }},
		{"layer past end", func(r *Request, l *Limits) { r.FirstLayer = 79 }},
		{"negative layer", func(r *Request, l *Limits) { r.FirstLayer = -1 }},
		{"no layers", func(r *Request, l *Limits) { r.Layers = nil }},
		{"extents short of pages", func(r *Request, l *Limits) { r.Layers[0][1].Pages = 7; r.Layers[1][1].Pages = 7 }},
		{"extents beyond pages", func(r *Request, l *Limits) { r.Layers[0][1].Pages = 9 }},
		{"layers split differently", func(r *Request, l *Limits) { r.Layers[1][0].Pages, r.Layers[1][1].Pages = 7, 9 }},
		{"extent count differs", func(r *Request, l *Limits) { r.Layers[1] = r.Layers[1][:1] }},
		{"zero-page extent", func(r *Request, l *Limits) { r.Layers[0][0].Pages = 0 }},
		{"misaligned offset", func(r *Request, l *Limits) { r.Layers[1][0].Offset += 512 }},
		{"negative offset", func(r *Request, l *Limits) { r.Layers[0][0].Offset = -4096 }},
		{"bad fd", func(r *Request, l *Limits) { r.Layers[0][0].FD = -1 }},
		{"slot too small", func(r *Request, l *Limits) { l.SlotBytes = 16 * g.PageBytesPerLayer() / 2 }},
		{"too many entries", func(r *Request, l *Limits) { l.MaxEntries = 1 }},
		{"odd max io", func(r *Request, l *Limits) { l.MaxIOBytes = 1000 }},
		{"bad geometry", func(r *Request, l *Limits) {}},
	}
	var p Plan
	if err := BuildPlan(g, lim, good(), &p); err != nil {
		t.Fatalf("good request refused: %v", err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, l, gg := good(), lim, g
			c.mut(&r, &l)
			if c.name == "bad geometry" {
				gg.HeadDim, gg.DType, gg.KVHeads, gg.PageTokens = 3, kvshape.FP8, 1, 1
			}
			err := BuildPlan(gg, l, r, &p)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
		})
	}
}

// checkPlan asserts the invariants the kernels rely on: entries of a layer
// tile the layer's slot bytes without overlap, every page lies inside the
// bytes its entry range covers and inside the slot, and engine pages are in
// range.
func checkPlan(t *testing.T, g kvshape.Geometry, lim Limits, req Request, p *Plan) {
	t.Helper()
	pb := g.PageBytesPerLayer()
	epl := p.EntriesPerLayer
	if len(p.Entries) != epl*len(req.Layers) || len(p.Pages) != len(req.Pages) {
		t.Fatalf("%d entries (%d per layer, %d layers), %d pages (want %d)", len(p.Entries), epl, len(req.Layers), len(p.Pages), len(req.Pages))
	}
	for l := range req.Layers {
		es := p.Entries[l*epl : (l+1)*epl]
		var end uint32
		for e, x := range es {
			if x.SlotOff != end {
				t.Fatalf("layer %d entry %d at slot %d, previous ended at %d", l, e, x.SlotOff, end)
			}
			if x.Len == 0 || int(x.Len) > lim.MaxIOBytes || x.Len%StagingAlign != 0 || x.MinLen == 0 || x.MinLen > x.Len {
				t.Fatalf("layer %d entry %d: len %d min %d", l, e, x.Len, x.MinLen)
			}
			if x.Offset%4096 != 0 {
				t.Fatalf("layer %d entry %d: offset %d", l, e, x.Offset)
			}
			end += x.Len
		}
		if len(p.EntryExtent) != epl {
			t.Fatalf("%d entry extents for %d entries per layer", len(p.EntryExtent), epl)
		}
		for e, x := range es {
			k := int(p.EntryExtent[e])
			if k < 0 || k >= len(req.Layers[l]) || (e > 0 && int(p.EntryExtent[e-1]) > k) {
				t.Fatalf("layer %d entry %d: extent %d of %d, out of order", l, e, k, len(req.Layers[l]))
			}
			xt := req.Layers[l][k]
			if lo, hi := xt.Offset, xt.Offset+roundUp(int64(xt.Pages)*pb, StagingAlign); int64(x.Offset) < lo || int64(x.Offset)+int64(x.Len) > hi {
				t.Fatalf("layer %d entry %d reads [%d,+%d), outside its extent %d [%d,%d)", l, e, x.Offset, x.Len, k, lo, hi)
			}
		}
		if int64(end) != p.SlotBytesUsed || int64(end) > lim.SlotBytes {
			t.Fatalf("layer %d entries end at %d, slot used %d, slot %d", l, end, p.SlotBytesUsed, lim.SlotBytes)
		}
		for i, m := range p.Pages {
			lo, hi := int64(m.SlotOff), int64(m.SlotOff)+pb
			first, last := es[m.FirstEntry], es[m.LastEntry]
			if int64(first.SlotOff) > lo || int64(last.SlotOff)+int64(last.MinLen) < hi {
				t.Fatalf("page %d [%d,%d) not covered by entries %d..%d", i, lo, hi, m.FirstEntry, m.LastEntry)
			}
			if m.FirstEntry > 0 && int64(es[m.FirstEntry-1].SlotOff+es[m.FirstEntry-1].Len) > lo {
				t.Fatalf("page %d: first entry %d is not the first covering it", i, m.FirstEntry)
			}
			if int(m.DstPage) >= lim.NumPages || m.SlotOff%16 != 0 {
				t.Fatalf("page %d: %+v", i, m)
			}
		}
	}
	// the file bytes each entry reads belong to its extent (plus alignment padding)
	for l, xs := range req.Layers {
		es := p.Entries[l*epl : (l+1)*epl]
		e := 0
		for _, x := range xs {
			bytes := int64(x.Pages) * pb
			var got int64
			for got < bytes {
				if es[e].Offset != uint64(x.Offset+got) || es[e].FD != x.FD {
					t.Fatalf("layer %d entry %d reads fd %d at %d, want fd %d at %d", l, e, es[e].FD, es[e].Offset, x.FD, x.Offset+got)
				}
				got += int64(es[e].Len)
				e++
			}
		}
	}
}

func TestBuildPlanShapes(t *testing.T) {
	for _, g := range []kvshape.Geometry{llama, mla} {
		for _, runs := range [][]int{{1}, {2048}, {32, 32, 32}, {1, 3, 5, 7}, {17, 1}} {
			n := 0
			for _, r := range runs {
				n += r
			}
			lim := limitsFor(g, n)
			req := request(g, 3, 5, runs, 8<<30)
			var p Plan
			if err := BuildPlan(g, lim, req, &p); err != nil {
				t.Fatalf("%+v runs %v: %v", g, runs, err)
			}
			checkPlan(t, g, lim, req, &p)
		}
	}
}

func TestBuildPlanRandom(t *testing.T) {
	seed := uint64(rand.Uint32())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	var p Plan
	for it := 0; it < 300; it++ {
		g := kvshape.Geometry{Layers: 1 + rng.IntN(100), Planes: 1 + rng.IntN(2), PageTokens: []int{1, 16, 32}[rng.IntN(3)],
			KVHeads: 1 + rng.IntN(8), HeadDim: []int{64, 128, 576}[rng.IntN(3)], DType: []kvshape.DType{kvshape.FP8, kvshape.BF16, kvshape.FP32}[rng.IntN(3)]}
		if checkGeometry(g) != nil {
			continue
		}
		var runs []int
		for k := 1 + rng.IntN(6); k > 0; k-- {
			runs = append(runs, 1+rng.IntN(40))
		}
		n := 0
		for _, r := range runs {
			n += r
		}
		lim := limitsFor(g, n)
		lim.MaxIOBytes = StagingAlign * (1 + rng.IntN(64))
		lim.MaxEntries = 1 << 20
		first := rng.IntN(g.Layers)
		layers := 1 + rng.IntN(g.Layers-first)
		req := request(g, first, layers, runs, 1<<34)
		if err := BuildPlan(g, lim, req, &p); err != nil {
			t.Fatalf("seed %d iteration %d: %+v runs %v: %v", seed, it, g, runs, err)
		}
		checkPlan(t, g, lim, req, &p)
	}
}

func TestBuildPlanNoAllocations(t *testing.T) {
	g := llama
	lim := limitsFor(g, 2048)
	req := request(g, 0, 80, []int{1024, 1024}, 1<<30)
	var p Plan
	if err := BuildPlan(g, lim, req, &p); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(5, func() {
		if err := BuildPlan(g, lim, req, &p); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("BuildPlan allocated %.0f times on a reused plan", allocs)
	}
}

func FuzzBuildPlan(f *testing.F) {
	f.Add(uint8(2), uint16(128), uint16(16), uint8(3), int64(0), uint16(5), uint16(0), int32(7), uint8(4))
	f.Add(uint8(1), uint16(576), uint16(1), uint8(1), int64(4096), uint16(2048), uint16(1), int32(-3), uint8(1))
	f.Fuzz(func(t *testing.T, planes uint8, headDim, pages uint16, runs uint8, off int64, firstRun, firstLayer uint16, page0 int32, maxIO uint8) {
		g := kvshape.Geometry{Layers: 8, Planes: int(planes%3) + 0, PageTokens: 16, KVHeads: 1, HeadDim: int(headDim), DType: kvshape.BF16}
		n := int(pages%512) + 1
		lim := Limits{Layers: 8, NumPages: 1024, MaxPages: 512, MaxEntries: 256, SlotBytes: 64 << 20, MaxIOBytes: int(maxIO) * 4096}
		req := Request{FirstLayer: int(firstLayer % 10)}
		for i := 0; i < n; i++ {
			req.Pages = append(req.Pages, int32(i))
		}
		req.Pages[0] = page0
		k := int(runs%4) + 1
		for l := 0; l < 2; l++ {
			var xs []Extent
			left := n
			for j := 0; j < k && left > 0; j++ {
				r := left
				if j == 0 && int(firstRun) < left {
					r = int(firstRun)
				}
				xs = append(xs, Extent{FD: 3, Align: 4096, Offset: off, Pages: r})
				left -= r
			}
			req.Layers = append(req.Layers, xs)
		}
		var p Plan
		if err := BuildPlan(g, lim, req, &p); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		checkPlan(t, g, lim, req, &p)
	})
}

func TestFailedPages(t *testing.T) {
	pages := []PageMap{{FirstEntry: 0, LastEntry: 0}, {FirstEntry: 0, LastEntry: 1}, {FirstEntry: 1, LastEntry: 1}}
	res := []EntryResult{{Status: EntryOK}, {Status: EntryShort}, {Status: EntryOK}, {Status: EntryOK}}
	if n := failedPages(pages, res, 2); n != 2 {
		t.Fatalf("failed pages %d, want 2", n)
	}
}

// Without the library (or a GPU), DevAllocOn fails with a typed error, and a
// negative device is refused before anything is loaded.
func TestDevAllocOnErrors(t *testing.T) {
	if _, err := DevAllocOn(-1, 4096); !errors.Is(err, ErrInvalid) {
		t.Fatalf("device -1: %v, want ErrInvalid", err)
	}
	if Explicit() {
		t.Skip("TUTTI_KERNELS_LIB is set: the GPU tests cover allocation")
	}
	if _, err := DevAllocOn(0, 4096); !errors.Is(err, ErrNotLoaded) && !errors.Is(err, ErrNoGPU) {
		t.Fatalf("no library: %v, want ErrNotLoaded or ErrNoGPU", err)
	}
}

// TestStagingSlotBytes: slots hold MaxPages pages plus an alignment block
// per extent, and slots of 2 MiB or more start on a huge page.
func TestStagingSlotBytes(t *testing.T) {
	g := kvshape.Geometry{Layers: 80, Planes: 2, PageTokens: 16, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16} // 64 KiB pages
	for _, c := range []struct {
		cfg  Config
		want int64
	}{
		{Config{MaxPages: 2048, MaxExtents: 1}, 130 << 20},            // 128 MiB + 4 KiB -> next 2 MiB
		{Config{MaxPages: 16, MaxExtents: 2}, 1<<20 + 2*StagingAlign}, // under 2 MiB: StagingAlign only
		{Config{SlotBytesHint: 3<<20 + 1}, 4 << 20},
		{Config{SlotBytesHint: 5000}, 2 * StagingAlign},
	} {
		got := stagingSlotBytes(c.cfg, g)
		if got != c.want {
			t.Errorf("%+v: %d bytes, want %d", c.cfg, got, c.want)
		}
		if got%StagingAlign != 0 || (got >= 2<<20 && got%(2<<20) != 0) {
			t.Errorf("%+v: %d bytes is misaligned", c.cfg, got)
		}
	}
}
