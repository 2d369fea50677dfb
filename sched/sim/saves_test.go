package sim

import (
	"path/filepath"
	"testing"

	"github.com/tutti-io/tutti/sched"
)

// TestSavesDoNotDelayRestores: the scheduler puts saves into the slack of
// restores, so the GPU waits for reads about as long as when save writes
// cost the devices nothing (FreeWrites); FIFO, which issues saves in line
// with the reads, makes restores wait behind them.
func TestSavesDoNotDelayRestores(t *testing.T) {
	history, reqs := window(t, filepath.Join("testdata", "conversation_8500_800.jsonl"), 500, 300, 500, winScale)
	wait := func(p Policy, free bool, seed uint64) (idleNs, saved int64) {
		cfg := worldConfig(t, seed, p)
		cfg.FreeWrites = free
		res, err := Run(cfg, history, reqs)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("seed %d %v, free writes %v: GPU waited %.3f s for reads, %d blocks saved", seed, p, free, float64(res.GPUIdleNs)/1e9, res.SavedBlocks)
		return res.GPUIdleNs, res.SavedBlocks
	}
	for seed := uint64(1); seed <= 3; seed++ {
		free, _ := wait(PolicyScheduler, true, seed)
		real, saved := wait(PolicyScheduler, false, seed)
		if saved == 0 {
			t.Fatalf("seed %d: nothing saved: the test shows nothing", seed)
		}
		// Within 10 % and 0.5 s of the free-writes run.
		if float64(real) > 1.1*float64(free)+0.5e9 {
			t.Errorf("seed %d: saves delayed restores: GPU waited %.3f s, %.3f s with free writes", seed, float64(real)/1e9, float64(free)/1e9)
		}
		ffree, _ := wait(PolicyFIFO, true, seed)
		freal, _ := wait(PolicyFIFO, false, seed)
		if float64(freal) < 1.1*float64(ffree)+0.5e9 {
			t.Errorf("seed %d: FIFO's saves do not delay its restores (%.3f s, %.3f s free): the world does not make saves cost reads", seed, float64(freal)/1e9, float64(ffree)/1e9)
		}
	}
}

// With the planner's defaults (2 s save bound, default device limits) and
// hardware as profiled: a save the idle device writes within its bound at
// the full write rate keeps every block, although restores start next to
// it before it is written (they wait where it would otherwise miss the
// bound); a save larger than the device writes within the bound is cut,
// counted as ReasonSaveBound. No save runs past its bound.
func TestDefaultBudgetKeepsWritableSaves(t *testing.T) {
	const B = 512
	cfg := worldConfig(t, 1, PolicyScheduler)
	cfg.ComputeSkew, cfg.ReadSkew, cfg.WriteSkew, cfg.NoiseFrac, cfg.ComputeNoiseFrac = 1, 1, 1, 0, 0
	cfg.Devices, cfg.SaveBoundNs, cfg.PlannerDevice, cfg.MaxWriteIOBytes = 1, 0, sched.DeviceConfig{}, 0
	blockWriteNs := float64(cfg.Layers) * float64(cfg.BytesPerLayerPerBlock) * 1e9 / cfg.Device.WriteBytesPerSec
	fit := int(0.9 * 2e9 / blockWriteNs)    // 0.9 of the bound at the full rate
	tooBig := int(1.5 * 2e9 / blockWriteNs) // 1.5 bounds
	ids := func(from, n int) []uint64 {
		v := make([]uint64, n)
		for i := range v {
			v[i] = uint64(from + i)
		}
		return v
	}
	history := []Request{{BlockIDs: ids(1<<20, 64), InputTokens: 64 * B}} // resident, restored by the reader
	saver := Request{ArrivalNs: 0, InputTokens: fit*B + 1, BlockIDs: ids(0, fit)}
	solo, err := Run(cfg, history, []Request{saver})
	if err != nil {
		t.Fatal(err)
	}
	// The reader arrives just after the saver's prefill ends, when its save
	// was admitted to an idle device.
	reader := Request{ArrivalNs: solo.TTFTNs[0] + 1e6, InputTokens: 64*B + 1, BlockIDs: ids(1<<20, 64)}
	big := Request{ArrivalNs: reader.ArrivalNs + 10e9, InputTokens: tooBig*B + 1, BlockIDs: ids(1<<10, tooBig)}
	res, err := Run(cfg, history, []Request{saver, reader, big})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("save of %d blocks (%.2f s of writes), then a %d-block prefix (%d restored), then a %d-block save: saved %d, cut %v, max save %.3f s, %d read holds, %d writes promoted",
		fit, float64(fit)*blockWriteNs/1e9, 64, res.LoadedBlocks, tooBig, res.SavedBlocks, res.CutBlocks, float64(res.MaxSaveNs)/1e9, res.Planner.ReadHolds, res.Planner.WritesPromoted)
	if res.LoadedBlocks == 0 {
		t.Fatalf("the reader restored nothing: no restore ran beside the save")
	}
	if res.SaveBoundMisses > 0 || res.MaxSaveNs > 2e9 {
		t.Errorf("%d saves past the 2 s bound (max %.3f s)", res.SaveBoundMisses, float64(res.MaxSaveNs)/1e9)
	}
	bigKept := res.SavedBlocks - int64(fit)
	if res.CutBlocks[sched.ReasonSaveBound] != int64(tooBig)-bigKept || bigKept <= 0 || bigKept >= int64(tooBig) {
		t.Errorf("saved %d blocks, cut %v: want all %d of the first save and part of the %d-block one, the rest cut as %v",
			res.SavedBlocks, res.CutBlocks, fit, tooBig, sched.ReasonSaveBound)
	}
	if res.DroppedBlocks != res.CutBlocks[sched.ReasonSaveBound] {
		t.Errorf("dropped %d blocks, %v by reason", res.DroppedBlocks, res.CutBlocks)
	}
}
