package runtime

import (
	"errors"
	"fmt"
	"time"

	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/devprobe"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu"
	"github.com/tutti-io/tutti/runtime/internal/savewrite"
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
	DefaultStagingSlotBytes = 16 << 20
	DefaultSaveBoundMs      = 2000
	DefaultMaxLoads         = 64
	// DefaultStagingBytesPerDir: StagingBytes' default grows with the
	// directories beyond DefaultStagingBytes' four, by one device's
	// DefaultSaveWritesPerDevice writes of the largest save write.
	DefaultStagingBytesPerDir = DefaultSaveWritesPerDevice * savewrite.MaxWriteBytes
	// DefaultSaveWritesPerDevice: a write counts from its dispatch, so this
	// keeps a device's queue fed while its next writes are gathered and
	// checksummed (BENCHMARKS.md, What the defaults rest on).
	DefaultSaveWritesPerDevice = 16
)

// Limits that bound what a Config may ask for.
const (
	maxQueueDepth  = 4096
	maxStagingSlot = 1 << 30 // one read is one uring op: its length is a uint32
	maxSaveBoundMs = 10 * 60 * 1000
	maxSaveWrites  = 256
)

// The scheduler's and the event publisher's settings as Config takes them,
// named here so that an engine fills a Config with this package and kvshape
// alone. They are aliases: the packages that define them keep their
// constructors and advanced knobs (sched.FitCompute, sched.ComputeFromFLOPs,
// kvevents.ParseSpec, kvevents.Format), whose values fit these fields as
// they are.
type (
	// ComputeModel predicts the prefill time of one layer (Config.Compute).
	ComputeModel = sched.ComputeModel
	// DeviceProfile is one device's measured rates (Config.Device).
	DeviceProfile = sched.DeviceProfile
	// KVEventsConfig is where and how the store publishes KV events
	// (Config.KVEvents).
	KVEventsConfig = kvevents.Config
)

// Config is what Open needs. The zero value of the tuning fields (QueueDepth,
// StagingBytes, StagingSlotBytes, SaveBoundMs, MaxLoads) means the default.
type Config struct {
	// Dirs are the store directories, one per device: every run spreads its
	// layers over them (objmap.Layout). Each is locked by Open against a
	// second process.
	Dirs []string
	// RunWidth is how many of the Dirs' devices each run of a new store
	// spreads over (objmap.Options.RunWidth): 0, the default, is every
	// directory (fewer only for a shape with fewer layers than
	// directories); 1 puts each run whole on one device, the layout of
	// stores made before objmap's manifest version 3 (kept to compare
	// against). An existing store keeps the width it was made with: 0 opens
	// it as made, another value must match it.
	RunWidth int
	// CapacityBytes is the on-disk capacity of the store (preallocated,
	// split evenly over Dirs).
	CapacityBytes int64
	// WritePool: a new store's pool is written with zeros at creation
	// (objmap.Options.WritePool says what that costs and buys).
	WritePool bool
	// NoPrewrite turns off the background prewrite: by default a store
	// whose pool has unwritten (fallocated) extents writes zeros over their
	// free parts while no load or save runs (package prewrite), so that its
	// saves overwrite written blocks, as with WritePool, without paying for
	// the whole pool at creation.
	NoPrewrite bool

	// Geometry is the model's KV shape; its fingerprint is in every header,
	// so a store written for another shape is never served.
	Geometry kvshape.Geometry
	// Layout is the engine's paged KV memory layout (per-layer tensors or
	// one cross-layer tensor).
	Layout kvshape.Layout
	// NumPages is the number of pages (blocks of Geometry.PageTokens tokens)
	// in the engine's paged KV memory; every page index is checked against it.
	NumPages int

	// Path selects the CPU or the GPU data path.
	Path Path

	// GPU configures PathGPU (ignored on PathCPU). Its zero value is the
	// setting measured best; see GPUConfig.
	GPU GPUConfig

	// QueueDepth bounds the I/Os in flight on each engine.
	QueueDepth int
	// StagingBytes is the off-heap staging memory allocated at Open; it
	// bounds the bytes of reads and writes in flight. Zero:
	// DefaultStagingBytes, or DefaultStagingBytesPerDir for each directory
	// where that is more (so that every device holds
	// DefaultSaveWritesPerDevice of the largest writes on PathGPU).
	StagingBytes int64
	// StagingSlotBytes is the unit of staging: one read or write is at most
	// one slot, so a (layer, run) larger than a slot takes several I/Os
	// (counted in Stats.Loads.SplitIOs), verified and scattered in parallel like
	// whole ones; smaller slots keep more reads in flight per device for the
	// same StagingBytes. Must divide StagingBytes.
	StagingSlotBytes int64
	// SaveWritesPerDevice bounds each device's save writes in flight. A
	// write counts from its dispatch, so this covers the writes being
	// gathered and checksummed as well as those in the device's queue; the
	// write buffers of StagingBytes bound them too. Zero:
	// DefaultSaveWritesPerDevice.
	SaveWritesPerDevice int
	// SaveBoundMs bounds how long a save may be deferred behind loads
	// before it is issued regardless (the scheduler's save bound).
	SaveBoundMs int
	// SaveBudgetBytes bounds the save bytes admitted and not yet written,
	// per device; a Save beyond it is admitted in part (counted as
	// SkipBudget). Zero: no byte budget; the save bound alone limits pending
	// saves to what the device can write within SaveBoundMs (a Save beyond
	// it is admitted in part, counted as SkipBound).
	SaveBudgetBytes int64
	// MaxLoads bounds the Loads in flight at once; Load returns
	// ErrBusy beyond it instead of queueing without bound.
	MaxLoads int

	// Compute predicts prefill time per layer (sched.FitCompute or
	// sched.ComputeFromFLOPs from the model profile); the scheduler loads a
	// cached block only where that beats recomputing it. Zero: no profile,
	// every cached block is loaded.
	Compute ComputeModel
	// Device is each directory's device profile (devbench); corrected online
	// from completions. Zero: Open probes each directory's device (a
	// time-limited burst of O_DIRECT writes and reads of a scratch file,
	// reported in Stats.Devices.Probes) and seeds its bandwidths from that;
	// a device it cannot probe, or any device under NewEngine, gets a
	// conservative SSD (defaultDevice), counted in
	// Stats.Devices.ProbeFailures.
	Device DeviceProfile

	// KVEvents, if set, publishes what the store serves as vLLM KV events
	// on a ZeroMQ PUB endpoint for cache-aware routers (see
	// runtime/internal/kvmeta and docs/routers.md). Open fails when its
	// endpoints cannot be bound.
	KVEvents *KVEventsConfig

	// NewEngine, if set, makes the I/O engine instead of a real io_uring
	// ring: tests pass a *uringsim.Sim here (seeded latency, fault injection).
	// It is called once per engine at Open; the store owns and closes it.
	NewEngine func() (uring.Engine, error)

	// gpuBind, if set (tests), binds PathGPU's restorer instead of package
	// kernels: Open then needs no GPU, and RegisterKV binds no ring and
	// registers no staging with CUDA.
	gpuBind func(cfg Config, kv []mover.Region) (gpu.Restorer, error)
	// probe, if set (tests), measures the devices instead of devprobe.Dir,
	// also under NewEngine.
	probe devprobe.Prober
	// reprobe, if set with probe (tests), re-measures reads instead of
	// devprobe.Reads, every reprobeEvery (0: devprobe.Every) at most.
	reprobe      devprobe.ReadProber
	reprobeEvery time.Duration
	// buffered (tests) opens the pool without O_DIRECT (objmap.Options.
	// Buffered), so a store can live on tmpfs; segmentBytes (tests, 0: the
	// default) bounds its journal segments (objmap.Options.SegmentBytes).
	buffered     bool
	segmentBytes int64
}

// GPUConfig is PathGPU's part of Config. Every zero field takes the value
// measured best, so an engine that sets nothing gets what BENCHMARKS.md
// measured (Restore into GPU memory): reads sized to the disks under Config.Dirs at Open
// (DeviceSizedGPUReads: the window is GPUReadWindow of their request queues,
// the largest read the largest they take unsplit), enough layers of
// lookahead to fill that window (GPULookaheadToFill), and the ring's helper
// in kick mode (no SQPOLL thread). Stats.GPU.Reads says what Open chose and
// what it could not read. A field set here wins over the sized value.
type GPUConfig struct {
	// Device is the CUDA device of the KV tensors.
	Device int
	// MaxPages bounds the pages one GPU restore moves (the kernels' staging
	// slots are sized for it); a longer load is cut, the rest is
	// recomputed. Zero: min(NumPages, 4096).
	MaxPages int
	// SQPoll gives the GPU's ring a kernel SQPOLL thread that submits what
	// the GPU publishes (the CPU helper only wakes it). Without it (the
	// default) the helper submits in batches, woken by completions (kernels'
	// kick mode): the same bandwidth at a fraction of the CPU, since the
	// SQPOLL thread polls a core while it is awake.
	SQPoll bool
	// MaxRuns bounds the runs (extents per layer) of one GPU restore.
	// Zero: 64.
	MaxRuns int
	// IOWindow bounds the GPU ring's reads in flight (kernels' IOWindow);
	// the ring's queue is sized to hold it. Zero: GPUReadWindow of the
	// disks under Dirs (a read that finds no free request tag goes to an
	// io-wq worker).
	IOWindow int
	// MaxIOBytes is the GPU path's largest read, a multiple of 4096 of at
	// most 16 MiB. Zero: the largest read every disk under Dirs takes
	// unsplit (max_sectors_kb), at most 4 MiB; 1 MiB where a disk does not say.
	MaxIOBytes int
	// Lookahead is how many layers beyond the one the engine waits for may
	// be in flight (staging is Lookahead+3 slots of one layer of MaxPages
	// pages, pinned). Zero: GPULookaheadToFill of the window.
	Lookahead int
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
	case kvshape.LayoutPerLayer, kvshape.LayoutCrossLayer:
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
	if c.SaveWritesPerDevice < 0 || c.SaveWritesPerDevice > maxSaveWrites {
		return configErr("SaveWritesPerDevice", "must be in [0, %d], got %d", maxSaveWrites, c.SaveWritesPerDevice)
	}
	if c.QueueDepth < 0 || c.QueueDepth > maxQueueDepth {
		return configErr("QueueDepth", "must be in [0, %d], got %d", maxQueueDepth, c.QueueDepth)
	}
	if c.RunWidth < 0 || c.RunWidth > len(c.Dirs) {
		return configErr("RunWidth", "must be in [0, %d] (the directories), got %d", len(c.Dirs), c.RunWidth)
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
	if c.GPU.Device < 0 {
		return configErr("GPU.Device", "must be >= 0, got %d", c.GPU.Device)
	}
	if c.GPU.MaxPages < 0 {
		return configErr("GPU.MaxPages", "must be >= 0, got %d", c.GPU.MaxPages)
	}
	if c.GPU.IOWindow < 0 || c.GPU.IOWindow > maxQueueDepth {
		return configErr("GPU.IOWindow", "must be in [0, %d], got %d", maxQueueDepth, c.GPU.IOWindow)
	}
	if c.GPU.MaxIOBytes < 0 || c.GPU.MaxIOBytes > 16<<20 || c.GPU.MaxIOBytes%objmap.BlockBytes != 0 {
		return configErr("GPU.MaxIOBytes", "must be a multiple of %d in [0, 16 MiB], got %d", objmap.BlockBytes, c.GPU.MaxIOBytes)
	}
	if c.GPU.Lookahead < 0 || c.GPU.Lookahead > 16 {
		return configErr("GPU.Lookahead", "must be in [0, 16], got %d", c.GPU.Lookahead)
	}
	if c.GPU.MaxRuns < 0 || c.GPU.MaxRuns > 4096 {
		return configErr("GPU.MaxRuns", "must be in [0, 4096], got %d", c.GPU.MaxRuns)
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
	if u := c.saveWriteUnit(); u > 0 && w.StagingSlotBytes < u {
		return configErr("StagingSlotBytes", "%d is smaller than the GPU save unit (%d bytes: whole pages and 4 KiB blocks)", w.StagingSlotBytes, u)
	}
	if c.KVEvents != nil {
		if err := c.KVEvents.Validate(); err != nil {
			return configErr("KVEvents", "%v", err)
		}
	}
	return nil
}

// saveWriteUnit is the size save writes must be whole multiples of on
// c.Path (0: any): PathGPU's gathers copy whole pages.
func (c *Config) saveWriteUnit() int64 {
	if c.Path == PathGPU {
		return gpu.WriteUnit(c.Geometry)
	}
	return 0
}

// withDefaults returns c with zero tuning fields replaced by their defaults
// (the GPU path's reads are sized by sizeGPUReads first).
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
		c.StagingBytes = max(DefaultStagingBytes, int64(len(c.Dirs))*DefaultStagingBytesPerDir)
		if c.StagingBytes < 2*c.StagingSlotBytes {
			c.StagingBytes = 2 * c.StagingSlotBytes
		}
		c.StagingBytes -= c.StagingBytes % c.StagingSlotBytes
	}
	if c.SaveWritesPerDevice == 0 {
		c.SaveWritesPerDevice = DefaultSaveWritesPerDevice
	}
	if c.SaveBoundMs == 0 {
		c.SaveBoundMs = DefaultSaveBoundMs
	}
	if c.MaxLoads == 0 {
		c.MaxLoads = DefaultMaxLoads
	}
	if c.GPU.MaxPages == 0 {
		c.GPU.MaxPages = min(c.NumPages, 4096)
	}
	if c.GPU.MaxRuns == 0 {
		c.GPU.MaxRuns = 64
	}
	if c.Compute == (ComputeModel{}) {
		c.Compute = defaultCompute
	}
	if c.Device == (DeviceProfile{}) {
		c.Device = defaultDevice
	}
	return c
}

// sizeGPUReads fills the GPU read settings left 0 from the disks under Dirs
// (GPUConfig's doc) and says what it chose. c has its defaults.
func (c *Config) sizeGPUReads() GPUReads {
	g := c.GPU
	r := DeviceSizedGPUReads(c.Dirs).Explicit(g.IOWindow, g.MaxIOBytes, 0)
	c.GPU.IOWindow, c.GPU.MaxIOBytes = r.Window, r.MaxIOBytes
	if g.Lookahead == 0 {
		layerBytes := int64(c.GPU.MaxPages) * c.Geometry.PageBytesPerLayer()
		c.GPU.Lookahead = GPULookaheadToFill(r.Window, r.MaxIOBytes, len(c.Dirs), layerBytes)
	}
	r.Lookahead = c.GPU.Lookahead
	return r
}
