package runtime

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/tutti-io/tutti/uring/blockdev"
)

// GPUReads are the GPU path's read settings sized to the devices of a set of
// store directories (DeviceSizedGPUReads): GPUConfig's IOWindow,
// MaxIOBytes and Lookahead.
type GPUReads struct {
	// Window is the reads in flight over all directories: GPUReadWindow of
	// their disks' request queue depths.
	Window int `json:"window"`
	// MaxIOBytes is the largest read every directory's disk takes unsplit
	// (blockdev.MaxReadBytes), at most 4 MiB: a split read goes to an io-wq
	// worker.
	MaxIOBytes int `json:"max_io_bytes"`
	// Lookahead is one layer in flight per directory, at least 2, at most 8
	// (GPULookaheadToFill also fills the window from the layer size).
	Lookahead int `json:"lookahead"`
	// Dirs is the number of directories asked about.
	Dirs int `json:"dirs"`
	// Unread has one line per fact that could not be read and what was
	// assumed instead (128 reads with no queue to stay within, 1 MiB
	// reads); empty when every
	// device answered.
	Unread []string `json:"unread"`
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
	// caps nothing (GPUReadWindow).
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
	r.Window = GPUReadWindow(depths)
	if len(dirs) == 0 {
		r.Window, r.MaxIOBytes = gpuWindowPerDevice, gpuUnknownReadBytes
	}
	r.Lookahead = min(max(gpuLookaheadAtLeast, len(dirs)), gpuLookaheadMax)
	return r
}

// GPUReadWindow is the one rule that sizes the GPU path's reads in flight
// from the devices' block request queues (nrRequests: each directory's
// queue/nr_requests, two directories on one disk counted twice): each device
// adds half its queue, at least 8 and at most 128; the sum is at most the
// smallest queue and 1024. Everything that describes the window names this
// function rather than restating it.
//
// Why half: a nonblocking read that finds no free request tag goes to an
// io-wq worker (CPU, and slower); three quarters still started such workers
// when one submission batch spanned several devices. Why the smallest queue:
// the GPU issues in layer order, so the window does not spread evenly and
// one device may hold most of it for a while.
func GPUReadWindow(nrRequests []int) int {
	sum, smallest := 0, gpuWindowTotal
	for _, n := range nrRequests {
		sum += min(gpuWindowPerDevice, max(gpuWindowMinDevice, n/2))
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

// GPULookaheadToFill is the lookahead that fills a window of reads of
// maxIOBytes with layers of layerBytes (a small layer on one disk otherwise
// leaves the window mostly empty), at least one per directory and 2, at most
// 16. The GPU path's staging is lookahead+3 slots of one layer, so this
// costs pinned host memory.
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
