package cpu

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// regions are the views' memory, as Bind takes it.
func (v *Views) regions() []mover.Region {
	var out []mover.Region
	for _, b := range v.layers {
		out = append(out, mover.Region{Addr: uintptr(unsafe.Pointer(&b[0])), LenBytes: int64(len(b))})
	}
	if v.cross != nil {
		out = append(out, mover.Region{Addr: uintptr(unsafe.Pointer(&v.cross[0])), LenBytes: int64(len(v.cross))})
	}
	return out
}

// shiftedViews views fresh host KV memory of numPages pages of g in layout
// whose tensors start shiftBytes past a page boundary (a CPU allocator's
// alignment, not mmap's).
func shiftedViews(t *testing.T, g kvshape.Geometry, layout kvshape.Layout, numPages int, shiftBytes int64) *Views {
	t.Helper()
	per, err := g.TensorBytes(layout, numPages)
	if err != nil {
		t.Fatal(err)
	}
	n := 1
	if layout == kvshape.LayoutPerLayer {
		n = g.Layers
	}
	var regions []mover.Region
	for range n {
		b, err := uring.AllocBuffer(int(per + shiftBytes))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Free() })
		regions = append(regions, mover.Region{Addr: b.Addr() + uintptr(shiftBytes), LenBytes: per})
	}
	return NewViews(g, layout, numPages, regions)
}

// TestDirectIovecs: a write's entries are its page planes in object order
// (cut at the write's ends, neighbours in memory merged), then its zero
// padding; a misaligned entry or one beyond the iovecs' capacity stages it.
func TestDirectIovecs(t *testing.T) {
	g := kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 1}
	pb := g.PageBytesPerPlane() // 4 KiB
	for _, tc := range []struct {
		name        string
		layout      kvshape.Layout
		shift       int64
		align       uint32
		capacity    int
		wantKind    mover.StageCause
		wantEntries int
	}{
		{"per-layer", kvshape.LayoutPerLayer, 0, 512, 8, 0, 5},
		{"cross-layer merges a page's planes", kvshape.LayoutCrossLayer, 0, 512, 8, 0, 3},
		{"capacity", kvshape.LayoutPerLayer, 0, 512, 4, mover.StageIovecCap, 0},
		{"shifted", kvshape.LayoutPerLayer, 64, 512, 8, mover.StageUnaligned, 0},
		{"shifted, buffered file", kvshape.LayoutPerLayer, 64, 0, 8, 0, 5},
		{"padding below the alignment", kvshape.LayoutPerLayer, 0, 4096, 8, mover.StageUnaligned, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := shiftedViews(t, g, tc.layout, 8, tc.shift)
			buf, err := uring.AllocBuffer(int(4 * pb))
			if err != nil {
				t.Fatal(err)
			}
			defer buf.Free()
			m := &Mover{g: g, kv: kv}
			b := &gatherer{m: m, buf: buf.Bytes(), addr: buf.Addr()}
			b.iov, b.iovErr = uring.NewIovecs(tc.capacity)
			defer b.Close()
			// Two pages of layer 1, the last plane cut 1 KiB short: 16 KiB
			// with 1 KiB of padding.
			pages := []int32{5, 2}
			w := &mover.Write{Layer: 1, Bytes: 4*pb - 1024, IOBytes: 4 * pb, Pages: pages, File: &uring.File{DirectAlign: tc.align}}
			why := b.directIovecs(w)
			if why.kind != tc.wantKind {
				t.Fatalf("kind %d (%s), want %d", why.kind, why, tc.wantKind)
			}
			if tc.wantKind != 0 {
				return
			}
			if b.iov.Len() != tc.wantEntries || b.iov.TotalBytes() != w.IOBytes {
				t.Fatalf("%d entries of %d bytes, want %d of %d", b.iov.Len(), b.iov.TotalBytes(), tc.wantEntries, w.IOBytes)
			}
			// The entries cover exactly the planes in object order, then
			// the padding, which is zeros.
			var want []byte
			for _, p := range pages {
				for pl := 0; pl < g.Planes; pl++ {
					want = append(want, kv.Plane(1, pl, p)...)
				}
			}
			want = append(want[:w.Bytes], make([]byte, 1024)...)
			var got []byte
			for i := range b.iov.Len() {
				addr, n := b.iov.At(i)
				got = append(got, View(addr, int64(n))...)
			}
			if string(got) != string(want) {
				t.Fatal("the entries do not list the write's bytes in object order")
			}
		})
	}
	var why stageWhy
	if why.String() != "" {
		t.Errorf("zero stageWhy says %q", why.String())
	}
	why = stageWhy{kind: mover.StageNoIovecs, err: unix.ENOMEM}
	if !strings.Contains(why.String(), "cannot allocate memory") {
		t.Errorf("stageWhy %q does not name the allocation error", why.String())
	}
	if got := directIovecCap(4<<20, 2<<10); got != maxDirectIovecs {
		t.Errorf("directIovecCap(4 MiB, 2 KiB) = %d, want the kernel's %d", got, maxDirectIovecs)
	}
}
