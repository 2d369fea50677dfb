package runtime

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/admission"
	"github.com/tutti-io/tutti/runtime/internal/catalog"
	"github.com/tutti-io/tutti/runtime/internal/devprobe"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/mover/cpu"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu"
	"github.com/tutti-io/tutti/runtime/internal/prewrite"
	"github.com/tutti-io/tutti/runtime/internal/ring"
	"github.com/tutti-io/tutti/runtime/internal/savewrite"
	"github.com/tutti-io/tutti/runtime/internal/staging"
	"github.com/tutti-io/tutti/sched"
	"github.com/tutti-io/tutti/uring"
)

// Defaults for the scheduler's models when Config leaves them zero.
var (
	// defaultCompute makes recomputation far slower than any load: without a
	// compute profile every cached block is loaded.
	defaultCompute = sched.ComputeModel{PerTokenNs: 1e6}
	// defaultDevice is a conservative SSD.
	defaultDevice = sched.DeviceProfile{ReadBytesPerSec: 2e9, WriteBytesPerSec: 1e9, ReadIOPS: 2e5, WriteIOPS: 1e5,
		ReadLatencyNs: 1e5, ReadShareUnderWrites: 0.5, WriteShareUnderReads: 0.5}
)

// Open's errors about the store on disk are the object map's, named here
// too so that an engine tells them apart (errors.Is) without importing
// objmap.
var (
	// ErrLocked: another Open holds a directory of the store.
	ErrLocked = objmap.ErrLocked
	// ErrGeometryMismatch: the store was written for another Geometry.
	ErrGeometryMismatch = objmap.ErrGeometryMismatch
	// ErrSettingsMismatch: the store was created with another capacity.
	ErrSettingsMismatch = objmap.ErrSettingsMismatch
	// ErrMissingDir: one of Dirs does not exist or holds no part of the
	// store, or the store spans more directories than Dirs lists.
	ErrMissingDir = objmap.ErrMissingDir
)

// ErrGPUUnavailable is wrapped by Open with PathGPU when the GPU path cannot
// run here; the kernels' cause (kernels.ErrNoGPU, kernels.ErrNotLoaded, ...)
// is wrapped too. Open never falls back to PathCPU by itself.
var ErrGPUUnavailable = errors.New("runtime: GPU path unavailable")

// Open opens (or creates) the store in cfg.Dirs: it validates cfg, locks
// every directory (a second Open of the same store fails with an error
// wrapping ErrLocked), recovers the object map, rebuilds the prefix
// index from the recovered runs (Recovery reports both), allocates staging and
// starts the scheduler and the I/O worker. PathGPU fails with an error
// wrapping ErrGPUUnavailable when the kernels cannot run (see
// OpenWithFallback).
func Open(cfg Config) (*Store, error) {
	s, userDevice, err := newStore(cfg, "open")
	if err != nil {
		return nil, err
	}
	cfg = s.cfg
	s.m, err = objmap.Open(objmap.Options{Dirs: cfg.Dirs, CapacityBytes: cfg.CapacityBytes, Geometry: cfg.Geometry, WritePool: cfg.WritePool,
		Buffered: cfg.buffered, SegmentBytes: cfg.segmentBytes, RunWidth: cfg.RunWidth})
	if err != nil {
		return nil, fmt.Errorf("runtime: open: %w", err)
	}
	if err := s.openIndex(); err != nil {
		return s.failOpen(err)
	}
	if err := s.openIO(userDevice); err != nil {
		return s.failOpen(err)
	}
	s.pre = prewrite.Start(s.m, cfg.NoPrewrite, "Config.NoPrewrite")
	return s, nil
}

// newStore is the beginning Open and Connect share: it validates cfg,
// fills its defaults and checks that PathGPU's kernels can run (an error
// wrapping ErrGPUUnavailable names op). userDevice says whether cfg gave a
// device profile (openIO probes the devices otherwise). The store has no
// parts yet: the caller opens them and, on failure, closes what it opened.
func newStore(cfg Config, op string) (s *Store, userDevice bool, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, false, err
	}
	userDevice = cfg.Device != (DeviceProfile{})
	cfg = cfg.withDefaults()
	// Sized on either path, so that Stats.GPU.Reads says what PathGPU uses
	// on these devices; sized values are within Validate's ranges
	// (TestDeviceSizedGPUReads).
	gpuReads := cfg.sizeGPUReads()
	if cfg.Path == PathGPU && cfg.gpuBind == nil {
		if err := gpu.Available(cfg.GPU.Device); err != nil {
			return nil, false, fmt.Errorf("runtime: %s with path gpu: %w: %w", op, ErrGPUUnavailable, err)
		}
	}
	s = &Store{cfg: cfg, geo: cfg.Geometry, loadN: make(chan struct{}, cfg.MaxLoads), gpuReads: gpuReads}
	s.savesCond.L = &s.mu
	return s, userDevice, nil
}

// openIndex opens the prefix index (with its KV events publisher) and
// rebuilds it from the object map's runs.
func (s *Store) openIndex() error {
	cfg := s.cfg
	// Unbounded while recovery rebuilds it (so the rebuild evicts nothing
	// by the order it happens to place runs in); Recover then sets the
	// store's capacity, evicting in the restored LRU order.
	idx, err := prefix.New(prefix.Config{CapacityBytes: prefix.MaxCapacityBytes})
	if err != nil {
		return err
	}
	// The catalog is made after the index: the publisher asks for the
	// contents only once Open returned.
	s.idx, err = s.openServed(idx)
	if err != nil {
		return err
	}
	// A block costs its payload in the index's capacity: headers and
	// padding are covered by indexing only catalog.IndexShare of the pool.
	s.cat = catalog.New(s.m, s.idx, len(cfg.Dirs), s.geo.ChunkBytes())
	s.ctl = &localControl{Local: admission.Local{Index: s.idx, Catalog: s.cat, Map: s.m}, s: s}
	s.files = s.m.Files()
	mapReport := s.m.Recovery()
	rep, err := s.cat.Recover(s.geo.Layers)
	if err != nil {
		return err
	}
	s.report = RecoveryReport{Map: mapReport, IndexedRuns: rep.IndexedRuns, IndexedBlocks: rep.IndexedBlocks,
		DroppedRuns: rep.DroppedRuns, DroppedReasons: rep.DroppedReasons, TrimmedBlocks: rep.TrimmedBlocks,
		DuplicateBlocks: rep.DuplicateBlocks, RefusedBlocks: rep.RefusedBlocks, EvictedAtOpen: rep.EvictedAtOpen,
		LRURestored: rep.LRURestored, LRUNote: rep.LRUNote}
	return s.idx.FinishRecovery()
}

// openIO allocates staging and starts the I/O worker, the scheduler, the
// mover of cfg.Path and the save write pipeline.
func (s *Store) openIO(userDevice bool) error {
	cfg := s.cfg
	var err error
	if s.staging, err = staging.New(cfg.StagingBytes, cfg.StagingSlotBytes); err != nil {
		return err
	}
	var eng uring.Engine
	if cfg.NewEngine != nil {
		eng, err = cfg.NewEngine()
	} else {
		rc := uring.DefaultConfig()
		rc.Entries = uint32(cfg.QueueDepth)
		rc.MaxInFlight = cfg.QueueDepth
		eng, err = uring.New(rc)
	}
	if err != nil {
		return fmt.Errorf("starting the I/O engine: %w", err)
	}
	s.worker = ring.New("runtime io", eng, cfg.QueueDepth)
	s.maxWriteIOBytes = savewrite.WriteBytes(s.geo, min(cfg.StagingSlotBytes, savewrite.MaxWriteBytes), cfg.saveWriteUnit())
	s.moved.ReadBytes, s.moved.WriteBytes = make([]atomic.Int64, len(cfg.Dirs)), make([]atomic.Int64, len(cfg.Dirs))
	profiles, reprobe := s.deviceProfiles(userDevice)
	devs := make([]sched.DeviceConfig, len(cfg.Dirs))
	for i := range devs {
		devs[i] = sched.DeviceConfig{Profile: profiles[i], MaxReadsInFlight: cfg.QueueDepth, MaxWritesInFlight: cfg.SaveWritesPerDevice,
			MaxReadBytesInFlight: cfg.StagingBytes, MaxWriteBytesInFlight: max(cfg.StagingBytes/4, s.maxWriteIOBytes), MaxPendingSaveBytes: cfg.SaveBudgetBytes}
	}
	if s.sched, err = iosched.New(sched.Config{Layers: s.geo.Layers, BlockTokens: s.geo.ChunkPages * s.geo.PageTokens,
		Compute: cfg.Compute, Devices: devs, SaveBoundNs: int64(cfg.SaveBoundMs) * 1e6, MaxWriteIOBytes: s.maxWriteIOBytes}); err != nil {
		return err
	}
	if reprobe != nil {
		s.reprobe = devprobe.NewReprober(reprobe, cfg.reprobeEvery, s.sched)
	}
	s.mv = s.newMover()
	s.writes = savewrite.New(savewrite.Config{Geometry: s.geo, Pool: s.pool(), Staging: s.staging, Worker: s.worker, Sched: s.sched, Mover: s.mv, MaxWriteIOBytes: s.maxWriteIOBytes,
		WriteIOs: &s.stats.writeIOs, LoadsInFlight: func() bool { return len(s.loadN) > 0 }, WriteBytes: s.moved.WriteBytes})
	return nil
}

// newMover is the mover of cfg.Path: the one place the two paths part.
func (s *Store) newMover() mover.Mover {
	cfg := s.cfg
	if cfg.Path == PathCPU {
		return cpu.New(cpu.Config{Geometry: s.geo, Layout: cfg.Layout, Pool: s.pool(), NumPages: cfg.NumPages, Staging: s.staging,
			Worker: s.worker, Sched: s.sched, Counters: &s.moved})
	}
	gc := gpuConfig(cfg, s.staging, s.sched, &s.moved)
	gc.Pool = s.pool()
	s.gpu = gpu.New(gc)
	return s.gpu
}

// pool is where the store's runs lie: the layout and the pool files, for
// the movers and the save pipeline.
func (s *Store) pool() mover.Pool { return mover.Pool{Layout: s.layout(), Files: s.files} }

// layout is the store's placement: its object map's, or a connected
// store's service's (sent in the hello; an engine never derives it).
func (s *Store) layout() objmap.Layout { return s.ctl.Layout() }

// storeDirs are the store's directories in its own order (objmap.Map.Dirs:
// the order it was created with, objmap.Layout's device index); a
// connected store's are the service's, in that order.
func (s *Store) storeDirs() []string {
	if s.remote != nil {
		return s.cfg.Dirs
	}
	return s.m.Dirs()
}

// gpuConfig is the GPU mover's config of cfg (defaults filled in), with the
// store's parts (nil in tests that only ask for the kernels' limits).
func gpuConfig(cfg Config, st *staging.Pool, sc *iosched.Scheduler, c *mover.Counters) gpu.Config {
	g := cfg.GPU
	gc := gpu.Config{Geometry: cfg.Geometry, Layout: cfg.Layout, NumPages: cfg.NumPages, Device: g.Device, MaxPages: g.MaxPages,
		MaxRuns: g.MaxRuns, IOWindow: g.IOWindow, MaxIOBytes: g.MaxIOBytes, Lookahead: g.Lookahead, SQPoll: g.SQPoll,
		QueueDepth: cfg.QueueDepth, Staging: st, Sched: sc, Counters: c}
	if cfg.gpuBind != nil {
		gc.Bind = func(kv []mover.Region) (gpu.Restorer, error) { return cfg.gpuBind(cfg, kv) }
	}
	return gc
}

// failOpen closes what Open made before err and returns it.
func (s *Store) failOpen(err error) (*Store, error) {
	_ = errors.Join(s.closeParts()...)
	_ = s.m.Close()
	if s.idx != nil {
		_ = s.idx.Close()
	}
	return nil, fmt.Errorf("runtime: open: %w", err)
}

// closeParts stops what moves bytes, in the order that leaves nothing in
// flight: the scheduler, the mover (its restores ended), the save pipeline
// (its gatherers), the ring, the staging. Any may be nil (a failed Open).
func (s *Store) closeParts() []error {
	var errs []error
	if s.sched != nil {
		s.sched.Close()
	}
	if s.mv != nil {
		errs = append(errs, s.mv.Close())
	}
	if s.writes != nil {
		errs = append(errs, s.writes.Close())
	}
	if s.worker != nil {
		errs = append(errs, s.worker.Close())
	}
	if s.staging != nil {
		errs = append(errs, s.staging.Close())
	}
	return errs
}

// deviceProfiles is each directory's device model seed: the configured
// profile, or defaultDevice with the bandwidths probed on its device (Stats
// reports which), and the prober that re-measures the probed devices later
// where plans need it (nil: none). Under a test engine (NewEngine) the
// directories' devices are not what serves the I/O, so they are not probed.
// Devices are the store's directories in its own order (objmap.Map.Dirs,
// the order it was created with: objmap.Layout's device index), whatever
// order a reopen lists them in.
func (s *Store) deviceProfiles(configured bool) (profiles []sched.DeviceProfile, reprobe devprobe.ReadProber) {
	cfg := s.cfg
	s.devProbes = make([]DeviceProbe, len(cfg.Dirs))
	profiles = make([]sched.DeviceProfile, len(cfg.Dirs))
	for i := range profiles {
		profiles[i] = cfg.Device
	}
	probe := cfg.probe
	switch {
	case configured:
		for i := range s.devProbes {
			s.devProbes[i] = DeviceProbe{State: ProbeConfigured, WriteBytesPerSec: cfg.Device.WriteBytesPerSec, ReadBytesPerSec: cfg.Device.ReadBytesPerSec}
		}
		return profiles, nil
	case probe == nil && cfg.NewEngine != nil:
		for i := range s.devProbes {
			s.devProbes[i] = seededProbe(cfg.Device, "Config.NewEngine serves the I/O, not these directories' devices")
		}
		return profiles, nil
	case probe == nil:
		probe, reprobe = devprobe.Dir, devprobe.Reads
	default: // a test's probe: re-probes only where the test asks
		reprobe = cfg.reprobe
	}
	for i, o := range devprobe.Devices(s.storeDirs(), cfg.Device, probe) {
		profiles[i] = o.Profile
		if o.Err != nil {
			s.devProbes[i] = seededProbe(cfg.Device, o.Err.Error())
			continue
		}
		s.devProbes[i] = DeviceProbe{State: ProbeMeasured, WriteBytesPerSec: o.Profile.WriteBytesPerSec, ReadBytesPerSec: o.Profile.ReadBytesPerSec,
			ProbeBytes: o.Rates.Bytes, ProbeNs: o.Rates.Took.Nanoseconds()}
	}
	return profiles, reprobe
}

// seededProbe is a directory left on seed, and why.
func seededProbe(seed sched.DeviceProfile, why string) DeviceProbe {
	return DeviceProbe{State: ProbeSeeded, Reason: why, WriteBytesPerSec: seed.WriteBytesPerSec, ReadBytesPerSec: seed.ReadBytesPerSec}
}

// OpenWithFallback opens cfg; when cfg.Path is PathGPU and the GPU path
// cannot run (ErrGPUUnavailable), it opens the same store on PathCPU instead
// and counts that in Stats.Path.Fallbacks with the reason. It never falls back for
// any other error.
func OpenWithFallback(cfg Config) (*Store, error) {
	s, err := Open(cfg)
	if err == nil || cfg.Path != PathGPU || !errors.Is(err, ErrGPUUnavailable) {
		return s, err
	}
	cfg.Path = PathCPU
	s, cerr := Open(cfg)
	if cerr != nil {
		return nil, errors.Join(err, cerr)
	}
	s.stats.fallbacks.Add(1)
	s.fallbackReason = err.Error()
	return s, nil
}
