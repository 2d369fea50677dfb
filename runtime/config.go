package runtime

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/sched"
	"github.com/tutti-io/tutti/uring"
)

// Path selects who moves the bytes between the store and the engine's KV memory.
type Path uint8

const (
	// PathCPU: io_uring submitted from Go into off-heap host staging, then
	// copied into host KV memory. Needs no GPU.
	PathCPU Path = iota
	// PathGPU: package kernels drives the reads and scatters into device KV
	// memory. Open fails (wrapping kernels.ErrNoGPU or kernels.ErrNotLoaded)
	// where that path cannot run; it never falls back to PathCPU by itself.
	PathGPU
)

func (p Path) String() string {
	switch p {
	case PathCPU:
		return "cpu"
	case PathGPU:
		return "gpu"
	}
	return fmt.Sprintf("Path(%d)", uint8(p))
}

// Defaults applied by Open to zero fields (Validate accepts zero for them).
const (
	DefaultQueueDepth       = 64
	DefaultStagingBytes     = 256 << 20
	DefaultStagingSlotBytes = 64 << 20
	DefaultSaveBoundMs      = 2000
	DefaultMaxLoads         = 64
	DefaultSaveBudgetBytes  = 2 << 30
)

// Limits that bound what a Config may ask for.
const (
	maxQueueDepth  = 4096
	maxStagingSlot = 1 << 30 // one read is one uring op: its length is a uint32
	maxSaveBoundMs = 10 * 60 * 1000
)

// Config is what Open needs. The zero value of the tuning fields (QueueDepth,
// StagingBytes, StagingSlotBytes, SaveBoundMs, MaxLoads) means the default.
type Config struct {
	// Dirs are the store directories; runs are striped over them. Each is
	// locked by Open against a second process.
	Dirs []string
	// CapacityBytes is the on-disk capacity of the store (preallocated,
	// split evenly over Dirs).
	CapacityBytes int64

	// Geometry is the model's KV shape; its fingerprint is in every header,
	// so a store written for another shape is never served.
	Geometry objmap.Geometry
	// Layout is the engine's paged KV memory layout (per-layer tensors or
	// one cross-layer tensor).
	Layout objmap.Layout
	// NumPages is the number of pages (blocks of Geometry.PageTokens tokens)
	// in the engine's paged KV memory; every page index is checked against it.
	NumPages int

	// Path selects the CPU or the GPU data path.
	Path Path

	// GPUDevice is the CUDA device of the KV tensors (PathGPU).
	GPUDevice int
	// GPUMaxPages bounds the pages one GPU restore moves (the kernels'
	// staging slots are sized for it); a longer load is cut, the rest is
	// recomputed. Zero: min(NumPages, 4096).
	GPUMaxPages int
	// GPUSQPoll gives the GPU's ring a kernel SQPOLL thread that submits
	// what the GPU publishes (the CPU helper only wakes it). Without it
	// (the default) the helper submits in batches, woken by completions
	// (kernels' kick mode): the same bandwidth in gpubench on the GPU
	// machine at a fraction of the CPU, since the SQPOLL thread polls a
	// core while it is awake.
	GPUSQPoll bool
	// GPULooseWakeTarget is kernels.Config.LooseWakeTarget for the GPU
	// ring's helper (kick mode): the first wait target, slower on the H200
	// (kept to compare).
	GPULooseWakeTarget bool
	// GPUMaxRuns bounds the runs (extents per layer) of one GPU restore.
	// Zero: 64.
	GPUMaxRuns int
	// GPUIOWindow bounds the GPU ring's reads in flight (kernels'
	// IOWindow); the ring's queue is sized to hold it. Zero: QueueDepth.
	// Size it to the devices (gpubench: half of each device's nr_requests,
	// at most 128 each, in all at most the smallest nr_requests; or
	// GPUReadsFromDevices): a read that finds no free request tag goes to
	// an io-wq worker.
	GPUIOWindow int
	// GPUMaxIOBytes is the GPU path's largest read, a multiple of 4096 of
	// at most 16 MiB: the largest read the devices take unsplit
	// (max_sectors_kb). Zero: 1 MiB.
	GPUMaxIOBytes int
	// GPULookahead is how many layers beyond the one the engine waits for
	// the GPU path may have in flight (its staging is Lookahead+3 slots of
	// one layer). Zero: 1.
	GPULookahead int
	// GPUReadsFromDevices sizes GPUIOWindow, GPUMaxIOBytes and
	// GPULookahead that are 0 to the disks under Dirs at Open
	// (DeviceSizedGPUReads: per directory half of nr_requests up to 128, in
	// all at most the smallest nr_requests; the largest read max_sectors_kb
	// allows up to 4 MiB; one layer per directory from 2 to 8), instead of
	// the defaults above; values set here win. A disk that does not say
	// adds 128 to the window and counts as taking 1 MiB reads. Stats.GPUReads says what was used and what could not be
	// read. Off by default: the defaults are what the GPU path was measured
	// with; a larger lookahead costs lookahead+3 layer slots of GPU staging.
	GPUReadsFromDevices bool

	// QueueDepth bounds the I/Os in flight on each engine.
	QueueDepth int
	// StagingBytes is the off-heap staging memory allocated at Open; it
	// bounds the bytes of reads and writes in flight.
	StagingBytes int64
	// StagingSlotBytes is the unit of staging: one read or write is at most
	// one slot, so a (layer, run) larger than a slot takes several I/Os
	// (counted in Stats.SplitIOs). Must divide StagingBytes.
	StagingSlotBytes int64
	// SaveBoundMs bounds how long a save may be deferred behind loads
	// before it is issued regardless (the scheduler's save bound).
	SaveBoundMs int
	// SaveBudgetBytes bounds the save bytes admitted and not yet written,
	// per device; a Save beyond it is admitted in part (counted as
	// SkipBudget). Zero: 2 GiB.
	SaveBudgetBytes int64
	// MaxLoads bounds the Loads in flight at once; Load returns
	// ErrBusy beyond it instead of queueing without bound.
	MaxLoads int

	// Compute predicts prefill time per layer (sched.FitCompute or
	// sched.ComputeFromFLOPs from the model profile); the scheduler loads a
	// cached block only where that beats recomputing it. Zero: no profile,
	// every cached block is loaded.
	Compute sched.ComputeModel
	// Device is each directory's device profile (devbench); corrected online
	// from completions. Zero: a conservative SSD (2 GB/s reads).
	Device sched.DeviceProfile

	// KVEvents, if set, publishes what the store serves as vLLM KV events
	// on a ZeroMQ PUB endpoint for cache-aware routers (see runtime/kvevents.go
	// and docs/routers.md). Open fails when its endpoints cannot be bound.
	KVEvents *kvevents.Config

	// NewEngine, if set, makes the I/O engine instead of a real io_uring
	// ring: tests pass a *uringsim.Sim here (seeded latency, fault injection).
	// It is called once per engine at Open; the store owns and closes it.
	NewEngine func() (uring.Engine, error)
}

// ErrConfig is wrapped by every Validate error.
var ErrConfig = errors.New("runtime: invalid config")

func configErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
}

// Validate reports the first field that is wrong, by name.
func (c *Config) Validate() error {
	if len(c.Dirs) == 0 {
		return configErr("Dirs", "at least one directory is needed")
	}
	seen := make(map[string]bool, len(c.Dirs))
	for i, d := range c.Dirs {
		if d == "" {
			return configErr(fmt.Sprintf("Dirs[%d]", i), "empty path")
		}
		if seen[d] {
			return configErr(fmt.Sprintf("Dirs[%d]", i), "%q listed twice", d)
		}
		seen[d] = true
	}
	if c.CapacityBytes <= 0 {
		return configErr("CapacityBytes", "must be > 0, got %d", c.CapacityBytes)
	}
	if err := c.Geometry.Validate(); err != nil {
		return configErr("Geometry", "%v", err)
	}
	switch c.Layout {
	case objmap.LayoutPerLayer, objmap.LayoutCrossLayer:
	default:
		return configErr("Layout", "unknown layout %d", c.Layout)
	}
	if c.NumPages <= 0 || c.NumPages > 1<<31-1 {
		return configErr("NumPages", "must be in [1, 2^31), got %d", c.NumPages)
	}
	switch c.Path {
	case PathCPU, PathGPU:
	default:
		return configErr("Path", "unknown path %d", c.Path)
	}
	if c.QueueDepth < 0 || c.QueueDepth > maxQueueDepth {
		return configErr("QueueDepth", "must be in [0, %d], got %d", maxQueueDepth, c.QueueDepth)
	}
	if c.StagingBytes < 0 {
		return configErr("StagingBytes", "must be >= 0, got %d", c.StagingBytes)
	}
	if c.StagingSlotBytes < 0 || c.StagingSlotBytes > maxStagingSlot {
		return configErr("StagingSlotBytes", "must be in [0, %d], got %d", maxStagingSlot, c.StagingSlotBytes)
	}
	if c.StagingSlotBytes%4096 != 0 {
		return configErr("StagingSlotBytes", "must be a multiple of 4096, got %d", c.StagingSlotBytes)
	}
	if c.SaveBoundMs < 0 || c.SaveBoundMs > maxSaveBoundMs {
		return configErr("SaveBoundMs", "must be in [0, %d], got %d", maxSaveBoundMs, c.SaveBoundMs)
	}
	if c.GPUDevice < 0 {
		return configErr("GPUDevice", "must be >= 0, got %d", c.GPUDevice)
	}
	if c.GPUMaxPages < 0 {
		return configErr("GPUMaxPages", "must be >= 0, got %d", c.GPUMaxPages)
	}
	if c.GPUIOWindow < 0 || c.GPUIOWindow > maxQueueDepth {
		return configErr("GPUIOWindow", "must be in [0, %d], got %d", maxQueueDepth, c.GPUIOWindow)
	}
	if c.GPUMaxIOBytes < 0 || c.GPUMaxIOBytes > 16<<20 || c.GPUMaxIOBytes%objmap.BlockBytes != 0 {
		return configErr("GPUMaxIOBytes", "must be a multiple of %d in [0, 16 MiB], got %d", objmap.BlockBytes, c.GPUMaxIOBytes)
	}
	if c.GPULookahead < 0 || c.GPULookahead > 16 {
		return configErr("GPULookahead", "must be in [0, 16], got %d", c.GPULookahead)
	}
	if c.GPUMaxRuns < 0 || c.GPUMaxRuns > 4096 {
		return configErr("GPUMaxRuns", "must be in [0, 4096], got %d", c.GPUMaxRuns)
	}
	if c.SaveBudgetBytes < 0 {
		return configErr("SaveBudgetBytes", "must be >= 0, got %d", c.SaveBudgetBytes)
	}
	if c.MaxLoads < 0 || c.MaxLoads > 1<<16 {
		return configErr("MaxLoads", "must be in [0, 65536], got %d", c.MaxLoads)
	}
	w := c.withDefaults()
	if w.StagingSlotBytes <= 0 {
		return configErr("StagingBytes", "%d is too small for two staging slots of 4096 bytes", c.StagingBytes)
	}
	if w.StagingBytes%w.StagingSlotBytes != 0 {
		return configErr("StagingBytes", "%d is not a multiple of StagingSlotBytes %d", w.StagingBytes, w.StagingSlotBytes)
	}
	if w.StagingBytes/w.StagingSlotBytes < 2 {
		return configErr("StagingBytes", "%d holds fewer than 2 slots of %d bytes (the load pipeline needs 2)", w.StagingBytes, w.StagingSlotBytes)
	}
	if pb := c.Geometry.PageBytesPerLayer(); w.StagingSlotBytes < pb {
		return configErr("StagingSlotBytes", "%d is smaller than one page of one layer (%d bytes)", w.StagingSlotBytes, pb)
	}
	if u := gpuWriteUnit(c.Geometry); c.Path == PathGPU && w.StagingSlotBytes < u {
		return configErr("StagingSlotBytes", "%d is smaller than the GPU save unit (%d bytes: whole pages and 4 KiB blocks)", w.StagingSlotBytes, u)
	}
	if c.KVEvents != nil {
		if err := c.KVEvents.Validate(); err != nil {
			return configErr("KVEvents", "%v", err)
		}
	}
	return nil
}

// withDefaults returns c with zero tuning fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.QueueDepth == 0 {
		c.QueueDepth = DefaultQueueDepth
	}
	if c.StagingSlotBytes == 0 {
		c.StagingSlotBytes = DefaultStagingSlotBytes
		if c.StagingBytes != 0 && c.StagingBytes/2 < c.StagingSlotBytes {
			c.StagingSlotBytes = c.StagingBytes / 2 &^ 4095
		}
	}
	if c.StagingBytes == 0 {
		c.StagingBytes = DefaultStagingBytes
		if c.StagingBytes < 2*c.StagingSlotBytes {
			c.StagingBytes = 2 * c.StagingSlotBytes
		}
		c.StagingBytes -= c.StagingBytes % c.StagingSlotBytes
	}
	if c.SaveBoundMs == 0 {
		c.SaveBoundMs = DefaultSaveBoundMs
	}
	if c.MaxLoads == 0 {
		c.MaxLoads = DefaultMaxLoads
	}
	if c.GPUMaxPages == 0 {
		c.GPUMaxPages = min(c.NumPages, 4096)
	}
	if c.GPUMaxRuns == 0 {
		c.GPUMaxRuns = 64
	}
	if c.GPUIOWindow == 0 {
		c.GPUIOWindow = c.QueueDepth
	}
	if c.GPUMaxIOBytes == 0 {
		c.GPUMaxIOBytes = 1 << 20
	}
	if c.GPULookahead == 0 {
		c.GPULookahead = 1
	}
	if c.SaveBudgetBytes == 0 {
		c.SaveBudgetBytes = DefaultSaveBudgetBytes
	}
	if c.Compute == (sched.ComputeModel{}) {
		c.Compute = defaultCompute
	}
	if c.Device == (sched.DeviceProfile{}) {
		c.Device = defaultDevice
	}
	return c
}
