package runtime

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/tutti-io/tutti/uring/blockdev"
)

// GPUReads are the GPU path's read settings sized to the devices of a set of
// store directories (DeviceSizedGPUReads): Config's GPUIOWindow,
// GPUMaxIOBytes and GPULookahead.
type GPUReads struct {
	// Window is the reads in flight over all directories: per directory
	// half of its disk's nr_requests, at least 8 and at most 128, summed;
	// then at most the smallest nr_requests of them all, and at most 1024.
	// Two directories on one disk count twice. Why half: a nonblocking read
	// that finds no free request tag goes to an io-wq worker (CPU, and
	// slower). On the H200's loop devices (nr_requests 128) a window of 128
	// per device put about half of the process's CPU time in io-wq workers;
	// 3/4 (96) still started 25-50 of them when one submission batch spanned
	// several devices (why is not established; one suspect is the batch of
	// request tags a plugged submission takes per device). Why the smallest
	// queue: the GPU issues in layer order, so the window does not spread
	// evenly and one device may hold most of it for a while. On 4 loops, 256
	// in all (64 each) started io-wq workers in most rounds and lost up to a
	// fifth of the bytes/s; 128 in all started none in 12 of 12 rounds, at
	// half the CPU per GiB (BENCHMARKS.md, kernels, Sessions 6 and 7).
	Window int
	// MaxIOBytes is the largest read every directory's disk takes unsplit
	// (blockdev.MaxReadBytes: 1 MiB on a loop device, 4 MiB on a virtio
	// disk), at most 4 MiB: a split read goes to an io-wq worker.
	MaxIOBytes int
	// Lookahead is one layer in flight per directory, at least 2, at most 8
	// (GPULookaheadToFill also fills the window from the layer size).
	Lookahead int
	// Dirs is the number of directories asked about.
	Dirs int
	// Unread has one line per fact that could not be read and what was
	// assumed instead (128 reads with no queue to stay within, 1 MiB
	// reads); empty when every
	// device answered.
	Unread []string
}

// Sizing limits of DeviceSizedGPUReads.
const (
	gpuWindowPerDevice  = 128     // reads in flight on one device at most
	gpuWindowMinDevice  = 8       // ... and at least
	gpuWindowTotal      = 1024    // over all devices
	gpuMaxReadBytes     = 4 << 20 // largest read asked for
	gpuUnknownReadBytes = 1 << 20 // a device that does not say
	// gpuUnknownQueue is the request queue depth counted for a device that
	// does not say: deep enough that it adds gpuWindowPerDevice reads and
	// caps nothing (windowFor).
	gpuUnknownQueue     = 1 << 30
	gpuLookaheadMax     = 8  // DeviceSizedGPUReads
	gpuLookaheadFillMax = 16 // GPULookaheadToFill (Config allows 16)
	gpuLookaheadAtLeast = 2
)

// DeviceSizedGPUReads sizes the GPU path's reads to the disks under dirs
// (blockdev.QueueDepth and MaxReadBytes, read from sysfs now). A directory
// not created yet is asked about through its nearest existing parent (Open
// creates it there). It never fails: a disk that does not say adds 128
// reads to the window (and no queue to stay within) and counts as taking
// 1 MiB reads, and Unread says which and why. No directories: the values
// for one unknown device.
func DeviceSizedGPUReads(dirs []string) GPUReads {
	r := GPUReads{MaxIOBytes: gpuMaxReadBytes, Dirs: len(dirs)}
	depths := make([]int, 0, len(dirs))
	for _, d := range dirs {
		p := existingAncestor(d)
		depth, err := blockdev.QueueDepth(p)
		if err != nil {
			r.Unread = append(r.Unread, fmt.Sprintf("window: %v; counting %d for it", err, gpuWindowPerDevice))
			depth = gpuUnknownQueue
		}
		depths = append(depths, depth)
		m, err := blockdev.MaxReadBytes(p)
		if err != nil {
			r.Unread = append(r.Unread, fmt.Sprintf("largest read: %v; using %d MiB for it", err, gpuUnknownReadBytes>>20))
			m = gpuUnknownReadBytes
		}
		r.MaxIOBytes = min(r.MaxIOBytes, m)
	}
	r.Window = windowFor(depths)
	if len(dirs) == 0 {
		r.Window, r.MaxIOBytes = gpuWindowPerDevice, gpuUnknownReadBytes
	}
	r.Lookahead = min(max(gpuLookaheadAtLeast, len(dirs)), gpuLookaheadMax)
	return r
}

// deviceWindow is one device's share of the window: half its request
// queue, gpuWindowMinDevice..gpuWindowPerDevice (GPUReads.Window says why;
// windowFor then caps the sum at the smallest queue).
func deviceWindow(nrRequests int) int {
	return min(gpuWindowPerDevice, max(gpuWindowMinDevice, nrRequests/2))
}

// windowFor is the window over devices with these request queue depths
// (nr_requests, one per directory): their deviceWindow shares summed, at
// most the smallest depth and gpuWindowTotal.
func windowFor(nrRequests []int) int {
	sum, smallest := 0, gpuWindowTotal
	for _, n := range nrRequests {
		sum += deviceWindow(n)
		smallest = min(smallest, n)
	}
	return min(sum, smallest)
}

// Explicit returns r with each of window, maxIOBytes and lookahead that is
// not 0 in place of the sized value: explicit settings win.
func (r GPUReads) Explicit(window, maxIOBytes, lookahead int) GPUReads {
	if window != 0 {
		r.Window = window
	}
	if maxIOBytes != 0 {
		r.MaxIOBytes = maxIOBytes
	}
	if lookahead != 0 {
		r.Lookahead = lookahead
	}
	return r
}

// String says the settings and what was not read, for notes and Stats.
func (r GPUReads) String() string {
	s := fmt.Sprintf("window %d reads, largest read %d KiB, lookahead %d layers (%d directories)",
		r.Window, r.MaxIOBytes>>10, r.Lookahead, r.Dirs)
	for _, u := range r.Unread {
		s += "; not read: " + u
	}
	return s
}

// GPULookaheadToFill is tutti gpubench's lookahead: enough layers of
// layerBytes to fill a window of reads of maxIOBytes (a small layer, MLA's
// 36 MiB at 32K tokens, on one disk otherwise leaves the window mostly
// empty), at least one per directory and 2, at most 16. The GPU path's
// staging is lookahead+3 slots of one layer, so this costs pinned host
// memory. Three per directory was tried for striped devices (a restore
// reads layer by layer, so no device runs further ahead of the slowest than
// the lookahead): on 4 RAM-backed loops, 70B, it was ahead by 5 % of the
// striped ceiling in one interleaved comparison and level in another, and
// it started more io-wq workers (up to 0.15× the per-block path's CPU per
// GiB); BENCHMARKS.md, kernels, Session 6.
func GPULookaheadToFill(window, maxIOBytes, dirs int, layerBytes int64) int {
	fill := int((int64(window)*int64(maxIOBytes) + layerBytes - 1) / max(layerBytes, 1))
	return min(max(gpuLookaheadAtLeast, dirs, fill), gpuLookaheadFillMax)
}

// existingAncestor is p, or its nearest parent that exists.
func existingAncestor(p string) string {
	for {
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(p)
		if parent == p {
			return p
		}
		p = parent
	}
}
