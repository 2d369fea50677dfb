package cpu

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/sched"
)

func TestInsertRead(t *testing.T) {
	rd := func(deadline int64, layer, run int) sched.IO {
		return sched.IO{Kind: sched.IORead, DeadlineNs: deadline, Layer: layer, Run: run}
	}
	cases := []struct {
		name     string
		queue    []sched.IO // already ordered
		keepHead bool
		in       []sched.IO // inserted in this order
		want     []sched.IO
	}{
		{
			name: "device-major burst becomes layer-major",
			// one device's layers 0-2 (runs 0 and 2), then the other's (run 1)
			in:   []sched.IO{rd(10, 0, 0), rd(10, 0, 2), rd(20, 1, 0), rd(20, 1, 2), rd(30, 2, 0), rd(30, 2, 2), rd(10, 0, 1), rd(20, 1, 1), rd(30, 2, 1)},
			want: []sched.IO{rd(10, 0, 0), rd(10, 0, 1), rd(10, 0, 2), rd(20, 1, 0), rd(20, 1, 1), rd(20, 1, 2), rd(30, 2, 0), rd(30, 2, 1), rd(30, 2, 2)},
		},
		{
			name: "deadline first",
			in:   []sched.IO{rd(30, 0, 0), rd(10, 3, 0), rd(20, 1, 1)},
			want: []sched.IO{rd(10, 3, 0), rd(20, 1, 1), rd(30, 0, 0)},
		},
		{
			name:     "a partly submitted head stays first",
			queue:    []sched.IO{rd(20, 1, 0), rd(30, 2, 0)},
			keepHead: true,
			in:       []sched.IO{rd(10, 0, 1), rd(25, 1, 1)},
			want:     []sched.IO{rd(20, 1, 0), rd(10, 0, 1), rd(25, 1, 1), rd(30, 2, 0)},
		},
		{
			name:  "a free head is passed",
			queue: []sched.IO{rd(20, 1, 0)},
			in:    []sched.IO{rd(10, 0, 1)},
			want:  []sched.IO{rd(10, 0, 1), rd(20, 1, 0)},
		},
		{
			name:     "keepHead on an empty queue",
			keepHead: true,
			in:       []sched.IO{rd(10, 0, 0)},
			want:     []sched.IO{rd(10, 0, 0)},
		},
		{
			name: "equal reads keep arrival order",
			in:   []sched.IO{{ID: 1, DeadlineNs: 5}, {ID: 2, DeadlineNs: 5}},
			want: []sched.IO{{ID: 1, DeadlineNs: 5}, {ID: 2, DeadlineNs: 5}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := append([]sched.IO(nil), tc.queue...)
			for _, io := range tc.in {
				q = insertRead(q, tc.keepHead, io)
			}
			if fmt.Sprint(q) != fmt.Sprint(tc.want) {
				t.Errorf("queue\n got %v\nwant %v", q, tc.want)
			}
		})
	}
}

// TestRestorePages: verifying and scattering piece by piece gives the same
// KV bytes as CopyPages for any cut of the payload into segments (planes cut
// anywhere), and a corrupt chunk is reported as a *ChunkCRCError naming it.
func TestRestorePages(t *testing.T) {
	g := kvshape.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, DType: kvshape.BF16, Planes: 2, PageTokens: 4, ChunkPages: 2}
	const numPages, chunks, layer = 16, 3, 1
	cb := g.ChunkBytesPerLayer()
	payload := make([]byte, chunks*cb)
	rng := rand.New(rand.NewPCG(9, 9))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	crcs := make([]uint32, chunks)
	for c := range crcs {
		crcs[c] = crc32.Checksum(payload[int64(c)*cb:int64(c+1)*cb], crc32.MakeTable(crc32.Castagnoli))
	}
	pages := []int32{7, 3, 12, 0, 9, 5}
	span := objmap.Span{Layer: layer, First: 0, K: chunks, DataBytes: chunks * cb, ChunkBytes: cb}
	pb := g.PageBytesPerPlane()
	cases := []struct {
		name    string
		cuts    []int64 // segment boundaries inside the payload
		corrupt int64   // byte flipped, -1 none
		wantBad int     // chunk reported corrupt, -1 none
	}{
		{"one segment", nil, -1, -1},
		{"cut at chunks", []int64{cb, 2 * cb}, -1, -1},
		{"cut inside planes", []int64{pb / 3, pb + 5, cb + 1, 2*cb + pb - 1}, -1, -1},
		{"corrupt chunk 1", []int64{cb / 2}, cb + 10, 1},
		{"corrupt last byte", []int64{pb}, chunks*cb - 1, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := shiftedViews(t, g, kvshape.LayoutPerLayer, numPages, 0)
			got := shiftedViews(t, g, kvshape.LayoutPerLayer, numPages, 0)
			data := append([]byte(nil), payload...)
			if tc.corrupt >= 0 {
				data[tc.corrupt] ^= 0x40
			}
			want.CopyPages(layer, pages, 0, int64(len(data)), data, true)
			ver, err := objmap.NewChunkVerifier(crcs, span)
			if err != nil {
				t.Fatal(err)
			}
			bounds := append(append([]int64{0}, tc.cuts...), int64(len(data)))
			var verr error
			for i := 0; i+1 < len(bounds) && verr == nil; i++ {
				lo, hi := bounds[i], bounds[i+1]
				verr = got.restorePages(layer, pages, lo, hi, data[lo:hi], &ver)
			}
			if verr == nil {
				verr = ver.Done()
			}
			var ce *objmap.ChunkCRCError
			switch {
			case tc.wantBad < 0 && verr != nil:
				t.Fatalf("restorePages: %v", verr)
			case tc.wantBad >= 0 && (!errors.As(verr, &ce) || ce.Chunk != tc.wantBad):
				t.Fatalf("error %v, want a CRC error on chunk %d", verr, tc.wantBad)
			}
			// Everything up to the corrupt chunk's last piece is in place;
			// without corruption, everything.
			upTo := int64(len(data))
			if tc.wantBad >= 0 {
				upTo = int64(tc.wantBad) * cb
			}
			for u := int64(0); u*pb < upTo; u++ {
				pl, pg := int(u%int64(g.Planes)), pages[u/int64(g.Planes)]
				if !bytes.Equal(got.Plane(layer, pl, pg), want.Plane(layer, pl, pg)) {
					t.Fatalf("page %d plane %d differs from CopyPages", pg, pl)
				}
			}
		})
	}
}
