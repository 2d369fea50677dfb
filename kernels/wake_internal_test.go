package kernels

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// newKickRestorer is the part of a Restorer the wake loop uses, on ring,
// as Bind would make it (owned: a ring created disabled).
func newKickRestorer(ring *uring.Ring, cfg Config, opts BenchOptions, owned bool) *Restorer {
	return &Restorer{cfg: cfg, opts: opts, ring: ring, kick: make(chan struct{}, 1), stop: make(chan struct{}), helper: newHelperState(), owned: owned}
}

// startKick starts r's helper as Bind does, counts one restore live and
// returns what stops it (as Close does); call it before closing the ring.
func startKick(t *testing.T, r *Restorer) (stop func()) {
	t.Helper()
	ready := make(chan error, 1)
	r.waker.Add(1)
	go r.wakeLoop(0, ready)
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	r.helper.begin()
	return func() {
		r.helper.end()
		close(r.stop)
		r.helper.stop()
		r.waker.Wait()
		r.helper.free()
	}
}

// putSQE writes SQE idx through the ring's shared memory the way the I/O
// kernel does: opcode op (0 = NOP, then only the user data), fd, file
// offset, buffer address and length, user data ud, and its SQ array slot.
func putSQE(l uring.RingLayout, idx uint32, op uint32, fd int, off, addr uint64, n uint32, ud uint64) {
	sqe := l.SQEs + uintptr(idx)*uintptr(l.SQESize)
	ringZero(sqe, int(l.SQESize))
	if op != 0 {
		ringStore32(sqe, op) // flags, ioprio 0
		ringStore32(sqe+4, uint32(fd))
		ringStore64(sqe+8, off)
		ringStore64(sqe+16, addr)
		ringStore32(sqe+24, n)
	}
	ringStore64(sqe+32, ud)
	if l.SQArray != 0 {
		ringStore32(l.SQArray+uintptr(idx)*4, idx)
	}
}

const opRead = 22 // IORING_OP_READ

// kickRingOrSkip makes a ring of cfg for the C kick loop, or skips the test
// where the kernel lacks io_uring, cfg's features or IORING_FEAT_EXT_ARG
// (the timer loop drives kick mode there instead).
func kickRingOrSkip(t *testing.T, cfg uring.Config) (*uring.Ring, uring.RingLayout) {
	t.Helper()
	ring, err := uring.New(cfg)
	if err != nil {
		t.Skipf("io_uring (%+v) unavailable: %v", cfg, err)
	}
	l := ring.Layout()
	if l.Features&featExtArg == 0 {
		ring.Close()
		t.Skip("kernel without IORING_FEAT_EXT_ARG: the timer loop drives kick mode instead")
	}
	return ring, l
}

// TestWakeLoopKicks: on a ring without SQPOLL the helper enters the kernel
// while a restore is live, and stops when none is (no GPU needed).
func TestWakeLoopKicks(t *testing.T) {
	ring, err := uring.New(uring.Config{Entries: 8, SQThreadCPU: -1})
	if err != nil {
		t.Skipf("io_uring unavailable: %v", err)
	}
	defer ring.Close()
	r := newKickRestorer(ring, Config{WakeInterval: 100 * time.Microsecond}, BenchOptions{}, false)
	stop := startKick(t, r)
	r.kick <- struct{}{}
	deadline := time.Now().Add(5 * time.Second)
	for r.Wakeups() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if r.Wakeups() < 3 {
		t.Fatalf("%d kicks while a restore was live", r.Wakeups())
	}
	if e := r.wakeErr.Load(); e != nil {
		t.Fatalf("kick: %v", *e)
	}
	stop()
}

// TestKickLoopSubmitsWhatTheGPUPublishes stands in for the GPU on a ring
// without SQPOLL: it publishes SQEs through the ring's shared memory exactly
// as the I/O kernel does (SQE, SQ array, release-store of the tail), and the
// event-driven helper must submit them so their CQEs appear; while nothing
// is published or in flight it sleeps in the kernel (no spinning). Rings:
// mmap'd, NO_MMAP, and DEFER_TASKRUN created disabled (the helper's thread
// enables it and becomes its issuer). Ops: NOPs (complete inline) and
// O_DIRECT reads of a file (complete through task work, batched wake-ups),
// 8 per round through an 8-entry SQ, so the ring wraps.
func TestKickLoopSubmitsWhatTheGPUPublishes(t *testing.T) {
	const blk = 4096
	dir := t.TempDir()
	want := make([]byte, 64*blk)
	for i := range want {
		want[i] = byte(i*7 + i>>12)
	}
	fd, dst := directFileOrSkip(t, dir, want)
	for _, c := range []struct {
		name  string
		cfg   uring.Config
		reads bool
	}{
		{"mmap/nop", uring.Config{Entries: 8, SQThreadCPU: -1}, false},
		{"no-mmap/nop", uring.Config{Entries: 8, SQThreadCPU: -1, NoMmap: true}, false},
		{"mmap/read", uring.Config{Entries: 8, SQThreadCPU: -1}, true},
		{"defer-taskrun/read", uring.Config{Entries: 8, SQThreadCPU: -1, DeferTaskrun: true, Disabled: true}, true},
		{"defer-taskrun/nop", uring.Config{Entries: 8, SQThreadCPU: -1, DeferTaskrun: true, Disabled: true, NoMmap: true}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ring, l := kickRingOrSkip(t, c.cfg)
			defer ring.Close()
			const interval = 20 * time.Millisecond
			r := newKickRestorer(ring, Config{WakeInterval: interval, BatchWait: interval, WakeBatch: 4}, BenchOptions{NoFixedBuffers: true}, c.cfg.Disabled)
			if m := r.HelperMode(); !strings.HasPrefix(m, "kick-wait") {
				t.Fatalf("helper mode %q on a ring without SQPOLL, kernel with EXT_ARG", m)
			}
			defer startKick(t, r)()
			r.kick <- struct{}{}

			idle := 200 * time.Millisecond
			w0 := r.Wakeups()
			time.Sleep(idle)
			// A slower machine enters less often, never more: the bound is on spinning.
			if n := r.Wakeups() - w0; n > int64(2*idle/interval)+2 {
				t.Fatalf("%d enters in %v idle with a %v interval: the helper spins", n, idle, interval)
			}
			clear(dst.Bytes())
			mask := ringLoad32(l.SQMask)
			const per = 8
			for round := 0; round < 3; round++ {
				tail := ringLoad32(l.SQTail)
				op := uint32(0) // IORING_OP_NOP
				if c.reads {
					op = opRead
				}
				for i := uint32(0); i < per; i++ {
					n := uint64(round*per) + uint64(i)
					putSQE(l, (tail+i)&mask, op, fd, n*blk, uint64(dst.Addr())+n*blk, blk, 100+n)
				}
				ringStore32(l.SQTail, tail+per)
				deadline := time.Now().Add(10 * time.Second)
				for ringLoad32(l.CQTail)-ringLoad32(l.CQHead) < per && time.Now().Before(deadline) {
					time.Sleep(100 * time.Microsecond)
				}
				head, ctail := ringLoad32(l.CQHead), ringLoad32(l.CQTail)
				if ctail-head != per {
					t.Fatalf("round %d: %d CQEs after publishing %d SQEs", round, ctail-head, per)
				}
				cmask := ringLoad32(l.CQMask)
				seen := map[uint64]bool{}
				for i := uint32(0); i < per; i++ {
					cqe := l.CQEs + uintptr((head+i)&cmask)*uintptr(l.CQESize)
					ud, res := ringLoad64(cqe), int32(uint32(ringLoad64(cqe+8)))
					wantRes := int32(0)
					if c.reads {
						wantRes = blk
					}
					if ud < 100+uint64(round*per) || ud >= 100+uint64(round*per+per) || seen[ud] || res != wantRes {
						t.Fatalf("round %d: CQE %d: user data %d res %d", round, i, ud, res)
					}
					seen[ud] = true
				}
				ringStore32(l.CQHead, head+per)
			}
			if c.reads && !bytes.Equal(dst.Bytes()[:3*per*blk], want[:3*per*blk]) {
				t.Fatal("the reads the helper submitted brought other bytes than the file's")
			}
			if err := r.HelperErr(); err != nil {
				t.Fatalf("kick: %v", err)
			}
			t.Logf("%d enters, %d on the timeout", r.Wakeups(), r.WakeTimeouts())
		})
	}
}

// TestNewKickRing: on this kernel (6.x) the GPU ring gets DEFER_TASKRUN and
// starts disabled; the base's SQPOLL request is overridden.
func TestNewKickRing(t *testing.T) {
	ring, fallback, err := NewKickRing(uring.Config{Entries: 16, SQPoll: true, NoMmap: true})
	if err != nil {
		t.Skipf("io_uring unavailable: %v", err)
	}
	defer ring.Close()
	l := ring.Layout()
	if fallback != "" {
		if l.SetupFlags&(setupDeferTaskrun|setupRDisabled) != 0 {
			t.Fatalf("fallback %q but flags %#x", fallback, l.SetupFlags)
		}
		t.Skipf("kernel without DEFER_TASKRUN: %s", fallback)
	}
	if l.SetupFlags&setupDeferTaskrun == 0 || l.SetupFlags&setupRDisabled == 0 || l.SetupFlags&setupSQPoll != 0 {
		t.Fatalf("setup flags %#x: want DEFER_TASKRUN|R_DISABLED, no SQPOLL", l.SetupFlags)
	}
	r := &Restorer{ring: ring}
	if m := r.HelperMode(); m != "kick-wait, deferred task work" && l.Features&featExtArg != 0 {
		t.Fatalf("helper mode %q", m)
	}
}

// TestKickLoopLayerByLayer stands in for the GPU restoring layer by layer
// with few reads per layer: it publishes a layer's reads, reaps each CQE the
// moment it appears (as the I/O kernel polls), and publishes the next layer
// only when the layer completed. The helper must deliver every layer's last
// completions without waiting for its batch timeout: the CQ head moves while
// the helper computes its wait target (the GPU reaps what the helper's last
// wait posted), and a target taken relative to a stale head asked for more
// completions than were in flight, so each layer ended on the timeout.
func TestKickLoopLayerByLayer(t *testing.T) {
	const blk = 4096
	const layers, perLayer = 40, 2
	const reapDelay = 3 * time.Microsecond
	fd, dst := directFileOrSkip(t, t.TempDir(), make([]byte, layers*perLayer*blk))
	for _, c := range []struct {
		name  string
		cfg   uring.Config
		exact bool
	}{
		{"defer-taskrun", uring.Config{Entries: 16, SQThreadCPU: -1, DeferTaskrun: true, Disabled: true}, false},
		{"ordinary", uring.Config{Entries: 16, SQThreadCPU: -1}, false},
		{"defer-taskrun/exact-target", uring.Config{Entries: 16, SQThreadCPU: -1, DeferTaskrun: true, Disabled: true}, true},
		{"ordinary/exact-target", uring.Config{Entries: 16, SQThreadCPU: -1}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ring, l := kickRingOrSkip(t, c.cfg)
			defer ring.Close()
			// A batch timeout far above a 4 KiB read's latency: a layer
			// that waits for it is unmistakable in the timeout count.
			r := newKickRestorer(ring, Config{WakeInterval: 50 * time.Microsecond, BatchWait: 50 * time.Millisecond, WakeBatch: 32},
				BenchOptions{NoFixedBuffers: true, LooseWakeTarget: !c.exact}, c.cfg.Disabled)
			defer startKick(t, r)()
			mask, cmask := ringLoad32(l.SQMask), ringLoad32(l.CQMask)
			t0 := r.BatchTimeouts()
			publish := func(layer int) {
				tail := ringLoad32(l.SQTail)
				for i := uint32(0); i < perLayer; i++ {
					n := uint64(layer*perLayer) + uint64(i)
					putSQE(l, (tail+i)&mask, opRead, fd, n*blk, uint64(dst.Addr())+n*blk, blk, n)
				}
				ringStore32(l.SQTail, tail+perLayer)
			}
			// Lookahead 1, as the runtime binds it: layer l+1's reads are in
			// flight while layer l is waited for; layer l+2 is published once
			// layer l completed.
			done := make([]int, layers)
			publish(0)
			publish(1)
			for layer := 0; layer < layers; layer++ {
				deadline := time.Now().Add(10 * time.Second)
				for done[layer] < perLayer {
					head := ringLoad32(l.CQHead)
					if ringLoad32(l.CQTail) == head {
						if time.Now().After(deadline) {
							t.Fatalf("layer %d: %d of %d completions after 10 s", layer, done[layer], perLayer)
						}
						continue // poll, as the I/O kernel does
					}
					cqe := l.CQEs + uintptr(head&cmask)*uintptr(l.CQESize)
					if res := int32(uint32(ringLoad64(cqe + 8))); res != blk {
						t.Fatalf("layer %d: read result %d", layer, res)
					}
					done[ringLoad64(cqe)/perLayer]++
					// The GPU sees the tail and stores the head a few µs after the
					// helper returned from the wait that posted the CQE (PCIe
					// round trips): reap after that long.
					for t1 := time.Now(); time.Since(t1) < reapDelay; {
					}
					ringStore32(l.CQHead, head+1)
				}
				if layer+2 < layers {
					publish(layer + 2)
				}
			}
			timeouts := r.BatchTimeouts() - t0
			t.Logf("%d layers of %d reads: %d enters, %d on the timeout, %d of them with reads in flight", layers, perLayer, r.Wakeups(), r.WakeTimeouts(), timeouts)
			if timeouts > layers/8 {
				t.Fatalf("%d of %d layers waited for the batch timeout", timeouts, layers)
			}
		})
	}
}

// directFileOrSkip writes data to a file in dir and opens it O_DIRECT, with
// an off-heap buffer of its size to read into; both are released at the
// test's end. It skips where O_DIRECT is unavailable.
func directFileOrSkip(t *testing.T, dir string, data []byte) (fd int, dst *uring.Buffer) {
	t.Helper()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Skipf("O_DIRECT unavailable here: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	dst, err = uring.AllocBuffer(len(data))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Free() })
	return fd, dst
}

// TestKickLoopBackoffStartsOver: the helper's wait while nothing is in flight
// doubles, up to 8 intervals, as long as nothing new is published. A restore
// that begins after an idle one must not inherit that: its first SQEs are
// submitted within about one interval, not eight.
func TestKickLoopBackoffStartsOver(t *testing.T) {
	ring, l := kickRingOrSkip(t, uring.Config{Entries: 8, SQThreadCPU: -1, DeferTaskrun: true, Disabled: true})
	defer ring.Close()
	const interval = 100 * time.Millisecond
	r := newKickRestorer(ring, Config{WakeInterval: interval, BatchWait: interval, WakeBatch: 4}, BenchOptions{NoFixedBuffers: true}, true)
	defer startKick(t, r)() // one restore live, publishing nothing
	r.kick <- struct{}{}
	time.Sleep(2 * time.Second) // 100+200+400+800 ms: the backoff is at its 8 intervals
	r.helper.end()
	time.Sleep(time.Second) // the last 800 ms wait ends and the helper sleeps on the futex
	r.helper.begin()        // the next restore
	time.Sleep(10 * time.Millisecond)
	tail := ringLoad32(l.SQTail)
	putSQE(l, tail&ringLoad32(l.SQMask), 0, 0, 0, 0, 0, 7)
	t0 := time.Now()
	ringStore32(l.SQTail, tail+1)
	for ringLoad32(l.CQTail) == ringLoad32(l.CQHead) {
		if time.Since(t0) > 5*time.Second {
			t.Fatal("the NOP was not submitted within 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	// Nominal: one interval (100 ms); with the old backoff, 800 ms.
	if d := time.Since(t0); d > 4*interval {
		t.Fatalf("the restore's first SQE waited %v with a %v interval: the idle backoff carried over", d, interval)
	}
	ringStore32(l.CQHead, ringLoad32(l.CQTail))
}

// TestKickLoopRampsItsBatch: a restore puts its whole window in flight at
// once, so without a ramp the helper's first wait is for a full batch, and a
// read that completes alone stays unseen by the GPU (DEFER_TASKRUN: its CQE
// is posted only when the wait ends) until the batch fills or BatchWait
// passes. With WakeRamp the first wait is for one completion. Reads of
// pipes stand in for the device, one per pipe: each completes when the test
// writes a byte into its pipe.
func TestKickLoopRampsItsBatch(t *testing.T) {
	const reads = 32
	const batchWait = 3 * time.Second
	for _, c := range []struct {
		name   string
		ramp   int
		prompt bool // the first CQE appears well before BatchWait
	}{{"ramp", 8, true}, {"no-ramp", -1, false}} {
		t.Run(c.name, func(t *testing.T) {
			ring, l := kickRingOrSkip(t, uring.Config{Entries: 64, SQThreadCPU: -1, DeferTaskrun: true, Disabled: true})
			defer ring.Close()
			pipes := make([][2]int, reads)
			for i := range pipes {
				if err := unix.Pipe2(pipes[i][:], unix.O_CLOEXEC); err != nil {
					t.Fatal(err)
				}
				defer unix.Close(pipes[i][0])
				defer unix.Close(pipes[i][1])
			}
			dst, err := uring.AllocBuffer(reads)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Free()
			r := newKickRestorer(ring, Config{WakeInterval: time.Millisecond, BatchWait: batchWait, WakeBatch: 32, WakeRamp: c.ramp}, BenchOptions{NoFixedBuffers: true}, true)
			defer startKick(t, r)() // stops the helper before the ring, pipes and buffer go
			r.kick <- struct{}{}
			t0 := time.Now()
			// Complete every read (also when the test fails) so the ring
			// drains before it closes.
			defer func() {
				for i := range pipes {
					unix.Write(pipes[i][1], []byte{1})
				}
				for ringLoad32(l.CQTail)-ringLoad32(l.CQHead) < reads && time.Since(t0) < 3*batchWait {
					time.Sleep(time.Millisecond)
				}
				ringStore32(l.CQHead, ringLoad32(l.CQTail))
			}()
			mask := ringLoad32(l.SQMask)
			tail := ringLoad32(l.SQTail)
			for i := uint32(0); i < reads; i++ {
				putSQE(l, (tail+i)&mask, opRead, pipes[i][0], 0, uint64(dst.Addr())+uint64(i), 1, uint64(i))
			}
			ringStore32(l.SQTail, tail+reads)
			time.Sleep(50 * time.Millisecond) // submitted; the helper waits
			t0 = time.Now()
			if _, err := unix.Write(pipes[5][1], []byte{1}); err != nil {
				t.Fatal(err)
			}
			for ringLoad32(l.CQTail) == ringLoad32(l.CQHead) && time.Since(t0) < 2*batchWait {
				time.Sleep(time.Millisecond)
			}
			d := time.Since(t0)
			if got := ringLoad32(l.CQTail) - ringLoad32(l.CQHead); got != 1 {
				t.Fatalf("%d CQEs after one byte written", got)
			}
			if ud := ringLoad64(l.CQEs + uintptr(ringLoad32(l.CQHead)&ringLoad32(l.CQMask))*uintptr(l.CQESize)); ud != 5 {
				t.Fatalf("the CQE is read %d's, want 5's", ud)
			}
			if prompt := d < batchWait/3; prompt != c.prompt {
				t.Fatalf("the first completion was seen after %v (batch wait %v); want prompt=%v", d, batchWait, c.prompt)
			}
		})
	}
}
