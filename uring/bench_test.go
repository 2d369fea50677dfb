package uring

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// benchRandRead keeps qd reads of bs bytes in flight at random aligned
// offsets of a 64 MiB O_DIRECT file and reports bytes/s through b.SetBytes.
func benchRandRead(b *testing.B, cfg Config, bs, qd int) {
	const fileBytes = 64 << 20
	r := newRingOrSkip(b, cfg)
	f, _ := directFile(b, b.TempDir(), fileBytes, 1)
	buf := mustBuffer(b, bs*qd)
	cs := make([]Completion, qd)
	rng := rand.New(rand.NewPCG(1, 2))
	blocks := uint64(fileBytes / bs)
	left := b.N
	var cb func(c *Completion)
	cb = func(c *Completion) {
		if c.Err != nil {
			b.Fatal(c.Err)
		}
		if left > 0 {
			left--
			c.PrepRead(f, c.addr, uint32(bs), rng.Uint64N(blocks)*uint64(bs))
			c.Callback = cb
			if err := r.Submit(c); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.SetBytes(int64(bs))
	b.ResetTimer()
	for i := range cs {
		if left == 0 {
			break
		}
		left--
		cs[i].PrepRead(f, buf.Addr()+uintptr(i*bs), uint32(bs), rng.Uint64N(blocks)*uint64(bs))
		cs[i].Callback = cb
		if err := r.Submit(&cs[i]); err != nil {
			b.Fatal(err)
		}
	}
	for r.InFlight() > 0 {
		if err := r.Flush(1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRead4KQD64(b *testing.B) {
	benchRandRead(b, Config{Entries: 64, SQThreadCPU: -1}, 4096, 64)
}

func BenchmarkRead4KQD64SQPoll(b *testing.B) {
	benchRandRead(b, Config{Entries: 64, SQThreadCPU: -1, SQPoll: true, SQThreadIdleMs: 100}, 4096, 64)
}

func BenchmarkRead1MQD16(b *testing.B) {
	benchRandRead(b, Config{Entries: 16, SQThreadCPU: -1}, 1<<20, 16)
}

// BenchmarkPread4K8 is the baseline: 8 goroutines doing pread(2).
func BenchmarkPread4K8(b *testing.B) {
	const fileBytes, bs, workers = 64 << 20, 4096, 8
	f, _ := directFile(b, b.TempDir(), fileBytes, 1)
	buf := mustBuffer(b, bs*workers)
	b.SetBytes(bs)
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		n := b.N / workers
		if w < b.N%workers {
			n++
		}
		wg.Add(1)
		go func(w, n int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for i := 0; i < n; i++ {
				if _, err := Pread(f, buf.Addr()+uintptr(w*bs), bs, rng.Uint64N(fileBytes/bs)*bs); err != nil {
					b.Error(err)
					return
				}
			}
		}(w, n)
	}
	wg.Wait()
}

// BenchmarkNop measures the ring itself: submit and reap of NOPs, 32 deep.
func BenchmarkNop(b *testing.B) {
	r := newRingOrSkip(b, Config{Entries: 32, SQThreadCPU: -1})
	cs := make([]Completion, 32)
	b.ResetTimer()
	for done := 0; done < b.N; {
		k := min(32, b.N-done)
		for i := 0; i < k; i++ {
			cs[i].PrepNop()
			if err := r.Submit(&cs[i]); err != nil {
				b.Fatal(err)
			}
		}
		if err := r.Flush(k); err != nil {
			b.Fatal(err)
		}
		done += k
	}
}
