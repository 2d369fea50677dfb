// Package devprobe measures a store's devices. At Open each directory's
// device is measured with a short, time-limited burst of O_DIRECT writes
// and reads (Devices), so that a store whose Config.Device is left zero
// seeds its device model with what its devices do rather than with the
// default profile. The model corrects itself only slowly (a bounded step
// per completed save), and the scheduler admits a whole save at once from
// the model, so a seed far below the device would cut every large save on
// a fresh store although the device writes it within the bound. A device
// the probe cannot measure falls back to the seed, and the Outcome says
// why. Later a device whose model went stale while plans recompute its
// cached blocks is re-measured by reading committed data (Reprober,
// reprobe.go).
package devprobe

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tutti-io/tutti/sched"
	"golang.org/x/sys/unix"
)

const (
	// probeBudget bounds the whole probe (all devices run at once): half
	// for the writes, half for the reads of what was written.
	probeBudget = 50 * time.Millisecond
	// IOBytes is one probe op: large enough to be bandwidth bound, like
	// the save writes and the restore reads the model predicts.
	IOBytes = 1 << 20
	// probeDepth ops in flight per device: deep enough to be bandwidth
	// bound, shallow enough that MinOps complete within the budget.
	probeDepth = 8
	// probeMaxBytes bounds the scratch file's size.
	probeMaxBytes = 64 << 20
	// MinOps: fewer completions measure latency, not bandwidth, so
	// they are not taken as a rate. Every worker completes its first op
	// whatever the deadline, so a slow device is measured (a phase then
	// runs past its deadline by at most one op per worker) rather than
	// left on a seed that would admit more than it writes in the bound.
	MinOps = probeDepth
	// ScratchFile is the probe's file in each directory, removed when the
	// probe ends.
	ScratchFile = ".tutti-probe"
)

// Rates is what the probe measured on one device.
type Rates struct {
	WriteBytesPerSec, ReadBytesPerSec float64
	Bytes                             int64 // written (and read back)
	Took                              time.Duration
}

// Prober measures the device under dir within budget (Dir; tests pass
// their own).
type Prober func(dir string, budget time.Duration) (Rates, error)

// Outcome is one directory's probe: the profile its model starts from (the
// seed with the probed bandwidths, or the seed itself where Err says why
// there is no measurement) and what was measured.
type Outcome struct {
	Profile sched.DeviceProfile
	Rates   Rates
	Err     error // nil: measured
}

// Devices probes every directory with probe and returns their outcomes in
// dirs' order. The directories are probed at once, as a striped save
// writes them: those on one device share its rate, as their saves do. The
// whole probe takes about probeBudget.
func Devices(dirs []string, seed sched.DeviceProfile, probe Prober) []Outcome {
	rates := make([]Rates, len(dirs))
	errs := make([]error, len(dirs))
	var wg sync.WaitGroup
	for i, dir := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rates[i], errs[i] = probe(dir, probeBudget)
		}()
	}
	wg.Wait()
	out := make([]Outcome, len(dirs))
	for i := range dirs {
		p := seed
		p.WriteBytesPerSec, p.ReadBytesPerSec = rates[i].WriteBytesPerSec, rates[i].ReadBytesPerSec
		if errs[i] == nil {
			errs[i] = p.Validate()
		}
		if errs[i] != nil {
			out[i] = Outcome{Profile: seed, Err: errs[i]}
			continue
		}
		out[i] = Outcome{Profile: p, Rates: rates[i]}
	}
	return out
}

// Dir is the default prober: a scratch file in dir, written and read back
// with O_DIRECT at probeDepth ops in flight, each phase stopped at half
// the budget or probeMaxBytes. The file is removed before it returns.
func Dir(dir string, budget time.Duration) (Rates, error) {
	path := filepath.Join(dir, ScratchFile)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return Rates{}, fmt.Errorf("opening %s with O_DIRECT: %w", path, err)
	}
	defer func() {
		_ = unix.Close(fd)
		_ = os.Remove(path)
	}()
	// Pool files are preallocated: so is the scratch file, where the file
	// system can (a failure only makes the writes allocate).
	_ = unix.Fallocate(fd, 0, 0, probeMaxBytes)
	bufs := make([][]byte, probeDepth)
	for i := range bufs {
		b, err := unix.Mmap(-1, 0, IOBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return Rates{}, fmt.Errorf("probe buffer: %w", err)
		}
		defer func() { _ = unix.Munmap(b) }()
		// Not zeros, which some devices write for free.
		b[0] = byte(i + 1)
		for n := 1; n < len(b); n *= 2 {
			copy(b[n:], b[:n])
			b[n] ^= byte(n)
		}
		bufs[i] = b
	}
	begin := time.Now() // the budget is the I/O's, not the setup's
	written, wNs, err := probePhase(fd, bufs, 0, probeMaxBytes, begin.Add(budget/2), true)
	if err != nil {
		return Rates{}, fmt.Errorf("writing %s: %w", path, err)
	}
	read, rNs, err := probePhase(fd, bufs, 0, written, begin.Add(budget), false)
	if err != nil {
		return Rates{}, fmt.Errorf("reading %s: %w", path, err)
	}
	return Rates{WriteBytesPerSec: float64(written) * 1e9 / float64(wNs), ReadBytesPerSec: float64(read) * 1e9 / float64(rNs),
		Bytes: written, Took: time.Since(begin)}, nil
}

// errProbeShort: the device completed too few ops within the budget.
var errProbeShort = errors.New("too few ops completed within the probe's budget")

// probePhase writes (or reads) [base, base+limit) of fd in ops of one
// buffer's size (every buffer has the same), one worker per buffer, until
// limit or the deadline: a worker starts no op its last one says would end
// past it (its first op always starts). It returns the bytes moved and the
// time from the first submission to the last completion.
func probePhase(fd int, bufs [][]byte, base, limit int64, deadline time.Time, write bool) (int64, int64, error) {
	opBytes := int64(len(bufs[0]))
	var next, done, ops atomic.Int64
	var mu sync.Mutex
	var firstErr error
	start := time.Now()
	var wg sync.WaitGroup
	for _, b := range bufs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last time.Duration
			for t0 := time.Now(); last == 0 || t0.Add(last).Before(deadline); t0 = time.Now() {
				off := next.Add(opBytes) - opBytes
				if off+opBytes > limit {
					return
				}
				off += base
				var n int
				var err error
				if write {
					n, err = unix.Pwrite(fd, b, off)
				} else {
					n, err = unix.Pread(fd, b, off)
				}
				if err == nil && n != len(b) {
					err = fmt.Errorf("%d of %d bytes at %d", n, len(b), off)
				}
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					return
				}
				done.Add(int64(n))
				ops.Add(1)
				last = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start).Nanoseconds()
	if firstErr != nil {
		return 0, 0, firstErr
	}
	if ops.Load() < MinOps || took <= 0 {
		return 0, 0, fmt.Errorf("%d ops: %w", ops.Load(), errProbeShort)
	}
	return done.Load(), took, nil
}
