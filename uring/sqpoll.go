package uring

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// clockTicksPerSecond is USER_HZ, 100 on every Linux ABI Go supports.
const clockTicksPerSecond = 100

// SQPollTID is the thread id of this ring's iou-sqp kernel thread, or -1
// (no SQPOLL, or not identifiable because other threads were created
// concurrently with New).
func (r *Ring) SQPollTID() int {
	if r.sqTID < 0 && r.sqCandidates != nil {
		r.sqTID = resolveSQPollThread(r.sqCandidates)
		r.sqCandidates = nil
	}
	return r.sqTID
}

// SQPollCPUTime is the CPU time (utime+stime from /proc/self/task/TID/stat,
// 10 ms resolution) of this ring's iou-sqp thread. On Linux 6.18
// (TestSQPollCPUTimeInRusage checks it) getrusage(RUSAGE_SELF) already includes it,
// because the io thread belongs to the process's thread group: add it to
// rusage only on kernels where that test says otherwise.
func (r *Ring) SQPollCPUTime() (time.Duration, error) {
	if !r.cfg.SQPoll {
		return 0, fmt.Errorf("uring: SQPOLL CPU time: %w: ring has no SQPOLL thread", ErrInvalid)
	}
	if r.SQPollTID() < 0 {
		return 0, fmt.Errorf("uring: SQPOLL CPU time: %w: the ring's iou-sqp thread was not identified", ErrNotSupported)
	}
	return ThreadCPUTime(r.sqTID)
}

// ThreadCPUTime is the CPU time of thread tid of this process: the io_uring
// threads' share, or any other thread's, of the process's CPU time. It reads
// the thread's CPU-time clock (clock_gettime on the clock id the kernel
// derives from a tid of the caller's thread group, nanosecond resolution)
// and, where that fails, utime+stime from /proc/self/task/TID/stat (10 ms).
func ThreadCPUTime(tid int) (time.Duration, error) {
	if tid > 0 {
		// CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED over ^tid, as glibc's
		// pthread_getcpuclockid builds it.
		var ts unix.Timespec
		if unix.ClockGettime(int32(^uint32(tid)<<3|6), &ts) == nil {
			return time.Duration(ts.Nano()), nil
		}
	}
	b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("uring: reading thread %d CPU time: %w", tid, err)
	}
	d, err := parseStatCPU(string(b))
	if err != nil {
		return 0, fmt.Errorf("uring: reading thread %d CPU time: %w", tid, err)
	}
	return d, nil
}

// parseStatCPU extracts utime+stime from a /proc/.../stat line.
func parseStatCPU(s string) (time.Duration, error) {
	// Fields after the ")" that closes comm (which may itself contain
	// spaces and parentheses): state is field 3, utime 14, stime 15.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat: no comm")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed stat: %d fields after comm", len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil || ut > 1<<36 || st > 1<<36 {
		return 0, fmt.Errorf("malformed stat: utime %q stime %q", f[11], f[12])
	}
	return time.Duration(ut+st) * (time.Second / clockTicksPerSecond), nil
}
