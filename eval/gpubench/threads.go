package gpubench

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tutti-io/tutti/uring"
)

// threadCPU is the CPU time of each thread of this process, by tid, with its
// name: where the CPU seconds of a path go (Go threads, CUDA's own threads,
// the kick loop, the SQPOLL thread).
type threadCPU map[int]struct {
	name string
	cpu  time.Duration
}

func readThreadCPU() threadCPU {
	out := threadCPU{}
	ents, _ := os.ReadDir("/proc/self/task")
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cpu, err := uring.ThreadCPUTime(tid)
		if err != nil {
			continue // the thread exited meanwhile
		}
		comm, _ := os.ReadFile("/proc/self/task/" + e.Name() + "/comm")
		out[tid] = struct {
			name string
			cpu  time.Duration
		}{strings.TrimSpace(string(comm)), cpu}
	}
	return out
}

// threadCPUDelta lists the threads that used CPU since before, most first,
// as "name[tid]=ms" (the kick loop's thread is named so); 8, then the sum of
// the others.
func threadCPUDelta(before, after threadCPU, helperTID int) string {
	type row struct {
		name string
		d    time.Duration
	}
	var rows []row
	for tid, a := range after {
		d := a.cpu - before[tid].cpu
		if d <= 0 {
			continue
		}
		name := a.name
		if tid == helperTID {
			name = "kick-loop"
		}
		rows = append(rows, row{fmt.Sprintf("%s[%d]", name, tid), d})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].d > rows[j].d })
	var parts []string
	var rest time.Duration
	for i, r := range rows {
		if i >= 8 {
			rest += r.d
			continue
		}
		parts = append(parts, fmt.Sprintf("%s=%.1fms", r.name, float64(r.d.Microseconds())/1000))
	}
	if rest > 0 {
		parts = append(parts, fmt.Sprintf("%d others=%.1fms", len(rows)-8, float64(rest.Microseconds())/1000))
	}
	return strings.Join(parts, " ")
}

// ioWQDelta counts the io_uring io-wq workers (threads named iou-wrk-*)
// that used CPU between before and after, and their CPU. A worker that
// exited in between is missing from after and not counted.
func ioWQDelta(before, after threadCPU) (workers int, cpu time.Duration) {
	for tid, a := range after {
		if !strings.HasPrefix(a.name, "iou-wrk") {
			continue
		}
		if d := a.cpu - before[tid].cpu; d > 0 {
			workers++
			cpu += d
		}
	}
	return workers, cpu
}
