package runtime

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
	"github.com/tutti-io/tutti/runtime/internal/catalog"
	"github.com/tutti-io/tutti/runtime/internal/devprobe"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/prewrite"
	"github.com/tutti-io/tutti/runtime/internal/ring"
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

// Open opens (or creates) the store in cfg.Dirs: it validates cfg, locks
// every directory (a second Open of the same store fails with an error
// wrapping ErrLocked), recovers the object map, rebuilds the prefix
// index from the recovered runs (Recovery reports both), allocates staging and
// starts the scheduler and the I/O worker. PathGPU fails with an error
// wrapping ErrGPUUnavailable when the kernels cannot run (see
// OpenWithFallback).
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	userDevice := cfg.Device != (DeviceProfile{})
	cfg = cfg.withDefaults()
	// Sized on either path, so that Stats.GPU.Reads says what PathGPU uses
	// on these devices; sized values are within Validate's ranges
	// (TestDeviceSizedGPUReads).
	gpuReads := cfg.sizeGPUReads()
	if cfg.Path == PathGPU && cfg.gpuBind == nil {
		if err := gpuAvailable(cfg.GPU.Device); err != nil {
			return nil, fmt.Errorf("runtime: open with path gpu: %w", err)
		}
	}
	s := &Store{cfg: cfg, geo: cfg.Geometry, loadN: make(chan struct{}, cfg.MaxLoads),
		gpuReads: gpuReads}
	s.savesCond.L = &s.mu
	var err error
	s.m, err = objmap.Open(objmap.Options{Dirs: cfg.Dirs, CapacityBytes: cfg.CapacityBytes, Geometry: cfg.Geometry, WritePool: cfg.WritePool,
		Buffered: cfg.buffered, SegmentBytes: cfg.segmentBytes})
	if err != nil {
		return nil, fmt.Errorf("runtime: open: %w", err)
	}
	fail := func(err error) (*Store, error) {
		if s.worker != nil {
			_ = s.worker.Close()
		}
		if s.sched != nil {
			s.sched.Close()
		}
		if s.consumers != nil {
			s.consumers.close()
		}
		if s.stager != nil {
			s.stager.close()
		}
		if s.staging != nil {
			_ = s.staging.close()
		}
		_ = s.m.Close()
		if s.idx != nil {
			_ = s.idx.Close()
		}
		return nil, fmt.Errorf("runtime: open: %w", err)
	}
	// Unbounded while recovery rebuilds it (so the rebuild evicts nothing
	// by the order it happens to place runs in); recover then sets the
	// store's capacity, evicting in the restored LRU order.
	idx, err := prefix.New(prefix.Config{CapacityBytes: prefix.MaxCapacityBytes})
	if err != nil {
		return fail(err)
	}
	if s.idx, err = s.openServed(idx); err != nil {
		return fail(err)
	}
	// A block costs its payload in the index's capacity: headers and
	// padding are covered by indexing only catalog.IndexShare of the pool.
	s.cat = catalog.New(s.m, s.idx, len(cfg.Dirs), s.geo.ChunkBytes())
	mapReport := s.m.Recovery()
	rep, err := s.cat.Recover(s.geo.Layers)
	if err != nil {
		return fail(err)
	}
	s.report = RecoveryReport{Map: mapReport, IndexedRuns: rep.IndexedRuns, IndexedBlocks: rep.IndexedBlocks,
		DroppedRuns: rep.DroppedRuns, DroppedReasons: rep.DroppedReasons, TrimmedBlocks: rep.TrimmedBlocks,
		DuplicateBlocks: rep.DuplicateBlocks, RefusedBlocks: rep.RefusedBlocks, EvictedAtOpen: rep.EvictedAtOpen,
		LRURestored: rep.LRURestored, LRUNote: rep.LRUNote}
	if err := s.idx.FinishRecovery(); err != nil {
		return fail(err)
	}
	if s.staging, err = newStagingPool(cfg.StagingBytes, cfg.StagingSlotBytes); err != nil {
		return fail(err)
	}
	if cfg.Path == PathCPU {
		s.consumers = newConsumePool(len(s.staging.all))
		s.staging.newReadIovecs(s.geo.PageBytesPerPlane())
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
		return fail(fmt.Errorf("starting the I/O engine: %w", err))
	}
	s.worker = ring.New("runtime io", eng, cfg.QueueDepth)
	s.maxWriteIOBytes = saveWriteBytes(s.geo, min(cfg.StagingSlotBytes, maxSaveWriteBytes), cfg.Path == PathGPU)
	s.saveSlots = saveSlotLimit(len(s.staging.all), cfg.Path)
	s.saveSlotTokens = make(chan struct{}, s.saveSlots)
	s.stager = newStagePool(s.saveSlots * s.wbufsPerSlot())
	profiles, reprobe := s.deviceProfiles(userDevice)
	devs := make([]sched.DeviceConfig, len(cfg.Dirs))
	for i := range devs {
		devs[i] = sched.DeviceConfig{Profile: profiles[i], MaxReadsInFlight: cfg.QueueDepth, MaxWritesInFlight: cfg.SaveWritesPerDevice,
			MaxReadBytesInFlight: cfg.StagingBytes, MaxWriteBytesInFlight: max(cfg.StagingBytes/4, s.maxWriteIOBytes), MaxPendingSaveBytes: cfg.SaveBudgetBytes}
	}
	if s.sched, err = iosched.New(sched.Config{Layers: s.geo.Layers, BlockTokens: s.geo.ChunkPages * s.geo.PageTokens,
		Compute: cfg.Compute, Devices: devs, SaveBoundNs: int64(cfg.SaveBoundMs) * 1e6, MaxWriteIOBytes: s.maxWriteIOBytes}); err != nil {
		return fail(err)
	}
	if reprobe != nil {
		s.reprobe = devprobe.NewReprober(reprobe, cfg.reprobeEvery, s.sched)
	}
	s.pre = prewrite.Start(s.m, cfg.NoPrewrite, "Config.NoPrewrite")
	return s, nil
}

// deviceProfiles is each directory's device model seed: the configured
// profile, or defaultDevice with the bandwidths probed on its device (Stats
// reports which), and the prober that re-measures the probed devices later
// where plans need it (nil: none). Under a test engine (NewEngine) the
// directories' devices are not what serves the I/O, so they are not probed.
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
	for i, o := range devprobe.Devices(cfg.Dirs, cfg.Device, probe) {
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

// maybeReprobe is called after every plan of runs: when the plan
// recomputes cached blocks because loading would not be faster, it asks
// for a re-probe of the device of the first block left out (devprobe's
// Reprober decides whether that device's model is stale). It never blocks.
func (s *Store) maybeReprobe(runs []loadRun, plan sched.Plan) {
	if s.reprobe == nil || !devprobe.Wanted(plan) {
		return
	}
	loaded := plan.LoadBlocks
	for _, lr := range runs {
		if loaded < lr.k {
			r := lr.run
			s.reprobe.Maybe(devprobe.Target{Device: r.Device, FD: int(r.File.FD), Path: r.File.Path, Offset: r.Offset, Length: r.Info.Length},
				s.begin, s.endOp)
			return
		}
		loaded -= lr.k
	}
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
