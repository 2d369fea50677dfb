// Package blockstat proves that a data path really read the device: it counts
// the bytes a block device served, two ways, and CPU time.
//
//   - eBPF (Tracer): two programs on the block_rq_issue and block_rq_complete
//     tracepoints, assembled with cilium/ebpf's asm package (no clang), count
//     read/write bytes and requests per device and a log2 latency histogram.
//     Needs root (CAP_BPF + CAP_PERFMON) and tracefs, which it mounts when
//     missing. Kprobes and fentry are not needed.
//   - /proc/diskstats (ReadDiskstats): sectors read and written per device,
//     always available; the cross-check, and the fallback where eBPF is
//     refused (the Meter records why).
//
// Both count the whole device, not one process: other I/O on the same disk
// during a measurement is included. So a measurement proves a lower bound
// ("the device served at least the bytes the backend claims to have read"),
// which is what the replay's invariant needs.
//
// Meter bundles the two around one measured interval for the devices that
// hold a set of paths (a striped store: their sum).
package blockstat

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// DiskCounts is one /proc/diskstats line (the fields used here).
type DiskCounts struct {
	Name                   string
	ReadIOs, ReadSectors   uint64 // completed reads, 512-byte sectors read
	WriteIOs, WriteSectors uint64
}

// ReadBytes is ReadSectors*512 (diskstats sectors are always 512 bytes).
func (c DiskCounts) ReadBytes() uint64 { return c.ReadSectors * 512 }

// WriteBytes is WriteSectors*512.
func (c DiskCounts) WriteBytes() uint64 { return c.WriteSectors * 512 }

// ReadDiskstats parses /proc/diskstats.
func ReadDiskstats() (map[Dev]DiskCounts, error) {
	f, err := os.Open("/proc/diskstats")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseDiskstats(bufio.NewScanner(f))
}

func parseDiskstats(sc *bufio.Scanner) (map[Dev]DiskCounts, error) {
	out := map[Dev]DiskCounts{}
	line := 0
	for sc.Scan() {
		line++
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 {
			continue
		}
		var v [10]uint64
		for i, j := range []int{0, 1, 3, 5, 7, 9} {
			n, err := strconv.ParseUint(fs[j], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("diskstats line %d field %d: %w", line, j+1, err)
			}
			v[i] = n
		}
		out[Dev{Major: uint32(v[0]), Minor: uint32(v[1])}] = DiskCounts{Name: fs[2],
			ReadIOs: v[2], ReadSectors: v[3], WriteIOs: v[4], WriteSectors: v[5]}
	}
	return out, sc.Err()
}

// Meter measures one interval on the disks holding a set of paths (one
// path, or the directories a striped store spans): diskstats always, eBPF
// when it can be loaded; counts are summed over the distinct disks. Use
// StartMeter or StartMeterPaths, then Stop once.
type Meter struct {
	devs       []Dev // distinct, in the order of the paths
	devErr     error
	tracer     *Tracer
	ebpfReason string
	diskBefore map[Dev]DiskCounts
	snapBefore Snapshot
}

// Result is what a Meter measured on its disks (byte and I/O counts summed
// over them).
type Result struct {
	Dev  Dev    // the first path's disk
	Devs []Dev  // every distinct disk counted (Dev first)
	Name string // diskstats name, e.g. "vda"; several joined with "+" ("loop0+loop1")
	// DeviceErr is set when the path is not on a block device: nothing was measured.
	DeviceErr string

	Diskstats           bool // diskstats counted (false only with DeviceErr)
	DiskReadBytes       uint64
	DiskWriteBytes      uint64
	DiskReadIOs         uint64
	EBPF                bool   // eBPF counted
	EBPFReason          string // why not, when EBPF is false
	EBPFReadBytes       uint64
	EBPFWriteBytes      uint64
	EBPFReadIOs         uint64
	ReadLatency         Histogram // eBPF only; over all devices
	UnmatchedCompletion uint64
	EBPFMissed          uint64 // completion-program runs skipped by the kernel (nested BPF): eBPF counts are then low
}

// DeviceReadBytes is the best count of bytes read: eBPF when it ran and the
// cross-check passed, otherwise diskstats (which counts every completion).
// The cross-check fails when the kernel reports skipped program runs, or
// when eBPF counted fewer bytes than diskstats over the same window: both
// count the whole device, and diskstats is read before the eBPF snapshot, so
// eBPF can only be lower by losing events (seen under -race on 2 cores with
// no skipped runs reported).
func (r Result) DeviceReadBytes() uint64 {
	if r.ebpfTrusted() {
		return r.EBPFReadBytes
	}
	return r.DiskReadBytes
}

func (r Result) ebpfTrusted() bool {
	return r.EBPF && (!r.Diskstats || (r.EBPFMissed == 0 && r.EBPFReadBytes >= r.DiskReadBytes))
}

// Source names where DeviceReadBytes came from, for reports.
func (r Result) Source() string {
	switch {
	case r.DeviceErr != "":
		return "none (" + r.DeviceErr + ")"
	case r.EBPF && r.EBPFMissed > 0 && r.Diskstats:
		return fmt.Sprintf("/proc/diskstats (eBPF counted %d bytes but the kernel skipped %d completion-program runs nested in other BPF programs)",
			r.EBPFReadBytes, r.EBPFMissed)
	case r.EBPF && !r.ebpfTrusted():
		return fmt.Sprintf("/proc/diskstats (eBPF counted %d bytes, %d fewer than diskstats: events lost)",
			r.EBPFReadBytes, r.DiskReadBytes-r.EBPFReadBytes)
	case r.EBPF:
		return "eBPF block tracepoints (diskstats cross-check)"
	default:
		return "/proc/diskstats (eBPF unavailable: " + r.EBPFReason + ")"
	}
}

// StartMeter starts measuring the disk holding path. With useEBPF false, or
// when eBPF is refused, it measures with diskstats alone and records why.
// It never fails as a whole: what could not be measured is in the Result.
func StartMeter(path string, useEBPF bool) *Meter {
	return StartMeterPaths([]string{path}, useEBPF)
}

// StartMeterPaths starts measuring every disk holding one of paths (paths on
// the same disk count it once), as StartMeter does for one. When one path is
// not on a block device, nothing is measured (DeviceErr names it): a sum
// missing a disk would understate the bytes read.
func StartMeterPaths(paths []string, useEBPF bool) *Meter {
	m := &Meter{}
	if len(paths) == 0 {
		m.devErr = errors.New("blockstat: no path to measure")
	}
	seen := map[Dev]bool{}
	for _, p := range paths {
		d, err := DiskOf(p)
		if err != nil {
			m.devErr, m.devs = err, nil
			break
		}
		if !seen[d] {
			seen[d] = true
			m.devs = append(m.devs, d)
		}
	}
	if m.devErr == nil {
		if ds, err := ReadDiskstats(); err != nil {
			m.devErr = fmt.Errorf("reading /proc/diskstats: %w", err)
		} else {
			m.diskBefore = ds
		}
	}
	if !useEBPF {
		m.ebpfReason = "not requested"
		return m
	}
	t, err := StartTracer()
	if err != nil {
		m.ebpfReason = err.Error()
		return m
	}
	snap, err := t.Snapshot()
	if err != nil {
		t.Close()
		m.ebpfReason = err.Error()
		return m
	}
	m.tracer, m.snapBefore = t, snap
	return m
}

// EBPF reports whether the meter traces with eBPF.
func (m *Meter) EBPF() bool { return m.tracer != nil }

// Sample returns what was measured so far without stopping.
func (m *Meter) Sample() Result {
	r := Result{EBPFReason: m.ebpfReason, Devs: m.devs}
	if len(m.devs) > 0 {
		r.Dev = m.devs[0]
	}
	if m.devErr != nil {
		r.DeviceErr = m.devErr.Error()
	} else if ds, err := ReadDiskstats(); err != nil {
		r.DeviceErr = err.Error()
	} else {
		names := make([]string, 0, len(m.devs))
		for _, d := range m.devs {
			now, before := ds[d], m.diskBefore[d]
			names = append(names, now.Name)
			r.DiskReadBytes += now.ReadBytes() - before.ReadBytes()
			r.DiskWriteBytes += now.WriteBytes() - before.WriteBytes()
			r.DiskReadIOs += now.ReadIOs - before.ReadIOs
		}
		r.Name, r.Diskstats = strings.Join(names, "+"), true
	}
	if m.tracer != nil {
		snap, err := m.tracer.Snapshot()
		if err != nil {
			r.EBPFReason = err.Error()
			return r
		}
		d := snap.Sub(m.snapBefore)
		r.EBPF = true
		for _, dev := range m.devs {
			c := d.Devices[dev]
			r.EBPFReadBytes += c.ReadBytes
			r.EBPFWriteBytes += c.WriteBytes
			r.EBPFReadIOs += c.ReadIOs
		}
		r.ReadLatency, r.UnmatchedCompletion, r.EBPFMissed = d.ReadLatency, d.Unmatched, d.Missed
	}
	return r
}

// Stop ends the measurement and returns it.
func (m *Meter) Stop() Result {
	r := m.Sample()
	if m.tracer != nil {
		if err := m.tracer.Close(); err != nil && r.EBPFReason == "" {
			r.EBPFReason = "closing tracer: " + err.Error()
		}
		m.tracer = nil
	}
	return r
}
