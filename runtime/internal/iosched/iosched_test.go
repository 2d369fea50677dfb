package iosched

import (
	"testing"
	"time"

	"github.com/tutti-io/tutti/sched"
)

func newTestScheduler(t *testing.T) *Scheduler {
	t.Helper()
	p := sched.DeviceProfile{ReadBytesPerSec: 2e9, WriteBytesPerSec: 1e9, ReadIOPS: 2e5, WriteIOPS: 1e5,
		ReadLatencyNs: 1e5, ReadShareUnderWrites: 0.5, WriteShareUnderReads: 0.5}
	sc, err := New(sched.Config{Layers: 2, BlockTokens: 16, Compute: sched.ComputeModel{PerTokenNs: 1e6},
		Devices: []sched.DeviceConfig{{Profile: p}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Close)
	return sc
}

// recv waits for n I/Os routed to ios.
func recv(t *testing.T, ios chan sched.IO, n int) []sched.IO {
	t.Helper()
	var out []sched.IO
	for len(out) < n {
		select {
		case io := <-ios:
			out = append(out, io)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d I/Os routed", len(out), n)
		}
	}
	return out
}

// TestRoutesAndRetires: a load's reads and a save's writes reach their
// routes and retire; AskLoad answers as PlanLoad would and routes nothing.
func TestRoutesAndRetires(t *testing.T) {
	sc := newTestScheduler(t)
	req := sched.LoadRequest{Runs: []sched.Run{{Device: 0, Blocks: 2, BytesPerLayerPerBlock: 1 << 16}}}
	asked, err := sc.AskLoad(req)
	if err != nil || asked.LoadBlocks != 2 {
		t.Fatalf("AskLoad: %+v, %v", asked, err)
	}
	ios := make(chan sched.IO, 4)
	plan, err := sc.PlanLoad(req, ios)
	if err != nil || plan.LoadBlocks != asked.LoadBlocks {
		t.Fatalf("PlanLoad: %+v, %v (asked %+v)", plan, err, asked)
	}
	reads := recv(t, ios, len(plan.Reads))
	for i, io := range reads {
		sc.Complete(io, i == len(reads)-1)
	}
	if len(ios) != 0 {
		t.Fatalf("AskLoad's plan routed %d reads", len(ios))
	}

	wios := make(chan sched.IO, 8)
	id, tk, err := sc.EnqueueSave(sched.SaveRequest{Device: 0, Blocks: 1, BytesPerLayerPerBlock: 1 << 16}, wios)
	if err != nil || tk.Blocks != 1 || tk.Writes == 0 {
		t.Fatalf("EnqueueSave: %+v, %v", tk, err)
	}
	writes := recv(t, wios, tk.Writes)
	for i, io := range writes {
		if io.ReqID != id {
			t.Fatalf("write of request %d, want %d", io.ReqID, id)
		}
		sc.Complete(io, i == len(writes)-1)
	}
	sc.ObserveWrites(0, 2<<16, tk.Writes, 1e6, false)
	if st := sc.Stats(); st.Plans != 2 || st.Cancelled == 0 || st.Saves != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestReadsSeen: a device's model is stale once no reads were seen for the
// interval; seeing reads makes it fresh.
func TestReadsSeen(t *testing.T) {
	sc := newTestScheduler(t)
	time.Sleep(2 * time.Millisecond)
	if !sc.ReadsStale(0, time.Millisecond) {
		t.Fatal("no reads seen since New, not stale")
	}
	sc.ObserveReads(0, 1<<20, 1, 1e6)
	if sc.ReadsStale(0, time.Hour) {
		t.Fatal("stale right after reads")
	}
	if err := sc.RemeasureReads(0, 3e9); err != nil || sc.Device(0).Profile().ReadBytesPerSec != 3e9 {
		t.Fatalf("RemeasureReads: %v, read rate %g", err, sc.Device(0).Profile().ReadBytesPerSec)
	}
}
