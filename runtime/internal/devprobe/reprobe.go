package devprobe

// Re-measuring a device's reads. A plan recomputes cached blocks when the
// device model says loading them loses; a model seeded low (the device was
// busy while Open probed it) then sees no read that would correct it, and
// the store recomputes for good. So when a plan recomputes cached blocks of
// a device whose model has seen no reads for Every, the store reads part of
// the first run the plan left out, in the background (O_DIRECT, as Open's
// probe does: probeDepth ops in flight within reprobeBudget), and sets the
// device's read rate to what it measured (sched.DeviceModel.RemeasureReads).
// The run is committed data on that device; the read goes to the probe's
// own buffers, never to the engine's memory. Only a store whose Open probed
// its devices re-probes them (a Config.Device the engine passed is kept as
// given). At most one re-probe runs at a time; each one, each failure and
// each skip is counted (Reprober.Stats).

import (
	"cmp"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tutti-io/tutti/sched"
	"golang.org/x/sys/unix"
)

const (
	// Every is how long a device's model goes without reads before a plan
	// that recomputes its cached blocks re-probes it.
	Every = 2 * time.Second
	// reprobeBudget bounds one re-probe's reads.
	reprobeBudget = 25 * time.Millisecond
	// reprobeMaxBytes bounds the bytes one re-probe reads.
	reprobeMaxBytes = 32 << 20
	// reprobeMinOpBytes: smaller ops measure the device's op rate, not its
	// bandwidth; a run too short for MinOps of them is not probed.
	reprobeMinOpBytes = 256 << 10
)

// ReadProber measures reads of [off, off+n) of fd with ops of opBytes
// within budget and returns the rate (Reads; tests pass their own).
type ReadProber func(fd int, off, n, opBytes int64, budget time.Duration) (bytesPerSec float64, err error)

// Models is the scheduler's device models as a re-probe uses them
// (iosched.Scheduler).
type Models interface {
	ReadsStale(dev int, every time.Duration) bool
	ReadsSeen(dev int)
	RemeasureReads(dev int, bytesPerSec float64) error
}

// Target is what a re-probe reads: a committed run of Length bytes at
// Offset of the pool file FD (Path, for the error) on device Device.
type Target struct {
	Device         int
	FD             int
	Path           string
	Offset, Length int64
}

// Reprober is a store's re-probe state. Its methods are safe for
// concurrent use; a nil *Reprober never re-probes and counts nothing.
type Reprober struct {
	probe  ReadProber
	every  time.Duration
	models Models
	busy   atomic.Bool
	// done, failed and skipped count re-probes that measured, that failed
	// and plans that would have re-probed a run too short to measure.
	done, failed, skipped atomic.Int64
	lastErr               atomic.Pointer[string]
}

// NewReprober re-probes with probe (nil: Reads) a device whose model
// saw no reads for every (0: Every), setting its read rate in models.
func NewReprober(probe ReadProber, every time.Duration, models Models) *Reprober {
	if probe == nil {
		probe = Reads
	}
	return &Reprober{probe: probe, every: cmp.Or(every, Every), models: models}
}

// Wanted is whether a plan asks for a re-probe: it recomputes cached blocks
// because loading them would not be faster (not for a budget or a queue).
// The target is then the run of the first cached block the plan left out.
func Wanted(plan sched.Plan) bool { return recomputesCached(plan) }

// Maybe re-probes t's device in the background if its model is stale and
// no re-probe is running; it never blocks. begin registers the re-probe
// with the store (an error: the store is closing, nothing is read) and end
// is called when it ended, so that the store's Close waits for it and the
// pool file stays open meanwhile.
func (rp *Reprober) Maybe(t Target, begin func() error, end func()) {
	if rp == nil || !rp.models.ReadsStale(t.Device, rp.every) {
		return
	}
	n := min(t.Length, reprobeMaxBytes)
	op := min(IOBytes, n/MinOps) &^ (reprobeMinOpBytes - 1)
	if op < reprobeMinOpBytes {
		rp.skipped.Add(1)
		rp.models.ReadsSeen(t.Device) // not again before the next interval
		return
	}
	if !rp.busy.CompareAndSwap(false, true) {
		return
	}
	if begin() != nil {
		rp.busy.Store(false)
		return
	}
	go func() {
		defer end()
		defer rp.busy.Store(false)
		rate, err := rp.probe(t.FD, t.Offset, n/op*op, op, reprobeBudget)
		if err == nil {
			err = rp.models.RemeasureReads(t.Device, rate)
		}
		rp.models.ReadsSeen(t.Device)
		if err != nil {
			// The message first: a reader that sees the count sees why.
			msg := fmt.Sprintf("device %d (%s): %v", t.Device, t.Path, err)
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

// Reads is the default ReadProber: probePhase's reads of committed data,
// probeDepth workers with buffers of their own.
func Reads(fd int, off, n, opBytes int64, budget time.Duration) (float64, error) {
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

// Stats is what the re-probes did so far. The counts are read before the
// message, which a failure stores before its count: a failure counted here
// has its message here.
func (rp *Reprober) Stats() (done, failed, skipped int64, lastErr string) {
	if rp == nil {
		return 0, 0, 0, ""
	}
	done, failed, skipped = rp.done.Load(), rp.failed.Load(), rp.skipped.Load()
	if p := rp.lastErr.Load(); p != nil {
		lastErr = *p
	}
	return done, failed, skipped, lastErr
}
