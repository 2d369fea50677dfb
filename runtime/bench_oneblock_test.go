package runtime

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tutti-io/tutti/internal/benchenv"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu/gputest"
	"github.com/tutti-io/tutti/uring"
)

// oneBlockShapes are the shapes BenchmarkLoadOneBlock restores a block of:
// DeepSeek-V3's MLA (61 layers, one 576-dim latent plane: 36 MiB per
// 512-token block, the shape whose short documents a Load used to restore
// at a third of the devices' rate) and Llama-3-8B's (32 layers, 64 MiB).
var oneBlockShapes = []struct {
	name string
	g    kvshape.Geometry
}{
	{"deepseek-v3", kvshape.Geometry{Layers: 61, KVHeads: 1, HeadDim: 576, DType: kvshape.BF16, Planes: 1, PageTokens: 16, ChunkPages: 32}},
	{"llama3-8b", kvshape.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 32}},
}

// BenchmarkLoadOneBlock is the fixed cost of a Load: one 512-token block
// (one run) restored by Store.Load, start to Wait (load-ms), against the
// same bytes read from the same places with no store at all (preads of each
// layer's read, the Layout's span, all at once, as many times after the
// loads: io-ms). fixed-ms = load-ms − io-ms is what a Load costs beyond its
// I/O (its CRC32C checks and copies included, on PathCPU). Sub-benchmarks per shape and run
// width: spread (the default: the block's layers over every directory) and
// width=1 (each run on one device, the layout before objmap's manifest
// version 3): there one device reads the whole block, which is where a
// short restore's ~25 ms went (BENCHMARKS.md).
//
// Knobs: TUTTI_BENCH_DIRS (the store directories, one device each; unset,
// the benchmark is skipped); TUTTI_BENCH_PATH=gpu (PathGPU: GPU-driven reads
// into HBM; skipped where that cannot run).
func BenchmarkLoadOneBlock(b *testing.B) {
	roots := benchenv.Roots(b)
	for _, sh := range oneBlockShapes {
		for _, width := range []int{0, 1} {
			name := "spread"
			if width == 1 {
				name = "width=1"
			}
			b.Run(sh.name+"/"+name, func(b *testing.B) {
				var dirs []string
				for _, r := range roots {
					dirs = append(dirs, benchenv.Under(b, r, "tutti-bench-"))
				}
				loadOneBlock(b, sh.g, dirs, width)
			})
		}
	}
}

func loadOneBlock(b *testing.B, g kvshape.Geometry, dirs []string, width int) {
	const blocks = 1
	cfg := Config{Dirs: dirs, RunWidth: width, CapacityBytes: CapacityForBlocks(g, 4) + int64(len(dirs))*(64<<20), Geometry: g,
		Layout: kvshape.LayoutPerLayer, NumPages: blocks * g.ChunkPages, SaveBoundMs: 600000}
	s, kv, dkv := openBenchStore(b, cfg)
	chain := chainOf(1<<41, blocks)
	pages := make([]int32, blocks*g.ChunkPages)
	for i := range pages {
		pages[i] = int32(i)
	}
	fill(kv, g, chain, pages)
	if dkv != nil {
		dkv.upload(b)
	}
	sv, err := s.Save(chain, pages)
	if err != nil {
		b.Fatal(err)
	}
	if sv.Wait(); sv.Saved() != blocks {
		b.Fatalf("saved %d of %d blocks", sv.Saved(), blocks)
	}
	raw := newRawReads(b, s)
	var load, io time.Duration
	b.SetBytes(g.ChunkBytes())
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		l, err := s.Load(chain, pages)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Wait(); err != nil || l.Blocks() != blocks {
			b.Fatalf("restored %d of %d blocks: %v (%v)", l.Blocks(), blocks, err, l.Failure())
		}
		load += time.Since(start)
	}
	// The raw reads after all the loads, not between them: a device that
	// throttles (a token bucket) would charge each for the other.
	for i := 0; i < b.N; i++ {
		io += raw.read(b)
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(b.N) }
	b.ReportMetric(ms(load), "load-ms")
	b.ReportMetric(ms(io), "io-ms")
	b.ReportMetric(ms(load-io), "fixed-ms")
	b.ReportMetric(float64(raw.devices()), "devices")
}

// rawReads are a stored block's reads as the store would make them (one per
// layer, the store's Layout.Span of its one run), made with pread(2) from a
// goroutine each, all at once, into off-heap buffers: the I/O alone.
type rawReads struct {
	files []*uring.File
	spans []objmap.Span
	bufs  []*uring.Buffer
}

func newRawReads(b *testing.B, s *Store) *rawReads {
	b.Helper()
	r := &rawReads{files: s.m.Files()}
	s.m.Runs(func(info objmap.RunInfo) bool {
		for l := range s.geo.Layers {
			sp, err := s.m.Layout().Span(info.Place(), l, 0, info.Chunks())
			if err != nil {
				b.Fatal(err)
			}
			buf, err := uring.AllocBuffer(int(sp.IOBytes))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { buf.Free() })
			r.spans, r.bufs = append(r.spans, sp), append(r.bufs, buf)
		}
		return true
	})
	return r
}

func (r *rawReads) read(b *testing.B) time.Duration {
	var wg sync.WaitGroup
	errs := make([]error, len(r.spans))
	start := time.Now()
	for i, sp := range r.spans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := uring.Pread(r.files[sp.File], r.bufs[i].Addr(), uint32(sp.IOBytes), uint64(sp.Off))
			if err == nil && int64(n) != sp.IOBytes {
				err = fmt.Errorf("%d of %d bytes", n, sp.IOBytes)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	d := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	return d
}

// devices is how many devices the reads touch.
func (r *rawReads) devices() int {
	seen := map[int]bool{}
	for _, sp := range r.spans {
		seen[sp.Device] = true
	}
	return len(seen)
}

// BenchmarkGPULoadOneBlockGoSide is BenchmarkLoadOneBlock's Load on PathGPU
// with the GPU's part taken away: a one-block restore (DeepSeek-V3's shape
// over four directories) through a restorer whose layers complete at once
// with nothing read (as BenchmarkGPULoadGoSide): pin, resolve, plan, the
// scheduler's dispatch of the Whole restore, building its extents, retiring
// its layers, the device models, finish. Everything a Load costs on PathGPU
// beyond the GPU's own work.
func BenchmarkGPULoadOneBlockGoSide(b *testing.B) {
	g := oneBlockShapes[0].g
	const blocks = 1
	dirs := []string{b.TempDir(), b.TempDir(), b.TempDir(), b.TempDir()}
	bound := make(chan *gputest.Restorer, 1)
	cfg := Config{Dirs: dirs, Geometry: g, Layout: kvshape.LayoutPerLayer, NumPages: blocks * g.ChunkPages,
		CapacityBytes: CapacityForBlocks(g, 4) + int64(len(dirs))*(64<<20), SaveBoundMs: 600000,
		Path: PathGPU, gpuBind: cpuGPU(nil, bound)}
	cfg.GPU.MaxPages = blocks * g.ChunkPages
	s, kv := openKV(b, cfg)
	defer closeKV(b, s, kv)
	gpu := <-bound
	chain := chainOf(1<<42, blocks)
	pages := make([]int32, blocks*g.ChunkPages)
	for i := range pages {
		pages[i] = int32(i)
	}
	fill(kv, g, chain, pages)
	sv, err := s.Save(chain, pages)
	if err != nil {
		b.Fatal(err)
	}
	if sv.Wait(); sv.Saved() != blocks {
		b.Fatalf("saved %d of %d blocks", sv.Saved(), blocks)
	}
	gpu.NoIO = true
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		l, err := s.Load(chain, pages)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Wait(); err != nil || l.Blocks() != blocks {
			b.Fatalf("loaded %d of %d: %v", l.Blocks(), blocks, err)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Microseconds())/1e3/float64(b.N), "load-ms")
}
