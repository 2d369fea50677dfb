package sim

import (
	"path/filepath"
	"testing"
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
