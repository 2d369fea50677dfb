package gpubench

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// hostCPU is the host's CPU time so far, from /proc/stat: every CPU's ticks
// summed (total) and those not idle or waiting for I/O (busy), over cpus
// CPUs. It is system-wide: the kernel threads of the devices (a loop
// device's worker, io_uring's io-wq) count, which a process's rusage leaves
// out. The zero value (cpus 0) is an unread one.
type hostCPU struct {
	busy, total uint64
	cpus        int
}

// maxProcStatBytes bounds the /proc/stat read (a few KiB per CPU).
const maxProcStatBytes = 4 << 20

// readHostCPU reads /proc/stat; where it cannot, the zero hostCPU (rows then
// show no busy figure).
func readHostCPU() hostCPU {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return hostCPU{}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxProcStatBytes))
	if err != nil {
		return hostCPU{}
	}
	h, err := parseProcStat(b)
	if err != nil {
		return hostCPU{}
	}
	return h
}

// parseProcStat reads the aggregate "cpu" line of /proc/stat (user nice
// system idle iowait irq softirq steal ..., in clock ticks; guest time is
// already in user) and counts the "cpuN" lines.
func parseProcStat(b []byte) (hostCPU, error) {
	var h hostCPU
	found := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<16)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || !strings.HasPrefix(fields[0], "cpu") {
			continue
		}
		if fields[0] != "cpu" {
			if _, err := strconv.Atoi(fields[0][3:]); err == nil {
				h.cpus++
			}
			continue
		}
		if found {
			return hostCPU{}, fmt.Errorf("/proc/stat: two aggregate cpu lines")
		}
		if len(fields) < 5 {
			return hostCPU{}, fmt.Errorf("/proc/stat: cpu line with %d fields, want at least 4 counters", len(fields)-1)
		}
		// Guest and guest_nice (fields 9 and 10) are part of user and nice.
		for i, f := range fields[1:min(len(fields), 9)] {
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return hostCPU{}, fmt.Errorf("/proc/stat: cpu counter %d: %w", i+1, err)
			}
			h.total += v
			if i != 3 && i != 4 { // idle, iowait
				h.busy += v
			}
		}
		found = true
	}
	if err := sc.Err(); err != nil {
		return hostCPU{}, fmt.Errorf("/proc/stat: %w", err)
	}
	if !found || h.cpus == 0 {
		return hostCPU{}, fmt.Errorf("/proc/stat: no aggregate cpu line or no cpuN lines")
	}
	return h, nil
}

// busyCPUs is how many of the host's CPUs were busy on average from a to b
// (0 where either is unread or no tick passed).
func busyCPUs(a, b hostCPU) float64 {
	if a.cpus == 0 || b.cpus == 0 || b.total <= a.total || b.busy < a.busy {
		return 0
	}
	return float64(b.busy-a.busy) / float64(b.total-a.total) * float64(b.cpus)
}
