package runtime

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/prefix"
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

// Open opens (or creates) the store in cfg.Dirs: it validates cfg, locks
// every directory (a second Open of the same store fails with an error
// wrapping objmap.ErrLocked), recovers the object map, rebuilds the prefix
// index from the recovered runs (Recovery reports both), allocates staging and
// starts the scheduler and the I/O worker. PathGPU fails with an error
// wrapping ErrGPUUnavailable when the kernels cannot run (see
// OpenWithFallback).
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.Path == PathGPU {
		if err := gpuAvailable(cfg.GPUDevice); err != nil {
			return nil, fmt.Errorf("runtime: open with path gpu: %w", err)
		}
	}
	s := &Store{cfg: cfg, geo: cfg.Geometry, runs: make(map[objmap.RunID]*runEntry), loadN: make(chan struct{}, cfg.MaxLoads)}
	s.savesCond.L = &s.mu
	var err error
	s.m, err = objmap.Open(objmap.Options{Dirs: cfg.Dirs, CapacityBytes: cfg.CapacityBytes, Geometry: cfg.Geometry})
	if err != nil {
		return nil, fmt.Errorf("runtime: open: %w", err)
	}
	fail := func(err error) (*Store, error) {
		if s.worker != nil {
			_ = s.worker.close()
		}
		if s.sched != nil {
			s.sched.close()
		}
		if s.staging != nil {
			_ = s.staging.close()
		}
		if s.plog != nil {
			_ = s.plog.close()
		}
		_ = s.m.Close()
		return nil, fmt.Errorf("runtime: open: %w", err)
	}
	capBytes := int64(float64(s.m.Stats().CapacityBytes) * indexShare)
	if s.idx, err = prefix.New(prefix.Config{CapacityBytes: max(capBytes, 1)}); err != nil {
		return fail(err)
	}
	if err := s.recover(); err != nil {
		return fail(err)
	}
	if s.staging, err = newStagingPool(cfg.StagingBytes, cfg.StagingSlotBytes); err != nil {
		return fail(err)
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
	s.worker = newIOWorker("runtime io", eng, cfg.QueueDepth)
	s.maxWriteIOBytes = min(cfg.StagingSlotBytes, 4<<20)
	if cfg.Path == PathGPU {
		// GPU gathers copy whole pages: cut writes at page and block boundaries.
		u := gpuWriteUnit(s.geo)
		s.maxWriteIOBytes = max(u, s.maxWriteIOBytes/u*u)
	}
	devs := make([]sched.DeviceConfig, len(cfg.Dirs))
	for i := range devs {
		devs[i] = sched.DeviceConfig{Profile: cfg.Device, MaxReadsInFlight: cfg.QueueDepth,
			MaxReadBytesInFlight: cfg.StagingBytes, MaxWriteBytesInFlight: max(cfg.StagingBytes/4, s.maxWriteIOBytes), MaxPendingSaveBytes: cfg.SaveBudgetBytes}
	}
	if s.sched, err = newScheduler(sched.Config{Layers: s.geo.Layers, BlockTokens: s.geo.ChunkPages * s.geo.PageTokens,
		Compute: cfg.Compute, Devices: devs, SaveBoundNs: int64(cfg.SaveBoundMs) * 1e6, MaxWriteIOBytes: s.maxWriteIOBytes}); err != nil {
		return fail(err)
	}
	return s, nil
}

// OpenWithFallback opens cfg; when cfg.Path is PathGPU and the GPU path
// cannot run (ErrGPUUnavailable), it opens the same store on PathCPU instead
// and counts that in Stats.Fallbacks with the reason. It never falls back for
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

// recover rebuilds the prefix index from the object map's recovered runs:
// each run hangs under the block its parent log record names; runs whose
// parent is unknown (dropped, or never recorded) are unreachable and freed.
func (s *Store) recover() error {
	parents, err := loadParentLog(s.cfg.Dirs[0])
	if err != nil {
		return err
	}
	var infos []objmap.RunInfo
	s.m.Runs(func(r objmap.RunInfo) bool { infos = append(infos, r); return true })
	hdr, err := uring.AllocBuffer(objmap.HeaderBytes)
	if err != nil {
		return err
	}
	defer hdr.Free()
	files := s.m.Files()
	rep := RecoveryReport{Map: s.m.Recovery()}
	drop := func(info *objmap.RunInfo, why string) {
		rep.DroppedRuns++
		rep.DroppedReasons = append(rep.DroppedReasons, fmt.Sprintf("run %d: %s", info.ID, why))
		_ = s.m.Free(info.ID)
	}
	type placed struct {
		run  *runEntry
		full []uint64 // chain from the root through the run's last block
	}
	where := make(map[uint64]struct {
		p     *placed
		chunk int
	})
	live := make(map[objmap.RunID]parentRef)
	bpb := s.bytesPerBlock()
	for i := range infos {
		info := &infos[i]
		p, ok := parents[info.ID]
		if !ok {
			drop(info, "no parent record")
			continue
		}
		// Runs are visited in id order and a parent is committed before any
		// child is allocated, so a live parent is already placed.
		var base []uint64
		if p.has {
			w, ok := where[p.id]
			if !ok {
				drop(info, fmt.Sprintf("parent block %#x is not stored", p.id))
				continue
			}
			base = w.p.full[:len(w.p.full)-w.p.run.chunks+w.chunk+1]
		}
		n, err := uring.Pread(files[info.File], hdr.Addr(), objmap.HeaderBytes, uint64(info.Offset))
		if err != nil || n != objmap.HeaderBytes {
			drop(info, fmt.Sprintf("reading header: %d bytes, %v", n, err))
			continue
		}
		h, err := objmap.DecodeHeader(hdr.Bytes())
		if err == nil {
			if why := h.Matches(s.geo, info); why != nil {
				err = why
			}
		}
		if err != nil {
			drop(info, "header: "+err.Error())
			continue
		}
		full := append(append(make([]uint64, 0, len(base)+len(info.Chain)), base...), info.Chain...)
		res, err := s.idx.Reserve(full, len(base), bpb)
		if err != nil || res.N != len(info.Chain) {
			if res.N > 0 {
				if _, aerr := s.idx.Abort(full[len(base) : len(base)+res.N]); aerr != nil {
					return fmt.Errorf("rebuilding the index: %w", aerr)
				}
			}
			drop(info, fmt.Sprintf("index refused it (%v, %v)", res.Stop, err))
			continue
		}
		s.release(res.Evicted)
		e := &runEntry{id: info.ID, file: files[info.File], device: s.deviceOf(info.File), offset: info.Offset,
			chunks: len(info.Chain), crcs: h.LayerCRCs, chain: info.Chain, parent: p, live: len(info.Chain)}
		s.runs[e.id] = e
		locs := make([]uint64, len(info.Chain))
		for c := range locs {
			locs[c] = loc(e.id, c)
		}
		dropped, err := s.idx.Commit(info.Chain, locs)
		if err != nil {
			return fmt.Errorf("rebuilding the index: %w", err)
		}
		s.release(dropped)
		pl := &placed{run: e, full: full}
		for c, id := range info.Chain {
			where[id] = struct {
				p     *placed
				chunk int
			}{pl, c}
		}
		live[e.id] = p
		rep.IndexedRuns++
		rep.IndexedBlocks += len(info.Chain)
	}
	// Evictions while rebuilding may have freed runs; keep what is live.
	s.mu.Lock()
	for id := range live {
		if _, ok := s.runs[id]; !ok {
			delete(live, id)
		}
	}
	s.mu.Unlock()
	if err := s.m.Sync(); err != nil {
		return err
	}
	if s.plog, err = rewriteParentLog(s.cfg.Dirs[0], live); err != nil {
		return err
	}
	s.report = rep
	return nil
}
