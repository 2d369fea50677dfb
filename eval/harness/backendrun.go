package harness

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"time"

	"github.com/tutti-io/tutti/eval/blockstat"
	"github.com/tutti-io/tutti/eval/metrics"
)

// runBackend replays cfg.Requests through b, on fresh store directories
// under res.Dirs (removed after unless cfg.KeepStores), warmed first when
// res.Warm says so. A backend that is not available is a result with
// Skipped set, not an error; an error ends the replay of b.
func runBackend(ctx context.Context, cfg Config, res *Result, layers int, kv *KVMemory, b Backend, warm []warmStep) (BackendResult, error) {
	br := BackendResult{Backend: b.Name(), ComputeModel: cfg.Compute.Label, Storage: cfg.StorageLabel}
	label := func() {
		if l, ok := b.(Labeler); ok {
			br.Label = l.Label()
		}
	}
	label()
	if d, ok := b.(DirectIO); ok {
		br.DirectIO = d.DirectIO()
	}
	if err := b.Available(); err != nil {
		br.Skipped = err.Error()
		return br, nil
	}
	dirs := make([]string, len(res.Dirs))
	for i, root := range res.Dirs {
		dirs[i] = filepath.Join(root, b.Name())
		if err := emptyStoreDir(dirs[i], cfg.removalProgress(b.Name())); err != nil {
			return br, err
		}
	}
	env := Env{Profile: cfg.Profile, Geometry: kv.Geometry, Dirs: dirs, Dir: dirs[0], CapacityBlocks: res.CapacityBlocks,
		CapacityBytes: res.CapacityBytes, KV: kv, QueueDepth: cfg.QueueDepth}
	if err := b.Open(env); err != nil {
		if errors.Is(err, ErrUnavailable) {
			br.Skipped = err.Error()
			return br, nil
		}
		return br, fmt.Errorf("open: %w", err)
	}
	defer func() {
		b.Close()
		if !cfg.KeepStores {
			for _, d := range dirs {
				removeStoreDir(d, cfg.removalProgress(b.Name()))
			}
		}
	}()

	label() // some backends know their label only once open
	r := &backendRun{cfg: cfg, kv: kv, b: b, br: &br, layers: layers, index: NewIndex(res.CapacityBlocks)}
	r.self, r.selfIndexed = b.(SelfIndexed)
	if res.Warm != nil {
		br.WarmMs, br.WarmHistoryRequests = res.Warm.DurationMs, res.Warm.HistoryRequests
		if err := warmBackend(ctx, &br, warm, b, kv, r.index, dirs); err != nil {
			return br, err
		}
	}
	// The meters start after the warm-up: none of its I/O is counted.
	meter := blockstat.StartMeterPaths(dirs, cfg.EBPF)
	samp := startSampler(meter, 200*time.Millisecond)
	stopMeter := func() blockstat.Result {
		br.Device = samp.Stop()
		return meter.Stop()
	}
	cfg.GPU.SetBackend(b.Name()) // the live checks are kept per backend
	wall := time.Now()
	for seq := range cfg.Requests {
		if err := ctx.Err(); err != nil {
			stopMeter()
			return br, err
		}
		if err := r.request(seq); err != nil {
			stopMeter()
			return br, err
		}
		if cfg.Progress != nil {
			cfg.Progress(b.Name(), seq+1, len(cfg.Requests))
		}
		if cfg.PhaseProgress != nil {
			cfg.PhaseProgress(b.Name(), seq+1, len(cfg.Requests), r.clock.phases(time.Since(wall)))
		}
	}
	m := stopMeter()
	w := time.Since(wall)
	br.WallSeconds = w.Seconds()
	ph := r.clock.phases(w)
	br.Phases = &ph
	r.summarize(m, res)
	return br, nil
}

// backendRun is one backend's replay in progress: its index (unless the
// backend keeps its own) and the sums its result is made of.
type backendRun struct {
	cfg         Config
	kv          *KVMemory
	b           Backend
	br          *BackendResult
	layers      int
	index       *Index
	self        SelfIndexed
	selfIndexed bool

	loadCPU, saveCPU             time.Duration
	loadTime, saveTime           time.Duration
	withHits, hitBlocks, ios, rn int64
	clock                        phaseClock
}

// request replays request seq: restore its hit, prefill the rest, save
// what is new within the capacity; the pages are released after. Each
// step's wall time goes into r.clock (Phases).
func (r *backendRun) request(seq int) error {
	g, tr, c := r.kv.Geometry, r.cfg.Requests[seq], &r.clock
	req := &Request{Seq: seq, Trace: tr, Chain: tr.HashIDs}
	pages, err := r.kv.Alloc(len(req.Chain) * g.ChunkPages)
	if err != nil {
		return err
	}
	req.Pages = pages
	if r.selfIndexed {
		req.Hit = r.self.Lookup(req.Chain)
	} else {
		req.Hit = r.index.Lookup(req.Chain)
	}
	svc := Service{ArrivalMs: tr.ArrivalMs, Layers: r.layers}
	restored := 0
	live := r.cfg.GPU.Live(seq)
	var prefill *PrefillRun // on the GPU, next to the restore
	if req.Hit > 0 {
		if err := r.invalidate(req); err != nil {
			return err
		}
		if live {
			prefill = r.cfg.GPU.Start(tr.InputTokens, min(req.Hit*r.cfg.Profile.BlockTokens(), tr.InputTokens))
		}
		if restored, err = r.restore(req, &svc); err != nil {
			return err
		}
	}
	// The prefill computes the rest: its KV goes into the pages (only
	// needed when something will be saved from them).
	timed(&c.fill, func() {
		for blk := restored; blk < len(req.Chain) && r.b.Name() != "recompute"; blk++ {
			r.kv.FillBlock(req.Chain[blk], req.BlockPages(g.ChunkPages, blk))
			c.filled += g.ChunkBytes()
		}
	})
	cachedTokens := min(restored*r.cfg.Profile.BlockTokens(), tr.InputTokens)
	timed(&c.prefill, func() {
		svc.LayerCompute, err = r.cfg.GPU.Layer(live, prefill, r.cfg.Compute, tr.InputTokens-cachedTokens, cachedTokens)
	})
	if err != nil {
		return fmt.Errorf("request %d: %w", seq, err)
	}
	// Verified once the live prefill is collected: a verify on the GPU
	// beside it (a kernel over every restored page, and the test kit's
	// device-wide syncs) is harness work no engine has.
	if err := r.verifyRestored(req, restored); err != nil {
		return err
	}
	if err := r.save(req, &svc); err != nil {
		return err
	}
	r.kv.Release(pages)
	r.br.Services = append(r.br.Services, svc)
	r.br.Requests++
	return nil
}

// invalidate makes the pages of req's hit hold no block before its
// restore, so a restore that writes nothing cannot pass verification with
// stale content: the host pages are zeroed, or, for a backend restoring
// into its own memory (OwnMemory: its ToHost then overwrites the host
// pages before they are verified), its own pages are cleared instead.
func (r *backendRun) invalidate(req *Request) error {
	c := &r.clock
	hit := req.Pages[:req.Hit*r.kv.Geometry.ChunkPages]
	if hs, ok := r.b.(HostSyncer); ok && hs.OwnMemory() {
		var err error
		timed(&c.invalidate, func() { err = hs.Invalidate(req) })
		if err != nil {
			return fmt.Errorf("request %d: clearing the backend's pages: %w", req.Seq, err)
		}
		return nil
	}
	timed(&c.scribble, func() { r.kv.Scribble(hit) })
	return nil
}

// verifyRestored checks the blocks Chain[:blocks] the restore brought
// back: in the backend's own device memory where it can (DeviceVerifier),
// else in the host pages.
func (r *backendRun) verifyRestored(req *Request, blocks int) error {
	if blocks == 0 {
		return nil
	}
	g, c := r.kv.Geometry, &r.clock
	if dv, ok := r.b.(DeviceVerifier); ok {
		var bad int64
		var onDevice bool
		var err error
		timed(&c.verify, func() { bad, onDevice, err = dv.VerifyOnDevice(req, blocks) })
		if err != nil {
			return fmt.Errorf("request %d: %w", req.Seq, err)
		}
		if onDevice {
			r.br.VerifyMismatches += bad
			c.verified += int64(blocks) * g.ChunkBytes()
			return nil
		}
	}
	return r.verifyOnHost(req, blocks)
}

// verifyOnHost checks blocks Chain[:blocks] in the host pages, copied there
// first from a HostSyncer's own memory.
func (r *backendRun) verifyOnHost(req *Request, blocks int) error {
	g, c := r.kv.Geometry, &r.clock
	if hs, ok := r.b.(HostSyncer); ok && blocks > 0 {
		var err error
		timed(&c.toHost, func() { err = hs.ToHost(req, blocks) })
		if err != nil {
			return fmt.Errorf("request %d: copying restored KV to the host: %w", req.Seq, err)
		}
	}
	timed(&c.verify, func() {
		for blk := 0; blk < blocks; blk++ {
			r.br.VerifyMismatches += int64(r.kv.VerifyBlock(req.Chain[blk], req.BlockPages(g.ChunkPages, blk)))
			c.verified += g.ChunkBytes()
		}
	})
	return nil
}

// restore restores req's hit into its pages (invalidated by the caller),
// times it and returns how many blocks were restored (request verifies
// them, after the live prefill: verifyRestored).
func (r *backendRun) restore(req *Request, svc *Service) (int, error) {
	br, tr, c := r.br, req.Trace, &r.clock
	c0, _ := blockstat.ProcessCPU()
	t0 := time.Now()
	rr, err := r.b.Restore(req)
	d := time.Since(t0)
	c1, _ := blockstat.ProcessCPU()
	c.restore += d
	if err != nil {
		return 0, fmt.Errorf("request %d (trace line %d): restore: %w", req.Seq, tr.Line, err)
	}
	r.loadCPU += c1.Sub(c0).Total()
	if n := len(rr.LayerReady); n > 0 && rr.LayerReady[n-1] > 0 && rr.LayerReady[n-1] < d {
		d = rr.LayerReady[n-1] // the last layer's readiness ends the load
	}
	r.loadTime += d
	br.Fallbacks += int64(rr.Fallbacks)
	br.RestoredBytes += rr.Bytes
	br.ReadBytes += rr.ReadBytes
	if rr.ReadBytesPerDir != nil {
		if br.ReadBytesPerDir == nil {
			br.ReadBytesPerDir = make([]int64, len(rr.ReadBytesPerDir))
		}
		for i, n := range rr.ReadBytesPerDir {
			br.ReadBytesPerDir[i] += n
		}
	}
	r.withHits++
	r.hitBlocks += int64(rr.Blocks)
	r.ios += rr.IOs
	r.rn += int64(rr.Runs)
	if rr.Blocks > 0 {
		svc.LayerReady, svc.Load, svc.Bytes = rr.LayerReady, d, rr.Bytes
	}
	return rr.Blocks, nil
}

// save admits req's new blocks within the capacity (evicting what the
// index says), and saves them, timed.
func (r *backendRun) save(req *Request, svc *Service) error {
	br, tr := r.br, req.Trace
	end := len(req.Chain)
	if !r.selfIndexed {
		var evict []uint64
		end, evict = r.index.Admit(req.Chain, req.Hit)
		if err := r.b.Evict(evict); err != nil {
			return err
		}
		br.EvictedBlocks += int64(len(evict))
	}
	req.SaveEnd = end
	if end <= req.Hit {
		return nil
	}
	if hs, ok := r.b.(HostSyncer); ok {
		var err error
		timed(&r.clock.fromHost, func() { err = hs.FromHost(req) })
		if err != nil {
			return fmt.Errorf("request %d: copying KV to the backend: %w", req.Seq, err)
		}
	}
	c0, _ := blockstat.ProcessCPU()
	t0 := time.Now()
	sr, err := r.b.Save(req)
	d := time.Since(t0)
	c1, _ := blockstat.ProcessCPU()
	r.clock.save += d
	if err != nil {
		return fmt.Errorf("request %d (trace line %d): save: %w", req.Seq, tr.Line, err)
	}
	r.saveCPU += c1.Sub(c0).Total()
	r.saveTime += d
	svc.Save, svc.SaveBlocks = d, sr.Blocks
	br.SavedBytes += sr.Bytes
	br.SaveFallbacks += int64(sr.Fallbacks)
	if !r.selfIndexed {
		r.index.Insert(req.Chain, req.Hit, req.Hit+sr.Blocks)
	}
	return nil
}

// summarize fills the result's device counters from m and its metrics
// from the measured services and sums.
func (r *backendRun) summarize(m blockstat.Result, res *Result) {
	br := r.br
	br.LoadSeconds, br.SaveSeconds = r.loadTime.Seconds(), r.saveTime.Seconds()
	br.DeviceReadBytes = m.DeviceReadBytes()
	br.DeviceBytesSource = m.Source()
	br.DiskstatsReadBytes = m.DiskReadBytes
	br.DeviceWriteBytes = m.DiskWriteBytes
	if m.EBPF {
		br.DeviceWriteBytes = m.EBPFWriteBytes
		if m.ReadLatency.Count() > 0 {
			br.DeviceReadLatencyP50Us = float64(m.ReadLatency.Quantile(0.5)) / 1e3
			br.DeviceReadLatencyP99Us = float64(m.ReadLatency.Quantile(0.99)) / 1e3
		}
	}
	// Metrics from the measured services.
	o := Simulate(br.Services, 1)
	br.TTFTms = o.TTFTms
	s := metrics.Summarize(o.TTFTms)
	br.TTFTmsP50, br.TTFTmsP90, br.TTFTmsP99 = s.P50, s.P90, s.P99
	br.GPUStallMsMean = metrics.Mean(o.StallMs)
	// The rate curve waits for the settled SLO (settleSLO, after the backends).
	binMs := math.Max(1, (res.Trace.DurationMs+1)/200)
	br.BandwidthT, br.Bandwidth = Bandwidth(br.Services, o, binMs)
	br.HitBlocks = r.hitBlocks
	var refs int64
	for _, q := range r.cfg.Requests {
		refs += int64(len(q.HashIDs))
	}
	if refs > 0 {
		br.HitRatio = float64(r.hitBlocks) / float64(refs)
	}
	br.RequestsWithHitsRestore = int(r.withHits)
	br.ReadDirsMaxOverMean = maxOverMean(br.ReadBytesPerDir)
	if r.withHits > 0 {
		br.IOsPerRequestMean = float64(r.ios) / float64(r.withHits)
		br.IOsPerLayerRequestMean = br.IOsPerRequestMean / float64(r.layers)
		br.RunsPerRequestMean = float64(r.rn) / float64(r.withHits)
		br.BlocksPerRequestMean = float64(r.hitBlocks) / float64(r.withHits)
	}
	if r.loadTime > 0 {
		br.BytesPerS = float64(br.RestoredBytes) / r.loadTime.Seconds()
	}
	if res.CeilingBytesPS > 0 {
		br.CeilingFraction = br.BytesPerS / res.CeilingBytesPS
	}
	if res.CeilingSumBytesPS > 0 {
		br.CeilingSumFraction = br.BytesPerS / res.CeilingSumBytesPS
	}
	br.CPUSPerGiB = blockstat.CPU{User: r.loadCPU}.PerGiB(br.RestoredBytes)
	br.SaveCPUSPerGiB = blockstat.CPU{User: r.saveCPU}.PerGiB(br.SavedBytes)
}

// maxOverMean is the largest of ns over their mean (0 for none, or none
// read).
func maxOverMean(ns []int64) float64 {
	var sum, most int64
	for _, n := range ns {
		sum += n
		most = max(most, n)
	}
	if sum == 0 {
		return 0
	}
	return float64(most) * float64(len(ns)) / float64(sum)
}
