package harness

import (
	"context"
	"testing"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/trace"
	"github.com/tutti-io/tutti/uring"
	"github.com/tutti-io/tutti/uring/uringsim"
)

// synthetic returns requests that share prefixes: request i extends the
// chain of request i/2 (so about half its blocks were seen before).
func synthetic(n int) []trace.Request {
	var reqs []trace.Request
	next := uint64(1)
	for i := 0; i < n; i++ {
		var chain []uint64
		if i > 0 {
			chain = append(chain, reqs[i/2].HashIDs...)
		}
		for k := 0; k < 1+i%3; k++ {
			chain = append(chain, next)
			next++
		}
		reqs = append(reqs, trace.Request{Line: i + 1, TimestampMs: float64(i * 100), ArrivalMs: float64(i * 100),
			InputTokens: len(chain)*512 - 100, OutputTokens: 10, HashIDs: chain})
	}
	return reqs
}

func TestRunAllCPUBackends(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, err := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	if err != nil {
		t.Fatal(err)
	}
	for _, capBlocks := range []int{0, 12} { // everything fits; eviction
		reqs := synthetic(24)
		res, err := Run(context.Background(), Config{
			Requests: reqs, Profile: p, Dir: t.TempDir(), CapacityBlocks: capBlocks,
			Backends: []Backend{NewPageCache(), NewPerBlock(), NewCuFileStandIn(), NewLMCacheDisk(), NewLMCacheGDS(), NewVLLMFS(), NewDRAM(), Recompute{}, NewTuttiCPU(&comp)},
			Compute:  comp, EBPF: true, CeilingBytes: -1,
		})
		if err != nil {
			t.Fatal(err)
		}
		var hits []int64
		for _, b := range res.Backends {
			if b.Skipped != "" {
				t.Logf("%s skipped: %s", b.Backend, b.Skipped)
				continue
			}
			if b.Requests != len(reqs) {
				t.Fatalf("%s served %d requests, want %d", b.Backend, b.Requests, len(reqs))
			}
			if b.VerifyMismatches != 0 || b.Fallbacks != 0 {
				t.Fatalf("%s: %d mismatches, %d fallbacks", b.Backend, b.VerifyMismatches, b.Fallbacks)
			}
			if b.DirectIO && b.DeviceReadBytes < uint64(b.RestoredBytes) {
				t.Fatalf("%s: device read %d bytes < restored %d (%s)", b.Backend, b.DeviceReadBytes, b.RestoredBytes, b.DeviceBytesSource)
			}
			if b.Backend == "tutti-cpu" {
				// Its own index and planner: at least it restores, and in one read per (layer, run).
				if b.HitBlocks == 0 || b.IOsPerLayerRequestMean > b.RunsPerRequestMean+1e-9 {
					t.Fatalf("tutti-cpu: %d hit blocks, %.2f I/Os per layer and request, %.2f runs per request",
						b.HitBlocks, b.IOsPerLayerRequestMean, b.RunsPerRequestMean)
				}
			} else if b.Backend != "recompute" {
				hits = append(hits, b.HitBlocks)
				if b.HitBlocks == 0 || b.RestoredBytes != b.HitBlocks*p.BlockBytes() {
					t.Fatalf("%s: %d hit blocks, %d bytes", b.Backend, b.HitBlocks, b.RestoredBytes)
				}
			} else if b.HitBlocks != 0 {
				t.Fatal("recompute restored something")
			}
			if capBlocks > 0 && b.Backend != "recompute" && b.Backend != "tutti-cpu" && b.EvictedBlocks == 0 {
				t.Fatalf("%s: capacity %d but nothing evicted", b.Backend, capBlocks)
			}
			if len(b.TTFTms) != len(reqs) || b.TTFTmsP50 <= 0 {
				t.Fatalf("%s: TTFTs %v", b.Backend, b.TTFTms)
			}
			t.Logf("cap %d %s: hits %d, %.0f I/Os per request, device %d B (%s), ttft p50 %.2f ms",
				capBlocks, b.Backend, b.HitBlocks, b.IOsPerRequestMean, b.DeviceReadBytes, b.DeviceBytesSource, b.TTFTmsP50)
		}
		// Same cache policy: every storing backend hit the same blocks.
		for _, h := range hits {
			if h != hits[0] {
				t.Fatalf("cap %d: hit blocks differ between backends: %v", capBlocks, hits)
			}
		}
	}
}

// TestPerBlockFaults injects EIO into reads (uring's simulated engine, real
// file I/O): a failed read makes its block and the rest of the prefix a miss,
// counted as a fallback, and no wrong byte is ever served.
func TestPerBlockFaults(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, _ := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	for _, seed := range []uint64{1, 2} {
		pb := NewPerBlock()
		pb.NewEngine = func(qd int) (uring.Engine, error) {
			return uringsim.New(uringsim.Config{Seed: seed, MaxInFlight: qd,
				Injectors: []uringsim.Injector{&uringsim.EIO{P: 0.002, Ops: uringsim.ReadOps}}}), nil
		}
		res, err := Run(context.Background(), Config{Requests: synthetic(16), Profile: p, Dir: t.TempDir(),
			Backends: []Backend{pb}, Compute: comp, CeilingBytes: -1})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		b := res.Backends[0]
		if b.VerifyMismatches != 0 || b.Requests != 16 {
			t.Fatalf("seed %d: %d mismatches, %d requests", seed, b.VerifyMismatches, b.Requests)
		}
		if b.Fallbacks == 0 {
			t.Fatalf("seed %d: no fallback counted under EIO injection (%d hit blocks)", seed, b.HitBlocks)
		}
		t.Logf("seed %d: %d fallbacks, %d blocks restored", seed, b.Fallbacks, b.HitBlocks)
	}
}

// Requests whose KV exceeds the engine memory bound are left out for every
// backend, and counted.
func TestOversizeLeftOut(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, _ := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	reqs := synthetic(12) // chains grow to 7 blocks
	res, err := Run(context.Background(), Config{Requests: reqs, Profile: p, Dir: t.TempDir(), Compute: comp,
		CeilingBytes: -1, MaxKVBytes: 4 * p.BlockBytes(), Backends: []Backend{NewDRAM(), Recompute{}}})
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, r := range reqs {
		if len(r.HashIDs) > 4 {
			want++
		}
	}
	if want == 0 || res.Oversize != want {
		t.Fatalf("left out %d, want %d", res.Oversize, want)
	}
	for _, b := range res.Backends {
		if b.Requests != len(reqs)-want {
			t.Fatalf("%s served %d", b.Backend, b.Requests)
		}
	}
}
