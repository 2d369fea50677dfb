package harness

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/eval/model"
)

func TestPhasesSumToWall(t *testing.T) {
	c := phaseClock{restore: 2 * time.Second, save: time.Second, verify: 500 * time.Millisecond, scribble: 250 * time.Millisecond}
	p := c.phases(5 * time.Second)
	if math.Abs(p.OtherS-1.25) > 1e-9 || math.Abs(p.HarnessS()-2) > 1e-9 {
		t.Fatalf("other %v harness %v, want 1.25 and 2", p.OtherS, p.HarnessS())
	}
	if q := c.phases(time.Second); q.OtherS != 0 {
		t.Fatalf("other %v: never negative", q.OtherS)
	}
	if s := p.String(); !strings.HasPrefix(s, "wall 5.0 s = restore 2.0 + save 1.0 | harness 2.0: verify 0.5") {
		t.Fatalf("line %q", s)
	}
}

// Every backend's result carries its phases, whose parts add up to at most
// its wall time, with the verified bytes those it restored; the progress
// callback sees them grow.
func TestRunReportsPhases(t *testing.T) {
	p, _ := model.Lookup("tiny")
	comp, _ := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	var calls int
	var last Phases
	res, err := Run(context.Background(), Config{Requests: synthetic(16), Profile: p, Dir: t.TempDir(),
		Backends: []Backend{NewDRAM(), NewLMCacheDisk(), Recompute{}}, Compute: comp, CeilingBytes: -1,
		PhaseProgress: func(_ string, done, total int, ph Phases) { calls++; last = ph }})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 3*16 || last.WallS <= 0 {
		t.Fatalf("%d progress calls, last %+v", calls, last)
	}
	for _, b := range res.Backends {
		ph := b.Phases
		if ph == nil {
			t.Fatalf("%s: no phases", b.Backend)
		}
		parts := ph.RestoreS + ph.SaveS + ph.ScribbleS + ph.InvalidateS + ph.ToHostS + ph.FromHostS + ph.VerifyS + ph.FillS + ph.PrefillWaitS + ph.OtherS
		// Other is what the phases leave of the wall: they add up to it
		// (Other 0 only when the measured parts exceed it by rounding).
		if parts > ph.WallS+1e-6 || (ph.OtherS > 0 && math.Abs(parts-ph.WallS) > 1e-6) {
			t.Fatalf("%s: parts %v, wall %v", b.Backend, parts, ph.WallS)
		}
		if b.Backend == "recompute" {
			if ph.VerifiedBytes != 0 || ph.FilledBytes != 0 {
				t.Fatalf("recompute verified %d, filled %d bytes", ph.VerifiedBytes, ph.FilledBytes)
			}
			continue
		}
		if ph.VerifiedBytes != b.RestoredBytes || ph.VerifiedBytes == 0 || ph.FilledBytes == 0 || ph.ScribbleS <= 0 {
			t.Fatalf("%s: verified %d of %d restored bytes, filled %d, scribble %v s", b.Backend, ph.VerifiedBytes, b.RestoredBytes, ph.FilledBytes, ph.ScribbleS)
		}
	}
}

// Without a GPU the compute is the model's for every request, and nothing
// runs live; the live schedule and the note follow SetLiveEvery.
func TestGPULiveWithoutGPU(t *testing.T) {
	p, _ := model.Lookup("llama3-8b")
	comp, _ := NewCompute(p, DefaultGPUFLOPs, DefaultLayerFixedNs)
	var g *GPUCompute
	g.SetLiveEvery(8, &comp) // nil-safe
	if g.Live(0) || g.LiveEvery() != 0 {
		t.Fatal("a nil GPU runs nothing live")
	}
	d, err := g.Layer(false, nil, comp, 4096, 8192)
	if err != nil || d != comp.Layer(4096, 8192) || d <= 0 {
		t.Fatalf("layer %v, %v; want the model's %v", d, err, comp.Layer(4096, 8192))
	}
	live := &GPUCompute{every: 4}
	var n int
	for seq := 0; seq < 16; seq++ {
		if live.Live(seq) {
			n++
		}
	}
	if n != 4 || !live.Live(0) || live.Live(1) {
		t.Fatalf("every 4th of 16: %d live", n)
	}
	// Calibrated requests take the model's time and are counted.
	if d, err := live.Layer(false, nil, comp, 100, 0); err != nil || d != comp.Layer(100, 0) || live.stats.Calibrated != 1 {
		t.Fatalf("calibrated layer %v, %v, %d counted", d, err, live.stats.Calibrated)
	}
	if got := (&GPUCompute{every: 1}).LiveEvery(); got != 1 {
		t.Fatalf("every %d", got)
	}
	gs := GPUComputeStats{Calibrated: 7, LiveRatios: []float64{1.1, 0.9, 1.0},
		LiveFirstRatios: []float64{5, 6, 7}, LiveRestRatios: []float64{1, 1, 1}}
	note := gs.liveNote(4)
	for _, want := range []string{"7 prefills' layer times from the model", "every 4-th", "3 checks", "median 1.000", "min 0.900", "max 1.100",
		"first layer's time/model median 6.000", "other layers' median layer/model median 1.000"} {
		if !strings.Contains(note, want) {
			t.Fatalf("note %q lacks %q", note, want)
		}
	}
	if gs.liveNote(1) != "" {
		t.Fatal("every request measured: no calibration note")
	}
}
