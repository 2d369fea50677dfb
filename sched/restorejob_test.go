package sched

import (
	"errors"
	"math/rand/v2"
	"testing"
)

const (
	jobLayers     = 8
	jobBlockBytes = 1 << 20 // per layer per block
)

// jobPlanner: jobLayers layers, 16-token blocks, reads 2 GB/s and writes
// 1 GB/s per device, each direction at half its rate beside the other; a
// layer's compute is 0.2 ms per token computed, so loading a cached block
// beats recomputing it and a restore of 4 blocks per device reads a layer
// (2 ms) faster than the suffix computes it.
func jobPlanner(t testing.TB, devices int, writeIOBytes int64, writesInFlight int) *Planner {
	t.Helper()
	cm, err := NewComputeModel(0, 0.2e6, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Layers: jobLayers, BlockTokens: 16, Compute: cm, MaxWriteIOBytes: writeIOBytes}
	for range devices {
		cfg.Devices = append(cfg.Devices, DeviceConfig{Profile: DeviceProfile{ReadBytesPerSec: 2e9, WriteBytesPerSec: 1e9,
			ReadIOPS: 1e6, WriteIOPS: 1e6, ReadShareUnderWrites: 0.5, WriteShareUnderReads: 0.5}, MaxWritesInFlight: writesInFlight})
	}
	p, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func wholeRequest(id uint64, now int64, blocksPerDevice ...int) LoadRequest {
	req := LoadRequest{ID: id, NowNs: now, UncachedTokens: 16, Whole: true, SegmentsOnly: true}
	for d, b := range blocksPerDevice {
		req.Runs = append(req.Runs, Run{Device: d, Blocks: b, BytesPerLayerPerBlock: jobBlockBytes})
	}
	return req
}

func kinds(ios []IO) map[IOKind]int {
	m := map[IOKind]int{}
	for _, io := range ios {
		m[io.Kind]++
	}
	return m
}

// TestWholeRestoreHoldsSavesUntilRetired: a Whole plan is dispatched as one
// IORestore, no IORead; a save queued on one of its devices waits while the
// restore's reads are pending there (a read-bound plan's last layer has no
// slack), still waits after some layers are retired, and goes, not promoted,
// once Complete retired the rest; every budget is back to zero.
func TestWholeRestoreHoldsSavesUntilRetired(t *testing.T) {
	p := jobPlanner(t, 2, 0, 0)
	plan, err := p.PlanLoad(wholeRequest(1, 0, 8, 8)) // 4 ms of reads per layer, 3.2 ms of compute
	if err != nil || plan.LoadBlocks != 16 || plan.Reads != nil {
		t.Fatalf("plan %+v, %v: want all 16 blocks loaded, no read list", plan, err)
	}
	if _, err := p.EnqueueSave(SaveRequest{ID: 2, Device: 0, Blocks: 2, BytesPerLayerPerBlock: jobBlockBytes}); err != nil {
		t.Fatal(err)
	}
	ios := p.Dispatch(0, nil)
	if k := kinds(ios); len(ios) != 1 || k[IORestore] != 1 {
		t.Fatalf("dispatched %v: want the restore alone", k)
	}
	job := ios[0]
	if job.ReqID != 1 || job.Device != -1 || p.Stats().RestoresDispatched != 1 || p.Stats().ReadsDispatched != 2*jobLayers {
		t.Fatalf("restore %+v, stats %+v", job, p.Stats())
	}
	if p.devs[0].pendingReads != jobLayers || p.devs[0].jobsInFlight != 1 || p.devs[0].jobReadNs <= 0 {
		t.Fatalf("device 0 does not hold the restore's reads: %+v", p.devs[0])
	}
	if ios := p.Dispatch(1e6, nil); len(ios) != 0 {
		t.Fatalf("dispatched %v beside the restore in flight", kinds(ios))
	}
	if err := p.CompleteLayers(job.ID, jobLayers/2, 8e6); err != nil {
		t.Fatal(err)
	}
	if err := p.CompleteLayers(job.ID, 1, 8e6); err != nil { // already retired: nothing changes
		t.Fatal(err)
	}
	if got := p.devs[0].pendingReads; got != jobLayers/2 {
		t.Fatalf("after half the layers device 0 has %d reads pending, want %d", got, jobLayers/2)
	}
	if ios := p.Dispatch(8e6, nil); len(ios) != 0 {
		t.Fatalf("dispatched %v while the restore's last layers are pending", kinds(ios))
	}
	if err := p.Complete(job.ID, 16e6); err != nil {
		t.Fatal(err)
	}
	ios = p.Dispatch(16e6, nil)
	if k := kinds(ios); k[IOWrite] == 0 || len(ios) != k[IOWrite] {
		t.Fatalf("after the restore dispatched %v: want the save's writes", k)
	}
	for _, io := range ios {
		if io.Promoted {
			t.Fatalf("write %+v promoted: it went because its bound came near, not because the reads ended", io)
		}
		if err := p.Complete(io.ID, 20e6); err != nil {
			t.Fatal(err)
		}
	}
	for ios := p.Dispatch(20e6, nil); len(ios) > 0; ios = p.Dispatch(20e6, nil) {
		for _, io := range ios {
			if err := p.Complete(io.ID, 20e6); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, d := range p.devs {
		if d.pendingReads != 0 || d.pendingReadBytes != 0 || d.pendingReadNs != 0 || d.jobReadNs != 0 || d.jobsInFlight != 0 || len(d.jobCurs) != 0 {
			t.Errorf("device %d left with %+v", i, d)
		}
	}
	if n := p.Pending(); n != 0 {
		t.Errorf("%d records pending", n)
	}
	if err := p.Complete(job.ID, 20e6); !errors.Is(err, ErrUnknownIO) {
		t.Errorf("second Complete of the restore: %v, want ErrUnknownIO", err)
	}
	if err := p.CompleteLayers(job.ID, 1, 20e6); !errors.Is(err, ErrUnknownIO) {
		t.Errorf("CompleteLayers of a finished restore: %v, want ErrUnknownIO", err)
	}
}

// TestWholeRestoreSlackAfterLayers: a restore that reads faster than the
// suffix computes has slack in its later layers; once the GPU reported its
// first layers (whose slack is none), a queued save goes into that slack
// while the restore is still in flight.
func TestWholeRestoreSlackAfterLayers(t *testing.T) {
	p := jobPlanner(t, 2, 0, 0)
	if _, err := p.PlanLoad(wholeRequest(1, 0, 4, 4)); err != nil { // 2 ms of reads per layer, 3.2 ms of compute
		t.Fatal(err)
	}
	if _, err := p.EnqueueSave(SaveRequest{ID: 2, Device: 0, Blocks: 1, BytesPerLayerPerBlock: jobBlockBytes}); err != nil {
		t.Fatal(err)
	}
	ios := p.Dispatch(0, nil)
	if k := kinds(ios); len(ios) != 1 || k[IORestore] != 1 {
		t.Fatalf("dispatched %v: want the restore alone (its first layer has no slack)", k)
	}
	if err := p.CompleteLayers(ios[0].ID, 4, 8.4e6); err != nil {
		t.Fatal(err)
	}
	got := p.Dispatch(8.4e6, nil)
	if k := kinds(got); k[IOWrite] == 0 || len(got) != k[IOWrite] {
		t.Fatalf("after 4 of %d layers dispatched %v: want writes into the later layers' slack", jobLayers, k)
	}
	for _, io := range got {
		if io.Promoted {
			t.Fatalf("write %+v promoted: it should have gone into slack", io)
		}
	}
}

// TestWholeRestoreCancelAndHold: a Whole plan not dispatched yet is dropped
// whole by Cancel; one whose device has writes that must run now to keep
// their bound waits for them (counted in ReadHolds) and goes after.
func TestWholeRestoreCancelAndHold(t *testing.T) {
	p := jobPlanner(t, 1, 0, 0)
	if _, err := p.PlanLoad(wholeRequest(1, 0, 4)); err != nil {
		t.Fatal(err)
	}
	if n := p.Cancel(1); n != jobLayers || p.Pending() != 0 || p.devs[0].pendingReads != 0 || len(p.jobQ) != 0 {
		t.Fatalf("cancel dropped %d reads, %d records pending, device %+v", n, p.Pending(), p.devs[0])
	}
	// A save whose writes need the whole device until its bound: the
	// restore admitted after it waits for them.
	p = jobPlanner(t, 1, 0, 0)
	bound := p.Config().SaveBoundNs
	tk, err := p.EnqueueSave(SaveRequest{ID: 1, Device: 0, Blocks: 4, BytesPerLayerPerBlock: jobBlockBytes})
	if err != nil || tk.Blocks != 4 {
		t.Fatalf("save %+v, %v", tk, err)
	}
	now := bound - 40e6 // 32 ms of writes left, 40 ms to the bound
	if _, err := p.PlanLoad(wholeRequest(2, now, 4)); err != nil {
		t.Fatal(err)
	}
	ios := p.Dispatch(now, nil)
	if k := kinds(ios); k[IORestore] != 0 || k[IOWrite] == 0 || p.Stats().ReadHolds == 0 {
		t.Fatalf("near the save's bound dispatched %v (stats %+v): want writes first, the restore held", k, p.Stats())
	}
	var restore []IO
	for len(ios) > 0 && len(restore) == 0 {
		for _, io := range ios {
			if io.Kind == IORestore {
				restore = append(restore, io)
				continue
			}
			now += 4e6
			if err := p.Complete(io.ID, now); err != nil {
				t.Fatal(err)
			}
		}
		ios = p.Dispatch(now, nil)
	}
	restore = append(restore, ios...)
	if len(restore) == 0 || restore[0].Kind != IORestore || restore[0].ReqID != 2 {
		t.Fatalf("the restore never went after the writes: %+v", restore)
	}
}

// TestSavesDoNotDelayGPURestores is the scheduler's simulation of the GPU
// path: restores are Whole plans that a simulated GPU reads layer by layer
// on two devices (reads at half rate while writes run, writes at half rate
// while reads run), reporting each finished layer (CompleteLayers); a
// request computes layer l once it is read and layer l-1 is computed. Saves
// arrive throughout. With the scheduler the GPU waits for reads about as
// long as when writes cost reads nothing; with saves written as they come
// (no deferral) it waits much longer, so the world does make saves cost
// restores.
func TestSavesDoNotDelayGPURestores(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		free := runJobWorld(t, seed, jobWorldFreeWrites)
		sched := runJobWorld(t, seed, jobWorldScheduler)
		eager := runJobWorld(t, seed, jobWorldEager)
		t.Logf("seed %d: GPU waited for reads %.1f ms (writes free), %.1f ms (scheduler), %.1f ms (saves as they come); %d/%d/%d MiB saved",
			seed, free.waitNs/1e6, sched.waitNs/1e6, eager.waitNs/1e6, free.savedBytes>>20, sched.savedBytes>>20, eager.savedBytes>>20)
		if sched.savedBytes == 0 || sched.savedBytes != eager.savedBytes {
			t.Fatalf("seed %d: saved %d bytes with the scheduler, %d eagerly: the runs are not comparable", seed, sched.savedBytes, eager.savedBytes)
		}
		if sched.waitNs > 1.1*free.waitNs+2e6 {
			t.Errorf("seed %d: saves delayed GPU restores: %.1f ms of waiting, %.1f ms with free writes", seed, sched.waitNs/1e6, free.waitNs/1e6)
		}
		if eager.waitNs < 1.3*free.waitNs+2e6 {
			t.Errorf("seed %d: eager saves cost restores nothing (%.1f ms, %.1f ms free): the world shows nothing", seed, eager.waitNs/1e6, free.waitNs/1e6)
		}
		if sched.maxSaveNs > float64(sched.boundNs) {
			t.Errorf("seed %d: a save took %.1f ms, past its %d ms bound", seed, sched.maxSaveNs/1e6, sched.boundNs/1e6)
		}
	}
}

// randomArrivals is n arrival times, exponential gaps of mean meanNs.
func randomArrivals(rng *rand.Rand, n int, meanNs float64) []int64 {
	out := make([]int64, n)
	t := 0.0
	for i := range out {
		t += rng.ExpFloat64() * meanNs
		out[i] = int64(t)
	}
	return out
}
