package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// threadCPU is the CPU time (user+system, clock ticks) of each thread of
// this process, by tid, with its name: where the CPU seconds of a path go
// (Go threads, CUDA's own threads, the kick loop, the SQPOLL thread).
type threadCPU map[int]struct {
	name  string
	ticks int64
}

func readThreadCPU() threadCPU {
	out := threadCPU{}
	tasks, _ := filepath.Glob("/proc/self/task/*")
	for _, t := range tasks {
		tid, err := strconv.Atoi(filepath.Base(t))
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(t, "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		f := strings.Fields(s[close+1:])
		if len(f) < 13 { // fields 14 and 15 of stat: utime, stime
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		k, _ := strconv.ParseInt(f[12], 10, 64)
		out[tid] = struct {
			name  string
			ticks int64
		}{s[open+1 : close], u + k}
	}
	return out
}

// threadCPUDelta lists the threads that used at least one tick since before,
// most first, as "name[tid]=ms" (the kick loop's thread is named so).
func threadCPUDelta(before, after threadCPU, helperTID int) string {
	type row struct {
		name string
		ms   int64
	}
	var rows []row
	for tid, a := range after {
		d := a.ticks - before[tid].ticks
		if d <= 0 {
			continue
		}
		name := a.name
		if tid == helperTID {
			name = "kick-loop"
		}
		rows = append(rows, row{fmt.Sprintf("%s[%d]", name, tid), d * 10}) // USER_HZ = 100
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ms > rows[j].ms })
	var parts []string
	for i, r := range rows {
		if i == 8 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s=%dms", r.name, r.ms))
	}
	return strings.Join(parts, " ")
}
