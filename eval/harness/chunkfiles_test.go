package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/trace"
)

// openChunkBackend opens b on a fresh directory with KV memory for chains
// of up to blocks blocks of the tiny shape.
func openChunkBackend(t *testing.T, b Backend, blocks int) (Env, func()) {
	t.Helper()
	p, _ := model.Lookup("tiny")
	g, err := p.Geometry()
	if err != nil {
		t.Fatal(err)
	}
	kv, err := NewKVMemory(g, blocks*g.ChunkPages)
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{t.TempDir(), t.TempDir()}
	env := Env{Profile: p, Geometry: g, Dirs: dirs, Dir: dirs[0], CapacityBlocks: 64, CapacityBytes: 64 * g.ChunkBytes(), KV: kv, QueueDepth: 8}
	if err := b.Open(env); err != nil {
		t.Fatal(err)
	}
	return env, func() { b.Close(); kv.Free() }
}

// The file-per-chunk designs: each block is chunkFiles of its design's
// size, a restore brings back every byte, and a chunk that cannot be read
// makes its block and the rest of the prefix a counted miss.
func TestChunkFileDesigns(t *testing.T) {
	for _, tc := range []struct {
		b             Backend
		filesPerBlock int
		label         string
	}{
		{NewLMCacheDisk(), 2, "256-token chunk"},
		{NewLMCacheGDS(), 2, "CPU compatibility path"},
		{NewVLLMFS(), 32, "16 reader threads"},
	} {
		t.Run(tc.b.Name(), func(t *testing.T) {
			env, done := openChunkBackend(t, tc.b, 4)
			defer done()
			g := env.Geometry
			if l := tc.b.(Labeler).Label(); !strings.Contains(l, "implemented here") || (!strings.Contains(l, tc.label) && !strings.Contains(l, "cuFile")) {
				t.Fatalf("label %q does not state the design", l)
			}
			chain := []uint64{11, 12, 13, 14}
			pages, err := env.KV.Alloc(len(chain) * g.ChunkPages)
			if err != nil {
				t.Fatal(err)
			}
			req := &Request{Trace: trace.Request{HashIDs: chain}, Chain: chain, Pages: pages, Hit: 0, SaveEnd: 4}
			for b := range chain {
				env.KV.FillBlock(chain[b], req.BlockPages(g.ChunkPages, b))
			}
			sr, err := tc.b.Save(req)
			if err != nil || sr.Blocks != 4 || sr.Fallbacks != 0 {
				t.Fatalf("save: %+v, %v", sr, err)
			}
			var files int
			for _, d := range env.Dirs {
				m, _ := filepath.Glob(filepath.Join(d, "*.kv"))
				files += len(m)
			}
			if files != 4*tc.filesPerBlock {
				t.Fatalf("%d files for 4 blocks, want %d per block", files, tc.filesPerBlock)
			}
			env.KV.Scribble(pages)
			req.Hit = 4
			rr, err := tc.b.Restore(req)
			if err != nil || rr.Blocks != 4 || rr.Bytes != 4*g.ChunkBytes() || rr.ReadBytes < rr.Bytes {
				t.Fatalf("restore: %+v, %v", rr, err)
			}
			for b := range chain {
				if n := env.KV.VerifyBlock(chain[b], req.BlockPages(g.ChunkPages, b)); n != 0 {
					t.Fatalf("block %d: %d pages differ", b, n)
				}
			}
			// Block 2's last chunk goes missing: blocks 2 and 3 are misses.
			c := chunkFilesOf(tc.b)
			if err := os.Remove(c.path(chain[2], c.perBlock-1)); err != nil {
				t.Fatal(err)
			}
			rr, err = tc.b.Restore(req)
			if err != nil || rr.Blocks != 2 || rr.Fallbacks != 2 {
				t.Fatalf("restore with a chunk missing: %+v, %v", rr, err)
			}
			if err := tc.b.Evict(chain); err != nil {
				t.Fatal(err)
			}
			env.KV.Release(pages)
		})
	}
}

func chunkFilesOf(b Backend) *chunkFiles {
	switch b := b.(type) {
	case *LMCacheDisk:
		return &b.c
	case *LMCacheGDS:
		return &b.c
	case *VLLMFS:
		return &b.c
	}
	return nil
}

// A corrupt header (a chunk file holding another chunk) is a miss, not a
// verified restore of the wrong bytes.
func TestChunkHeaderChecked(t *testing.T) {
	b := NewLMCacheGDS()
	env, done := openChunkBackend(t, b, 2)
	defer done()
	g := env.Geometry
	chain := []uint64{5, 6}
	pages, _ := env.KV.Alloc(2 * g.ChunkPages)
	req := &Request{Chain: chain, Pages: pages, SaveEnd: 2}
	if _, err := b.Save(req); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(b.c.path(6, 0), b.c.path(5, 0)); err != nil {
		t.Fatal(err)
	}
	req.Hit = 2
	rr, err := b.Restore(req)
	if err != nil || rr.Blocks != 0 || rr.Fallbacks != 2 {
		t.Fatalf("restore of a mislabelled chunk: %+v, %v", rr, err)
	}
}
