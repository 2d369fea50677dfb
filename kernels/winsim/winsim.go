// Package winsim models the GPU restore's read pipeline on paced devices, on
// the CPU: the window of reads in flight that the GPU's I/O kernel keeps
// (tk_ring_kernel.cu: io_layer_kernel), the order it issues a plan's entries
// in, the kick loop that submits what the GPU published and posts
// completions in batches (kickloop.go: tk_kick_loop), the copy of each
// layer out of staging (tk_restore.cu: enqueue_layers), and devices that
// serve every request first come first served at a fixed rate (eval/emudev's
// pacer, which gives no credit for idle time). It answers which window,
// issue order and batching keep every device busy, before a GPU run: a
// device left without a queued read idles, and the restore's bytes/s over
// the devices' summed rate is the fraction a benchmark reports against the
// striped ceiling.
//
// The model is deterministic for a seed (Run). What it leaves out: the
// host's CPU (it is not the bottleneck on the paced devices), the block
// layer's request tags (a window above a device's queue would spill to
// io-wq workers: runtime.GPUReadWindow), and everything after the last
// layer's copy.
package winsim

import "fmt"

// Shape is a restore's reads: Layers layers of Extents extents (one per
// run, or per piece of a run), extent x of layer l on device
// (Device(x) + l) mod Devices (objmap.Layout: a run's layer l lies on device
// (home + l) mod W), each extent ReadsPerExtent reads of ReadBytes. A plan
// lists layer 0's extents in order, then layer 1's, and so on (BuildPlan).
type Shape struct {
	Layers, Extents, ReadsPerExtent, Devices int
	ReadBytes                                int64
	// Home is each extent's device for layer 0 (len Extents); nil: extent x
	// on device x mod Devices.
	Home []int
}

func (s Shape) device(layer, extent int) int {
	h := extent % s.Devices
	if s.Home != nil {
		h = s.Home[extent]
	}
	return (h + layer) % s.Devices
}

// Devices are the paced devices: each serves its requests in arrival order
// at BytesPerSec (emudev's pacer). A submitted read arrives SubmitNs later
// (io_uring, the loop device, FUSE) and its completion is queued for the
// ring CompleteNs after the device finished it; each latency gets a
// uniform jitter of up to JitterNs (seeded).
type Devices struct {
	BytesPerSec          float64
	SubmitNs, CompleteNs int64
	JitterNs             int64
}

// Kick is the CPU helper of a kick-mode ring (tk_kick_loop). Batch 0 models
// an issuer that sees every completion at once and whose refills reach the
// device at once (the CPU path's host ring, an SQPOLL thread).
type Kick struct {
	// Batch is the most completions one wait asks for (WakeBatch); a wait
	// asks for a quarter of the reads in flight, at most Batch, at least 1.
	Batch int
	// Ramp: at a restore's start the batch is capped at 1 + completions/Ramp
	// (WakeRamp; 0: no ramp).
	Ramp int
	// BatchWaitNs bounds a wait while reads are in flight (BatchWait);
	// IntervalNs×4 bounds a wait for a single completion (exact target).
	BatchWaitNs, IntervalNs int64
	// GapNs is from a wait's return to the next io_uring_enter: the SQEs the
	// GPU published by then are submitted; later ones wait for the next
	// return.
	GapNs int64
}

// GPU is the I/O kernel's timing: it reaps posted completions ReapNs after
// they are posted and publishes the SQEs that refill the window PublishNs
// after that (its next poll); a layer's kernel is followed by the next
// layer's LaunchNs after its last entry is reaped.
type GPU struct {
	ReapNs, PublishNs, LaunchNs int64
}

// Policy is what the GPU issues.
type Policy struct {
	// Window is the reads in flight as the GPU counts them: published and
	// not yet reaped (IOWindow).
	Window int
	// Lookahead: the kernel of layer l issues entries of layers up to
	// l+Lookahead (Config.Lookahead).
	Lookahead int
	// PerDevice > 0: at most this many of the window on one device; the
	// kernel issues, in plan order, the next entries whose device has room
	// (skipping ahead within the lookahead). 0: strictly in plan order.
	PerDevice int
}

// Pipeline is what a restore costs besides its reads: StartNs before the
// first SQE (the Load's plan and submit), and the copy of each layer out of
// staging, LayerCopyNs, one layer at a time, after its reads (the last
// layer's copy is the restore's tail).
type Pipeline struct {
	StartNs, LayerCopyNs int64
}

// Config is one modelled restore.
type Config struct {
	Shape    Shape
	Devices  Devices
	Kick     Kick
	GPU      GPU
	Policy   Policy
	Pipeline Pipeline
	Seed     uint64
}

// Result is a modelled restore. Times are from the restore's start.
type Result struct {
	TotalNs      int64 // the last layer ready
	ReadsDoneNs  int64 // the last read reaped
	FirstLayerNs int64 // layer 0 ready
	// IdealNs is the bytes over the devices' summed rate (each device's
	// share read back to back: the striped ceiling).
	IdealNs int64
	// Fraction is IdealNs over TotalNs: what a benchmark reports as
	// bytes/s over the striped ceiling.
	Fraction float64
	// Busy is each device's busy time over the read phase (StartNs to
	// ReadsDoneNs).
	Busy []float64
	// Enters counts the kick loop's io_uring_enter calls.
	Enters int
	// MaxDeviceInFlight is the most reads one device held at once (its
	// block queue needs that many request tags).
	MaxDeviceInFlight int
	// MeanDeviceInFlight is the reads all devices held (submitted, not
	// completed), averaged over the read phase: the part of the window
	// that is at the devices rather than published and not submitted, or
	// completed and not reaped.
	MeanDeviceInFlight float64
}

// Limits on a Config: the model is an event simulation of every read.
const (
	maxReads   = 1 << 20
	maxDevices = 1024
)

func (c Config) check() error {
	s, p := c.Shape, c.Policy
	switch {
	case s.Layers < 1 || s.Extents < 1 || s.ReadsPerExtent < 1 || s.ReadBytes < 1:
		return fmt.Errorf("winsim: shape %+v: want positive layers, extents, reads and bytes", s)
	case s.Devices < 1 || s.Devices > maxDevices:
		return fmt.Errorf("winsim: %d devices (want 1..%d)", s.Devices, maxDevices)
	case s.Layers*s.Extents*s.ReadsPerExtent > maxReads:
		return fmt.Errorf("winsim: %d reads (at most %d)", s.Layers*s.Extents*s.ReadsPerExtent, maxReads)
	case s.Home != nil && len(s.Home) != s.Extents:
		return fmt.Errorf("winsim: %d homes for %d extents", len(s.Home), s.Extents)
	case p.Window < 1 || p.Lookahead < 0 || p.PerDevice < 0:
		return fmt.Errorf("winsim: policy %+v: want a positive window and non-negative lookahead and per-device cap", p)
	case c.Devices.BytesPerSec <= 0:
		return fmt.Errorf("winsim: device rate %v B/s", c.Devices.BytesPerSec)
	case c.Kick.Batch < 0 || c.Kick.Ramp < 0:
		return fmt.Errorf("winsim: kick %+v", c.Kick)
	}
	for _, h := range s.Home {
		if h < 0 || h >= s.Devices {
			return fmt.Errorf("winsim: home device %d of %d", h, s.Devices)
		}
	}
	return nil
}

type evKind uint8

const (
	evArrive   evKind = iota // a read reaches its device
	evComplete               // a read's completion is queued for the ring
	evWake                   // the kick loop's wait ends (seq must match)
	evEnter                  // the kick loop enters io_uring_enter
	evReap                   // the GPU reaps posted completions
	evPublish                // the GPU publishes SQEs
)

type event struct {
	at   int64
	kind evKind
	n    int   // evReap: completions; evArrive/evComplete: entry
	seq  int64 // evWake: the wait it ends; ties keep insertion order
	ord  int64
}

type events []event

func (h events) Len() int { return len(h) }
func (h events) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].ord < h[j].ord
}
func (h events) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *events) Push(x any)   { *h = append(*h, x.(event)) }
func (h *events) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// OnPacedLoops is c with the devices, kick loop, GPU and pipeline of
// BENCHMARKS.md's threshold rows: 8 loop devices each paced to 1.5 GB/s by
// emudev, the GPU machine's kick ring (gpubench's and the runtime's
// defaults: batches of at most 32, ramp 8, 4 ms batch wait, 50 µs
// interval). Measured there: a store Load's submission (1 ms) and layer 0
// at 17-19 ms, 11.2 ms of it its reads, the rest its copy and scatter (5
// ms a layer here). Assumed, of the order the hardware gives: 20 µs from
// submission to the emulator and back (jitter 10 µs), the GPU reaping 1
// µs after a completion is posted and publishing its refill 5 µs later,
// the kick loop re-entering 2 µs after a wait returns: so the refill
// misses that entry and waits for the next batch, which with the batch
// sizes reproduces the 209-232 io_uring_enter calls measured per 4 GiB.
func OnPacedLoops(shape Shape, policy Policy) Config {
	return Config{
		Shape:    shape,
		Devices:  Devices{BytesPerSec: 1.5e9, SubmitNs: 20_000, CompleteNs: 20_000, JitterNs: 10_000},
		Kick:     Kick{Batch: 32, Ramp: 8, BatchWaitNs: 4_000_000, IntervalNs: 50_000, GapNs: 2_000},
		GPU:      GPU{ReapNs: 1_000, PublishNs: 5_000},
		Policy:   policy,
		Pipeline: Pipeline{StartNs: 1_000_000, LayerCopyNs: 5_000_000},
		Seed:     1,
	}
}
