package blockstat

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// CPU is user and system CPU time consumed (getrusage).
type CPU struct{ User, Sys time.Duration }

// Total is User + Sys.
func (c CPU) Total() time.Duration { return c.User + c.Sys }

// Sub returns c − prev.
func (c CPU) Sub(prev CPU) CPU { return CPU{User: c.User - prev.User, Sys: c.Sys - prev.Sys} }

// PerGiB is CPU seconds per GiB moved (0 when bytes is 0).
func (c CPU) PerGiB(bytes int64) float64 {
	if bytes <= 0 {
		return 0
	}
	return c.Total().Seconds() / (float64(bytes) / (1 << 30))
}

func rusage(who int) (CPU, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		return CPU{}, fmt.Errorf("getrusage(%d): %w", who, err)
	}
	return CPU{User: time.Duration(ru.Utime.Nano()), Sys: time.Duration(ru.Stime.Nano())}, nil
}

// ProcessCPU is the CPU time of the whole process so far, all threads,
// including io_uring's worker threads (they belong to the process) but not an
// SQPOLL thread's time, which uring reports separately.
func ProcessCPU() (CPU, error) { return rusage(unix.RUSAGE_SELF) }

// ThreadCPU is the CPU time of the calling OS thread; meaningful only when the
// goroutine is locked to it (runtime.LockOSThread).
func ThreadCPU() (CPU, error) { return rusage(unix.RUSAGE_THREAD) }
