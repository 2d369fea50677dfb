package prefix

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU returns the CPU time of the calling OS thread. Benchmarks lock their goroutine to its
// thread and report CPU ns per block next to wall ns: on the shared 2-core dev VM wall time
// includes time other processes took, CPU time does not.
func threadCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// perBlock reports wall and CPU ns per block for a loop that started at cpu0.
func perBlock(b *testing.B, cpu0 time.Duration, blocks int) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(blocks), "ns/block")
	b.ReportMetric(float64((threadCPU(b)-cpu0).Nanoseconds())/float64(blocks), "cpu-ns/block")
}

const (
	benchBlocks   = 10_000_000
	benchChainLen = 24 // the Mooncake trace's mean: 12,035 tokens / 512-token blocks
	benchChains   = benchBlocks / benchChainLen
)

// benchID is block k of chain c: a fixed pseudo-random id (splitmix64 finalizer), so chains can be
// regenerated instead of stored (their storage would distort the memory figure and the caches).
func benchID(c, k int) uint64 {
	z := uint64(c*benchChainLen+k) + 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func benchChain(dst []uint64, c int) []uint64 {
	dst = dst[:0]
	for k := 0; k < benchChainLen; k++ {
		dst = append(dst, benchID(c, k))
	}
	return dst
}

var big struct {
	once          sync.Once
	x             *Index
	bytesPerBlock float64
	setup         time.Duration
}

// bigIndex builds, once per process, an index of 10M resident blocks (independent random chains of
// 24, saved through Reserve and Commit) and measures its heap bytes per block.
func bigIndex(b *testing.B) *Index {
	big.once.Do(func() {
		start := time.Now()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		x, err := New(Config{CapacityBytes: MaxCapacityBytes})
		if err != nil {
			b.Fatal(err)
		}
		chain := make([]uint64, 0, benchChainLen)
		for c := 0; c < benchChains; c++ {
			chain = benchChain(chain, c)
			r, err := x.Reserve(chain, 0, 1<<20)
			if err != nil || r.N != benchChainLen {
				b.Fatalf("reserve chain %d: %d %s %v", c, r.N, r.Stop, err)
			}
			if _, err := x.Commit(chain, chain); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		big.x = x
		big.bytesPerBlock = float64(after.HeapAlloc-before.HeapAlloc) / float64(x.Stats().Blocks)
		big.setup = time.Since(start)
	})
	return big.x
}

// BenchmarkLookup: full-hit lookups of random chains of 24 blocks in an index of 10M resident
// blocks (random ids and chains: every block is a cache miss). ns/block includes regenerating the
// chain's ids (~1 ns each). bytes/block is the index's heap at 10M blocks.
func BenchmarkLookup(b *testing.B) {
	x := bigIndex(b)
	rng := rand.New(rand.NewPCG(1, 1))
	chain := make([]uint64, 0, benchChainLen)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ResetTimer()
	cpu0 := threadCPU(b)
	for i := 0; i < b.N; i++ {
		chain = benchChain(chain, rng.IntN(benchChains))
		if n := x.Lookup(chain); n != benchChainLen {
			b.Fatalf("hit %d", n)
		}
	}
	perBlock(b, cpu0, b.N*benchChainLen)
	b.ReportMetric(big.bytesPerBlock, "bytes/block")
	b.ReportMetric(big.setup.Seconds(), "setup-s")
}

// BenchmarkPinUnpin: Pin (with locations) then Unpin of random 24-block chains at 10M blocks.
func BenchmarkPinUnpin(b *testing.B) {
	x := bigIndex(b)
	rng := rand.New(rand.NewPCG(2, 2))
	chain := make([]uint64, 0, benchChainLen)
	locs := make([]uint64, 0, benchChainLen)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ResetTimer()
	cpu0 := threadCPU(b)
	for i := 0; i < b.N; i++ {
		chain = benchChain(chain, rng.IntN(benchChains))
		var n int
		if n, locs = x.Pin(chain, locs[:0]); n != benchChainLen {
			b.Fatalf("pinned %d", n)
		}
		if _, err := x.Unpin(chain); err != nil {
			b.Fatal(err)
		}
	}
	perBlock(b, cpu0, b.N*benchChainLen)
}

// BenchmarkSaveEvict: steady state of a full index of 1M blocks: each iteration reserves a new
// 24-block chain (evicting 24 LRU leaves) and commits it.
func BenchmarkSaveEvict(b *testing.B) {
	const blocks = 1_000_000
	x, err := New(Config{CapacityBytes: blocks})
	if err != nil {
		b.Fatal(err)
	}
	chain := make([]uint64, 0, benchChainLen)
	c := 0
	save := func() int {
		chain = benchChain(chain, c)
		c++
		r, err := x.Reserve(chain, 0, 1)
		if err != nil || r.N != benchChainLen {
			b.Fatalf("reserve: %d %s %v", r.N, r.Stop, err)
		}
		if _, err := x.Commit(chain, chain); err != nil {
			b.Fatal(err)
		}
		return len(r.Evicted)
	}
	for x.Stats().Blocks+benchChainLen <= blocks {
		save()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ResetTimer()
	cpu0 := threadCPU(b)
	evicted := 0
	for i := 0; i < b.N; i++ {
		evicted += save()
	}
	perBlock(b, cpu0, b.N*benchChainLen)
	b.ReportMetric(float64(evicted)/float64(b.N*benchChainLen), "evictions/block")
}

// BenchmarkChainFromTokens: a 32K-token prompt in 512-token chunks (64 ids).
func BenchmarkChainFromTokens(b *testing.B) {
	tokens := make([]uint32, 32768)
	for i := range tokens {
		tokens[i] = uint32(i * 2654435761)
	}
	dst := make([]uint64, 0, 64)
	b.SetBytes(int64(4 * len(tokens)))
	for i := 0; i < b.N; i++ {
		dst, _ = ChainFromTokens(dst[:0], tokens, 512, 0)
	}
}
