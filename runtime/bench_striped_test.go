package runtime

import (
	"fmt"
	"testing"
	"time"

	"github.com/tutti-io/tutti/internal/benchenv"
	"github.com/tutti-io/tutti/kvshape"
)

// BenchmarkRestoreStriped70B restores what the replay's first warm
// Llama-3-70B request restores (BENCHMARKS.md, Save and restore through the store): 17
// chain blocks of 512 tokens (2.85 GB) saved as runs of 1, 5, 5, 4, 1 and 1
// blocks, striped over several directories, on the CPU path with the
// default staging and queue depth. It reports when layer 0 was ready and
// the whole load's time: a load that reads the devices in turn instead of
// together shows in both.
//
// Knobs: TUTTI_BENCH_DIRS (comma-separated store directories, one file
// system each; unset, the benchmark is skipped).
func BenchmarkRestoreStriped70B(b *testing.B) {
	dirs := benchenv.Dirs(b)
	g := benchenv.Llama70B(80, 32)
	runs := []int{1, 5, 5, 4, 1, 1}
	blocks := 0
	for _, n := range runs {
		blocks += n
	}
	cfg, s, kv, chain, pages := benchStore(b, dirs, g, blocks)
	defer closeKV(b, s, kv)
	end := 0
	for _, n := range runs {
		end += n
		sv, err := s.Save(chain[:end], pages[:end*g.ChunkPages])
		if err != nil {
			b.Fatal(err)
		}
		if sv.Wait(); sv.Saved() != n {
			b.Fatalf("saved %d of %d blocks: %v", sv.Saved(), n, s.Stats())
		}
	}
	scramble(kv, g, cfg.NumPages)
	var layer0, total time.Duration
	b.SetBytes(int64(blocks) * g.ChunkBytes())
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		l, err := s.Load(chain, pages)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.WaitLayer(0); err != nil {
			b.Fatal(err)
		}
		layer0 += time.Since(start)
		if err := l.Wait(); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		if l.Blocks() != blocks {
			b.Fatalf("restored %d of %d blocks (planned %d; first failure: %v)", l.Blocks(), blocks, l.Planned(), l.Failure())
		}
	}
	b.StopTimer()
	if err := verify(kv, g, chain, pages, blocks); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(layer0.Microseconds())/1e3/float64(b.N), "layer0-ms")
	b.ReportMetric(float64(total.Microseconds())/1e3/float64(b.N), "load-ms")
	b.ReportMetric(float64(s.Stats().Loads.ReadIOs)/float64(s.Stats().Loads.Calls), "reads/load")
}

// BenchmarkRestoreStripedDocQA restores what a docqa question restores
// (tutti replay --workload docqa, Llama-3-8B): a document of
// TUTTI_BENCH_BLOCKS (default 12) chain blocks of 512 tokens (768 MiB),
// saved with the block its first question shares with it, so the restore is
// all of a striped save but its last block, on the CPU path with the
// runtime's default staging. It reports the load's time and the most blocks
// one device reads (ceil(blocks/dirs) when the prefix is spread evenly):
// a restore of this size is bound by its busiest device.
//
// Knobs: TUTTI_BENCH_DIRS (as BenchmarkRestoreStriped70B),
// TUTTI_BENCH_BLOCKS.
func BenchmarkRestoreStripedDocQA(b *testing.B) {
	dirs := benchenv.Dirs(b)
	g := benchenv.Llama70B(32, 32) // Llama-3-8B: the 70B's KV shape per layer, 32 layers
	blocks := benchenv.Int("TUTTI_BENCH_BLOCKS", 12)
	saved := blocks + 1
	cfg, s, kv, chain, pages := benchStore(b, dirs, g, saved)
	defer closeKV(b, s, kv)
	sv, err := s.Save(chain, pages)
	if err != nil {
		b.Fatal(err)
	}
	if sv.Wait(); sv.Saved() != saved {
		b.Fatalf("saved %d of %d blocks: %v", sv.Saved(), saved, s.Stats())
	}
	scramble(kv, g, cfg.NumPages)
	busiest := 0
	payload := int64(blocks) * g.ChunkBytes()
	bw := benchenv.TimeLoads(b, blocks, payload, func() (*Load, error) {
		l, err := s.Load(chain[:blocks], pages[:blocks*g.ChunkPages])
		if err == nil { // the load's runs are resolved when Load returns
			for _, n := range layerBlocks(s, l.runs) {
				busiest = max(busiest, (n+g.Layers-1)/g.Layers)
			}
		}
		return l, err
	}, func(l *Load) string { return fmt.Sprintf(" (first failure: %v)", l.Failure()) })
	if err := verify(kv, g, chain, pages, blocks); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(payload)/bw*1e3, "load-ms")
	b.ReportMetric(float64(busiest), "busiest-dev-blocks")
}

// benchStore opens a store over dirs with room for blocks chain blocks (and
// a run per directory of slack) and host KV holding them on pages 0..,
// filled; the caller closes it (closeKV).
func benchStore(b *testing.B, dirs []string, g kvshape.Geometry, blocks int) (Config, *Store, *HostKV, []uint64, []int32) {
	cfg := Config{Dirs: dirs, CapacityBytes: CapacityForBlocks(g, blocks+len(dirs)), Geometry: g,
		Layout: kvshape.LayoutPerLayer, NumPages: blocks * g.ChunkPages, SaveBoundMs: 600000}
	s, kv := openKV(b, cfg)
	chain := chainOf(1<<40, blocks)
	pages := make([]int32, blocks*g.ChunkPages)
	for i := range pages {
		pages[i] = int32(i)
	}
	fill(kv, g, chain, pages)
	return cfg, s, kv, chain, pages
}
