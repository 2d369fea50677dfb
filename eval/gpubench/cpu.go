package gpubench

import (
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

type cpuMark struct {
	ru      time.Duration
	sqpoll  time.Duration
	t       time.Time
	threads threadCPU // start only: each thread's CPU, read before the clock starts
}

// start marks a path's start: the threads' CPU first (reading them is not
// timed), then mark.
func (b *gpuBench) start() cpuMark {
	th := readThreadCPU()
	m := b.mark()
	m.threads = th
	return m
}

func (b *gpuBench) mark() cpuMark {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	m := cpuMark{ru: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), t: time.Now()}
	if s, err := b.ring.SQPollCPUTime(); err == nil {
		m.sqpoll = s
	}
	return m
}

// finish fills the timing and CPU columns. Process rusage includes the
// SQPOLL thread on Linux 6.18 (uring's TestSQPollCPUTimeInRusage), so it is
// not added again; its share is reported on its own.
//
// It returns the threads' CPU read after the clock stopped (for a path that
// reports them).
func (b *gpuBench) finish(row *Row, m0 cpuMark, ios int64) threadCPU {
	m1 := b.mark()
	row.Bytes = b.totalBytes()
	row.Seconds = m1.t.Sub(m0.t).Seconds()
	row.BytesPerS = float64(row.Bytes) / row.Seconds
	gib := float64(row.Bytes) / (1 << 30)
	row.CPUSPerGiB = (m1.ru - m0.ru).Seconds() / gib
	row.SQPollCPUS = (m1.sqpoll - m0.sqpoll).Seconds()
	row.IOs = ios
	threads := readThreadCPU()
	n, cpu := ioWQDelta(m0.threads, threads)
	row.IOWQWorkers, row.IOWQCPUS = n, cpu.Seconds()
	return threads
}

func layerStats(row *Row, doneMs []float64) {
	if len(doneMs) == 0 {
		return
	}
	row.FirstLayerMs = doneMs[0]
	var iv []float64
	for i := 1; i < len(doneMs); i++ {
		iv = append(iv, doneMs[i]-doneMs[i-1])
	}
	if len(iv) == 0 {
		return
	}
	sort.Float64s(iv)
	row.LayerMsP50 = iv[len(iv)/2]
	row.LayerMsMax = iv[len(iv)-1]
}
