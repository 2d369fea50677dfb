package sched

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestFitComputeRecoversProfile(t *testing.T) {
	want := testCompute(t)
	rng := rand.New(rand.NewPCG(3, 3))
	var pts []LayerPoint
	for i := 0; i < 60; i++ {
		n, s := 1+rng.IntN(8192), rng.IntN(128<<10)
		pts = append(pts, LayerPoint{Tokens: n, StartPos: s, Ns: want.LayerNs(n, s) * (1 + 0.01*(2*rng.Float64()-1))})
	}
	got, err := FitCompute(pts)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want float64
		tol       float64
	}{
		{"per token", got.PerTokenNs, want.PerTokenNs, 0.05},
		{"per pair", got.PerPairNs, want.PerPairNs, 0.05},
	} {
		if math.Abs(c.got-c.want) > c.tol*c.want {
			t.Errorf("%s: fitted %g, profile %g", c.name, c.got, c.want)
		}
	}
	if _, err := FitCompute(pts[:1]); err == nil {
		t.Error("one point: no error")
	}
	if _, err := FitCompute([]LayerPoint{{Tokens: 0, Ns: 1}, {Tokens: 1, Ns: 1}}); err == nil {
		t.Error("zero tokens: no error")
	}
}

func TestComputeObserveBounded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ratio  float64 // measured ÷ profile
		steps  int
		lo, hi float64 // scale after
	}{
		{"twice slower converges", 2, 200, 1.95, 2.05},
		{"half converges", 0.5, 200, 0.49, 0.51},
		{"one outlier moves ≤ 2^(1/8)", 100, 1, 1, 1.0906},
		{"clamped at 16", 1000, 5000, 16 * 0.999, 16 * 1.001},
		{"clamped at 1/16", 1e-6, 5000, 1.0 / 16 * 0.999, 1.0 / 16 * 1.001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testCompute(t)
			for i := 0; i < tc.steps; i++ {
				n, s := 512, 4096*i%65536
				m.Observe(n, s, int64(tc.ratio*m.baseNs(n, s)))
			}
			if sc := m.Scale(); sc < tc.lo || sc > tc.hi {
				t.Fatalf("scale %v, want [%v, %v]", sc, tc.lo, tc.hi)
			}
		})
	}
}

func TestDeviceObserve(t *testing.T) {
	m, err := NewDeviceModel(testDevice(2))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 300; i++ { // 1 MiB reads at 1 GB/s alone, 0.3 GB/s under writes; 4 KiB at 100K IOPS
		const mib64 = 64 << 20
		m.ObserveReads(mib64, 64, mib64, false) // ns = bytes at 1 GB/s
		m.ObserveReads(mib64, 64, mib64*10/3, true)
		m.ObserveReads(4096*100, 100, 1e6, false)
		m.ObserveWrites(mib64, 16, mib64*2, false)
	}
	p := m.Profile()
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"read bandwidth", p.ReadBytesPerSec, 1e9},
		{"read share", p.ReadShareUnderWrites, 0.3},
		{"read IOPS", p.ReadIOPS, 100e3},
		{"write bandwidth", p.WriteBytesPerSec, 0.5e9},
	} {
		if math.Abs(c.got-c.want) > 0.03*c.want {
			t.Errorf("%s: %g, want %g", c.name, c.got, c.want)
		}
	}
	before := m.Profile()
	m.ObserveReads(0, 1, 1, false)
	m.ObserveReads(1, 0, 1, false)
	m.ObserveReads(1, 1, 0, false)
	if m.Profile() != before {
		t.Error("nonsense observations changed the model")
	}
	if _, err := NewDeviceModel(DeviceProfile{}); err == nil {
		t.Error("zero profile: no error")
	}
}

// TestRemeasureReads: a fresh measurement replaces the read bandwidth and
// the seed that bounds later corrections, so a model seeded far too low
// (the device was busy when it was probed) can reach the device's rate; bad
// rates and devices are refused and change nothing.
func TestRemeasureReads(t *testing.T) {
	seed := DeviceProfile{ReadBytesPerSec: 1e6, WriteBytesPerSec: 1e9, ReadIOPS: 1e5, WriteIOPS: 1e5,
		ReadLatencyNs: 1e5, ReadShareUnderWrites: 0.5, WriteShareUnderReads: 0.5}
	m, err := NewDeviceModel(seed)
	if err != nil {
		t.Fatal(err)
	}
	// Corrections alone stop at 16x the seed, however fast the reads.
	for range 200 {
		m.ObserveReads(64<<20, 64, 64<<20*1e9/4e9, false)
	}
	bound := m.Profile().ReadBytesPerSec
	if math.Abs(bound-16e6) > 1 {
		t.Fatalf("after corrections: %g B/s, want the bound 16e6", bound)
	}
	for _, bad := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		if err := m.RemeasureReads(bad); err == nil || m.Profile().ReadBytesPerSec != bound {
			t.Fatalf("RemeasureReads(%v): err %v, rate %g", bad, err, m.Profile().ReadBytesPerSec)
		}
	}
	if err := m.RemeasureReads(3e9); err != nil || m.Profile().ReadBytesPerSec != 3e9 {
		t.Fatalf("RemeasureReads(3e9): err %v, rate %g", err, m.Profile().ReadBytesPerSec)
	}
	for range 200 {
		m.ObserveReads(64<<20, 64, 64<<20*1e9/4e9, false)
	}
	if got := m.Profile().ReadBytesPerSec; math.Abs(got-4e9) > 0.01*4e9 {
		t.Fatalf("corrections after the remeasure: %g B/s, want about the observed 4e9", got)
	}
	if w := m.Profile().WriteBytesPerSec; w != seed.WriteBytesPerSec {
		t.Fatalf("write rate changed to %g", w)
	}
	p := testPlanner(t, 2)
	if err := p.RemeasureReads(len(p.devs), 1e9); err == nil {
		t.Fatal("device out of range: no error")
	}
}
