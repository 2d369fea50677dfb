package runtime

// Re-measuring a device's reads. A plan recomputes cached blocks when the
// device model says loading them loses; a model seeded low (the device was
// busy while Open probed it) then sees no read that would correct it, and
// the store recomputes for good. So when a plan recomputes cached blocks of
// a device whose model has seen no reads for reprobeEvery, the store reads
// part of the first run the plan left out, in the background (O_DIRECT, as
// Open's probe does: probeDepth ops in flight within reprobeBudget), and
// sets the device's read rate to what it measured
// (sched.DeviceModel.RemeasureReads). The run is committed data on that
// device; the read goes to the probe's own buffers, never to the engine's
// memory. Only a store whose Open probed its devices re-probes them (a
// Config.Device the engine passed is kept as given). At most one re-probe
// runs at a time; each one, each failure and each skip is counted (Stats).

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tutti-io/tutti/sched"
	"golang.org/x/sys/unix"
)

const (
	// reprobeEvery is how long a device's model goes without reads before a
	// plan that recomputes its cached blocks re-probes it.
	reprobeEvery = 2 * time.Second
	// reprobeBudget bounds one re-probe's reads.
	reprobeBudget = 25 * time.Millisecond
	// reprobeMaxBytes bounds the bytes one re-probe reads.
	reprobeMaxBytes = 32 << 20
	// reprobeMinOpBytes: smaller ops measure the device's op rate, not its
	// bandwidth; a run too short for probeMinOps of them is not probed.
	reprobeMinOpBytes = 256 << 10
)

// readProber measures reads of [off, off+n) of fd with ops of opBytes
// within budget and returns the rate.
type readProber func(fd int, off, n, opBytes int64, budget time.Duration) (bytesPerSec float64, err error)

// reprobes is a store's re-probe state.
type reprobes struct {
	probe readProber // nil: the store does not re-probe
	every time.Duration
	busy  atomic.Bool
	// done, failed and skipped count re-probes that measured, that failed
	// and plans that would have re-probed a run too short to measure.
	done, failed, skipped atomic.Int64
	lastErr               atomic.Pointer[string]
}

// maybeReprobe is called after every plan of runs: when the plan
// recomputes cached blocks because loading would not be faster, it starts a
// re-probe of the device of the first block left out if that device's model
// is stale and none is running. It never blocks.
func (s *Store) maybeReprobe(runs []loadRun, plan sched.Plan) {
	rp := &s.reprobe
	if rp.probe == nil || !recomputesCached(plan) {
		return
	}
	loaded := plan.LoadBlocks
	var r *runEntry
	for _, lr := range runs {
		if loaded < lr.k {
			r = lr.run
			break
		}
		loaded -= lr.k
	}
	if r == nil || !s.sched.ReadsStale(r.device, rp.every) {
		return
	}
	n := min(r.info.Length, reprobeMaxBytes)
	op := min(probeIOBytes, n/probeMinOps) &^ (reprobeMinOpBytes - 1)
	if op < reprobeMinOpBytes {
		rp.skipped.Add(1)
		s.sched.ReadsSeen(r.device) // not again before the next interval
		return
	}
	if !rp.busy.CompareAndSwap(false, true) {
		return
	}
	if s.begin() != nil {
		rp.busy.Store(false)
		return
	}
	go func() {
		defer s.endOp() // Close waits: the pool file stays open meanwhile
		defer rp.busy.Store(false)
		rate, err := rp.probe(int(r.file.FD), r.offset, n/op*op, op, reprobeBudget)
		if err == nil {
			err = s.sched.RemeasureReads(r.device, rate)
		}
		s.sched.ReadsSeen(r.device)
		if err != nil {
			// The message first: a reader that sees the count sees why.
			msg := fmt.Sprintf("device %d (%s): %v", r.device, r.file.Path, err)
			rp.lastErr.Store(&msg)
			rp.failed.Add(1)
			return
		}
		rp.done.Add(1)
	}()
}

// recomputesCached is whether plan recomputes cached blocks because
// loading them would not be faster (not for a budget or a queue).
func recomputesCached(plan sched.Plan) bool {
	for _, r := range plan.NotAdmitted {
		if r.Reason == sched.ReasonRecomputeFaster {
			return true
		}
	}
	return false
}

// reprobeReads is the default readProber: probePhase's reads of committed
// data, probeDepth workers with buffers of their own.
func reprobeReads(fd int, off, n, opBytes int64, budget time.Duration) (float64, error) {
	bufs := make([][]byte, probeDepth)
	for i := range bufs {
		b, err := unix.Mmap(-1, 0, int(opBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return 0, fmt.Errorf("re-probe buffer: %w", err)
		}
		defer func() { _ = unix.Munmap(b) }()
		bufs[i] = b
	}
	read, ns, err := probePhase(fd, bufs, off, n, time.Now().Add(budget), false)
	if err != nil {
		return 0, fmt.Errorf("re-probing reads at %d: %w", off, err)
	}
	if read <= 0 || ns <= 0 {
		return 0, errors.New("re-probe: nothing read")
	}
	return float64(read) * 1e9 / float64(ns), nil
}

// stats is what the re-probes did so far.
// The counts are read before the message, which a failure stores before
// its count: a failure counted here has its message here.
func (rp *reprobes) stats() (done, failed, skipped int64, lastErr string) {
	done, failed, skipped = rp.done.Load(), rp.failed.Load(), rp.skipped.Load()
	if p := rp.lastErr.Load(); p != nil {
		lastErr = *p
	}
	return done, failed, skipped, lastErr
}
