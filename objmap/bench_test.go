package objmap

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tutti-io/tutti/kvshape"
)

// llama70b is the Llama-3-70B KV shape with vLLM pages: 80 layers, 8 KV heads,
// head dim 128, bf16, K and V, 16-token pages, one page per chain block.
var llama70b = kvshape.Geometry{Layers: 80, KVHeads: 8, HeadDim: 128, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 1}

// BenchmarkAllocatorChurn: allocate runs of 1..64 chunks and free random
// live ones, keeping the pool about 80% full (4 files of 64 GiB).
func BenchmarkAllocatorChurn(b *testing.B) {
	lay, err := NewLayout(llama70b, 4, 1, 1)
	if err != nil {
		b.Fatal(err)
	}
	a := newAllocator(lay, 64<<30)
	rng := rand.New(rand.NewPCG(1, 1))
	var live []span
	total := int64(4 * 64 << 30)
	var used int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if used < total*8/10 || len(live) == 0 {
			for _, sp := range a.alloc(1+rng.IntN(64), MaxRunChunks(llama70b), 8) {
				live = append(live, sp)
				used += sp.n
			}
			continue
		}
		k := rng.IntN(len(live))
		sp := live[k]
		live[k] = live[len(live)-1]
		live = live[:len(live)-1]
		if err := a.free(sp.file(lay), extent{sp.off, sp.n}); err != nil {
			b.Fatal(err)
		}
		used -= sp.n
	}
	b.ReportMetric(float64(len(live)), "live_runs")
}

// BenchmarkCommit measures Commit (header pwrite + pool fdatasync + journal
// group commit) of one-chunk runs, from one goroutine and from many; the
// syncs/commit metric shows group commit at work.
func BenchmarkCommit(b *testing.B) {
	for _, par := range []int{1, 8} {
		name := "serial"
		if par > 1 {
			name = "parallel8"
		}
		b.Run(name, func(b *testing.B) {
			o := Options{Dirs: []string{filepath.Join(b.TempDir(), "s")}, CapacityBytes: 1 << 30, Geometry: tinyGeom}
			m, err := Open(o)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			crcs := make([]uint32, tinyGeom.Layers) // one chunk per run
			b.SetParallelism(par)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := m.Allocate(1)
					if err != nil {
						b.Error(err)
						return
					}
					if err := m.Commit([]CommitRequest{{Res: res[0], Chain: []uint64{uint64(res[0].ID)}, ChunkCRCs: crcs}}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			s := m.Stats()
			b.ReportMetric(float64(s.JournalSyncs)/float64(s.Commits), "journal_syncs/commit")
			b.ReportMetric(float64(s.PoolSyncs)/float64(s.Commits), "pool_syncs/commit")
		})
	}
}

// BenchmarkRecovery measures Open of a store holding 2,000 runs (checkpoint
// or journal replay plus one header read per run).
func BenchmarkRecovery(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "s")
	o := Options{Dirs: []string{dir}, CapacityBytes: 256 << 20, Geometry: tinyGeom}
	m, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	crcs := make([]uint32, tinyGeom.Layers) // one chunk per run
	const runs = 2000
	for i := 0; i < runs/100; i++ {
		var reqs []CommitRequest
		for k := 0; k < 100; k++ {
			res, err := m.Allocate(1)
			if err != nil {
				b.Fatal(err)
			}
			reqs = append(reqs, CommitRequest{Res: res[0], Chain: []uint64{uint64(res[0].ID)}, ChunkCRCs: crcs})
		}
		if err := m.Commit(reqs); err != nil {
			b.Fatal(err)
		}
	}
	m.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m, err := Open(o)
		if err != nil {
			b.Fatal(err)
		}
		if r := m.Recovery().Recovered; r != runs {
			b.Fatalf("recovered %d", r)
		}
		m.Close()
	}
	b.ReportMetric(float64(runs), "runs")
}

// BenchmarkRebuildFromHeaders measures a read-only Open of a store of
// 2,000 runs whose journal was deleted: the scan of every pool block for
// headers (a 256 MiB pool) and the payload check of every run found.
// Compare with BenchmarkRecovery (the same store with its journal).
func BenchmarkRebuildFromHeaders(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "s")
	o := Options{Dirs: []string{dir}, CapacityBytes: 256 << 20, Geometry: tinyGeom}
	m, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	// The payload is the pool's zeros: one chunk's CRC for every chunk.
	zero := CRC32C(make([]byte, tinyGeom.ChunkBytesPerLayer()))
	crcs := slices.Repeat([]uint32{zero}, tinyGeom.Layers)
	const runs = 2000
	for i := 0; i < runs/100; i++ {
		var reqs []CommitRequest
		for k := 0; k < 100; k++ {
			res, err := m.Allocate(1)
			if err != nil {
				b.Fatal(err)
			}
			reqs = append(reqs, CommitRequest{Res: res[0], Chain: []uint64{uint64(res[0].ID)}, ChunkCRCs: crcs})
		}
		if err := m.Commit(reqs); err != nil {
			b.Fatal(err)
		}
	}
	m.Close()
	if err := os.Remove(filepath.Join(dir, segmentName(1))); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var scanned int64
	for i := 0; i < b.N; i++ {
		m, err := Open(Options{Dirs: []string{dir}, ReadOnly: true})
		if err != nil {
			b.Fatal(err)
		}
		rep := m.Recovery()
		if !rep.Rebuilt || rep.HeaderRuns != runs {
			b.Fatalf("rebuild: %v", rep)
		}
		scanned = rep.ScannedBytes
		m.Close()
	}
	b.ReportMetric(float64(runs), "runs")
	b.ReportMetric(float64(scanned)/(1<<20), "MiB_scanned")
}
