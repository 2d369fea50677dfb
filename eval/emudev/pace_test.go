package emudev

import (
	"math/rand/v2"
	"testing"
)

func TestPacerHoldsItsRate(t *testing.T) {
	for _, tc := range []struct {
		name        string
		rate        int64
		gapNs       int64 // idle between bursts
		burst, size int64 // requests per burst and their bytes
	}{
		{"saturated 1 MiB", 1_500_000_000, 0, 64, 1 << 20},
		{"after idle spells", 1_500_000_000, 200_000_000, 8, 1 << 20},
		{"small requests", 300_000_000, 1_000_000, 256, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &pacer{bytesPerSec: tc.rate}
			now := int64(1_000_000)
			for b := 0; b < 5; b++ {
				first := now
				var last int64
				for i := int64(0); i < tc.burst; i++ {
					last = p.reserve(now, tc.size)
				}
				// a burst's bytes take exactly their time at the rate,
				// however long the device was idle before it
				want := first + (tc.burst*tc.size*1_000_000_000+tc.rate-1)/tc.rate
				if last < want || last > want+tc.burst {
					t.Fatalf("burst %d done at %d ns, want %d (+ rounding)", b, last, want)
				}
				now = last + tc.gapNs
			}
		})
	}
}

func TestPacerConcurrentArrivals(t *testing.T) {
	// Requests arriving out of step still leave the device busy for exactly
	// their bytes: the last finish is the first arrival plus all bytes at
	// the rate whenever arrivals never leave it idle.
	r := rand.New(rand.NewPCG(1, 2))
	p := &pacer{bytesPerSec: 1_000_000_000}
	now, total, last := int64(0), int64(0), int64(0)
	for i := 0; i < 10_000; i++ {
		n := int64(4096 * (1 + r.IntN(256)))
		total += n
		last = p.reserve(now, n)
		now += int64(r.IntN(100)) // arrivals faster than the device serves
	}
	if want := total; last < want || last > want+10_000 {
		t.Fatalf("last request done at %d ns, want %d", last, want)
	}
	if got := (&pacer{}).reserve(42, 1<<20); got != 42 {
		t.Fatalf("unpaced reserve = %d, want now (42)", got)
	}
}
