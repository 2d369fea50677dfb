// Package gpubench is the logic of `tutti gpubench`: a real-shaped KV
// prefix restored into HBM through every I/O path and verified. The
// kernels-only paths (kernels.Restorer driven directly: the GPU-driven
// rings, host uring, per-block, cuFile, page cache, DRAM) run in rounds
// over data files laid out as the store lays out its runs, each divided by
// device ceilings sampled around it; the product paths (runtime.Store's
// Save and Load on PathGPU, store-gpu, and PathCPU, store-cpu) go through
// the store's own layout, planner and scheduler beside them, in rounds too,
// each operation divided by the write or read ceiling sampled around it
// (storerounds.go). --gpus N runs
// the tensor-parallel restore (runtime/tp) instead. cmd/tutti parses the
// flags and calls Run.
package gpubench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"time"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
	"github.com/tutti-io/tutti/sched"
)

// Store paths.
const (
	PathStoreGPU = "store-gpu"
	PathStoreCPU = "store-cpu"
)

// IsStorePath says whether p is one of RunStore's paths.
func IsStorePath(p string) bool { return p == PathStoreGPU || p == PathStoreCPU }

// StoreConfig is one RunStore call.
type StoreConfig struct {
	Model  string   // an eval/model profile
	Tokens int      // prefix length; 1..1<<22
	Dirs   []string // store directories (one per device); each gets a fresh subdirectory, removed after
	Label  string   // storage label printed with the rows
	Seed   uint64   // content and chain ids start here
	Paths  []string // of PathStoreGPU, PathStoreCPU, in order
	Device int      // GPU of store-gpu
	// Rounds: every path's operations run once per round (0: one round;
	// at most MaxRounds), each round in roundOrder's order of Paths.
	Rounds int
	// NoCeiling skips the ceilings (quick checks): the fractions stay 0.
	NoCeiling bool
	// WritePool creates each round's store with runtime.Config.WritePool:
	// its first save then overwrites written extents, as save-again does.
	WritePool bool
	// Prewrite lets each round's store prewrite its pool in the background
	// (runtime.Config's default) and starts the first save once that is
	// done: a store some time after its creation. Without it (and without
	// WritePool) the store runs with NoPrewrite, and its first save writes
	// unwritten extents: a save right after creation.
	Prewrite bool
	// CeilingMemBytes is each directory's memory for the ceilings: the read
	// ceiling's destination and the write ceiling's source (devbench's
	// bufferBytes; 0: one 1 MiB block per I/O in flight, devbench's
	// default), so that the ceilings move their bytes through as much
	// memory as a restore or a save does instead of what a last-level cache
	// holds. At most maxCeilingMem.
	CeilingMemBytes int64
	// StagingBytes and SaveWritesPerDevice are each round's store's
	// runtime.Config fields of those names (0: the runtime's defaults).
	StagingBytes        int64
	SaveWritesPerDevice int
	// Progress, if set, is told after each path of each round (done of
	// Rounds×len(Paths)).
	Progress func(phase string, done, total int)
}

const maxTokens = 1 << 22

// prewriteWait bounds the wait for a store's prewrite (StoreConfig.Prewrite).
const prewriteWait = 10 * time.Minute

// StoreRow is one measured operation of one path. Mismatches counts the
// 8-byte words of the restored pages that differ from what was saved (in HBM
// on store-gpu); a row with any is a failure.
type StoreRow struct {
	Path string `json:"path"`
	// Op is "save" (timed to the durable commit, into a fresh store's pool),
	// "restore", "restore-warm" (the same restore again), or "save-again"
	// (the prefix discarded and saved again into the space it held: a
	// store's steady state, where saves overwrite pool space written
	// before, as the write ceiling's writes do; a fresh pool's first writes
	// may also allocate on the file system).
	Op      string `json:"op"`
	Model   string `json:"model"`
	Storage string `json:"storage"`
	Dirs    int    `json:"dirs"`
	Tokens  int    `json:"tokens"`

	Blocks     int     `json:"blocks"` // chain blocks saved or restored
	Bytes      int64   `json:"bytes"`
	Seconds    float64 `json:"seconds"`
	BytesPerS  float64 `json:"bytes_per_s"`
	CPUSPerGiB float64 `json:"cpu_s_per_gib"` // process CPU (user+system) per GiB moved

	// CeilingBytesPS is the mean of the ceiling sampled just before and
	// just after the operation (the write ceiling for a save, the read
	// ceiling for a restore: Ceilings), CeilingFraction BytesPerS over it.
	CeilingBytesPS  float64 `json:"ceiling_bytes_per_s"`
	CeilingFraction float64 `json:"ceiling_fraction"`
	// The two samples themselves, of the row's round (of a merged row: the
	// round whose bytes/s is the median).
	CeilingBeforeBytesPS float64 `json:"ceiling_before_bytes_per_s,omitempty"`
	CeilingAfterBytesPS  float64 `json:"ceiling_after_bytes_per_s,omitempty"`
	// HostBusyCPUs is how many of the host's HostCPUs were busy on average
	// during the operation (busyCPUs: system-wide, the devices' kernel
	// threads included), CeilingBusyCPUs the same during its two ceiling
	// samples (their mean): an operation near HostCPUs is bound by the CPU,
	// and the ceiling's figure is what the devices alone cost it.
	HostBusyCPUs    float64 `json:"host_busy_cpus,omitempty"`
	CeilingBusyCPUs float64 `json:"ceiling_busy_cpus,omitempty"`
	HostCPUs        int     `json:"host_cpus,omitempty"`

	// Skipped counts a save's blocks not stored, by runtime.SkipCause name.
	Skipped    map[string]int `json:"skipped,omitempty"`
	Mismatches uint64         `json:"mismatches"`
	// Plan: what the store's planner did with the restore (blocks planned
	// of those cached).
	Planned int `json:"planned,omitempty"`
	// A restore's time split (seconds from its Load call): when Load
	// returned (the restore planned, dispatched and, on store-gpu, on the
	// GPU), when layer 0 and the last layer were ready (WaitLayer); Seconds
	// is to Wait. What a store Load costs beyond the kernels-only path's
	// restore shows here as a late submission, a slow first layer or a
	// tail after the last layer.
	SubmittedS  float64 `json:"submitted_s,omitempty"`
	FirstLayerS float64 `json:"first_layer_s,omitempty"`
	LastLayerS  float64 `json:"last_layer_s,omitempty"`
	// Threads is a restore's CPU by thread of this process, most first
	// (threadCPUDelta: "name[tid]=ms"; the GPU ring's kick loop is one of
	// the Go-named threads), read outside the clock: where CPUSPerGiB goes.
	Threads string `json:"threads,omitempty"`
	// A save's stage work (runtime.Stats.Saves.CopyNs, ChecksumNs),
	// summed over the stage workers: bytes into staging (store-gpu: the
	// HBM gathers) and their checksums.
	CopyS     float64 `json:"copy_s,omitempty"`
	ChecksumS float64 `json:"checksum_s,omitempty"`
	// A save's time split (runtime.SaveTiming, seconds from its Save
	// call): Save returned, its first write was staged, its last write
	// completed (the rest of Seconds is the last commit); the shortest and
	// longest of the devices' write spans. A late first write, devices
	// that write unevenly or a long commit show here.
	AdmittedS       float64 `json:"admitted_s,omitempty"`
	FirstWriteS     float64 `json:"first_write_s,omitempty"`
	WritesS         float64 `json:"writes_s,omitempty"`
	DeviceWritesMin float64 `json:"device_writes_min_s,omitempty"`
	DeviceWritesMax float64 `json:"device_writes_max_s,omitempty"`
	// store-cpu saves: writes sent from the engine's pages and those
	// staged through a copy, with why (runtime.Stats.Saves.DirectWrites,
	// StagedWrites, StagedReason).
	DirectWrites int64  `json:"direct_writes,omitempty"`
	StagedWrites int64  `json:"staged_writes,omitempty"`
	StagedReason string `json:"staged_reason,omitempty"`
	// store-cpu restores: reads into the engine's pages and those staged
	// through a copy (runtime.Stats.Loads.DirectReads, StagedReads;
	// StagedReason says why).
	DirectReads int64 `json:"direct_reads,omitempty"`
	StagedReads int64 `json:"staged_reads,omitempty"`
	// A first save with StoreConfig.Prewrite: the pool bytes the store's
	// background prewrite wrote before it, and the seconds from Open to its
	// end (it runs beside the benchmark's fill of the KV memory).
	PrewrittenBytes int64   `json:"prewritten_bytes,omitempty"`
	PrewriteS       float64 `json:"prewrite_s,omitempty"`
	// Rounds is how many rounds the row is the median of (mergeStoreRounds);
	// PerRound their values (bytes/s, ceiling, fraction, CPU s/GiB and the
	// path's position in each round).
	Rounds   int        `json:"rounds"`
	PerRound RoundStats `json:"per_round"`

	position int // where the path ran in its round (roundOrder)
}

func isSave(op string) bool { return op == "save" || op == "save-again" }

// Summary is a row in one line.
func Summary(r StoreRow) string {
	s := fmt.Sprintf("%d blocks, %.2f GiB in %.3f s = %.2f GB/s, x ceil %.3f (ceiling %.2f before, %.2f after), CPU %.4f s/GiB, mismatches %d",
		r.Blocks, float64(r.Bytes)/(1<<30), r.Seconds, r.BytesPerS/1e9, r.CeilingFraction, r.CeilingBeforeBytesPS/1e9, r.CeilingAfterBytesPS/1e9, r.CPUSPerGiB, r.Mismatches)
	if len(r.Skipped) > 0 {
		s += fmt.Sprintf(", skipped %v", r.Skipped)
	}
	if b := r.busy(); b != "" {
		s += ", host CPUs busy " + b
	}
	if isSave(r.Op) {
		s += fmt.Sprintf(", staging copies %.3f s, checksums %.3f s (summed over workers)", r.CopyS, r.ChecksumS)
		s += fmt.Sprintf(", admitted %.4f s, first write %.4f s, writes done %.4f s (devices %.4f-%.4f s)",
			r.AdmittedS, r.FirstWriteS, r.WritesS, r.DeviceWritesMin, r.DeviceWritesMax)
		if r.DirectWrites > 0 || r.StagedWrites > 0 {
			s += fmt.Sprintf(", writes from the pages %d, staged %d", r.DirectWrites, r.StagedWrites)
			if r.StagedReason != "" {
				s += " (" + r.StagedReason + ")"
			}
		}
		if r.PrewrittenBytes > 0 {
			s += fmt.Sprintf(", after the prewrite of %.2f GiB, done %.2f s after Open", float64(r.PrewrittenBytes)/(1<<30), r.PrewriteS)
		}
	} else {
		s += fmt.Sprintf(", submitted %.3f s, layer 0 at %.3f s, last layer at %.3f s", r.SubmittedS, r.FirstLayerS, r.LastLayerS)
		if r.DirectReads > 0 || r.StagedReads > 0 {
			s += fmt.Sprintf(", reads into the pages %d, staged %d", r.DirectReads, r.StagedReads)
			if r.StagedReason != "" {
				s += " (" + r.StagedReason + ")"
			}
		}
		if r.Threads != "" {
			s += ", threads: " + r.Threads
		}
	}
	return s
}

// busy is the row's host CPUs busy, "N of M (its ceilings' N)"; empty
// where /proc/stat was not read.
func (r StoreRow) busy() string {
	if r.HostCPUs == 0 {
		return ""
	}
	return fmt.Sprintf("%.1f of %d (ceilings %.1f)", r.HostBusyCPUs, r.HostCPUs, r.CeilingBusyCPUs)
}

// storeDirs makes a fresh subdirectory under each of dirs; cleanup removes them.
func storeDirs(dirs []string, path string) (sub []string, cleanup func(), err error) {
	cleanup = func() {
		for _, d := range sub {
			os.RemoveAll(d)
		}
	}
	for _, d := range dirs {
		s, err := os.MkdirTemp(d, "tutti-gpubench-"+path+"-")
		if err != nil {
			cleanup()
			return nil, func() {}, err
		}
		sub = append(sub, s)
	}
	return sub, cleanup, nil
}

// chainAndPages is the prefix: chain block ids from seed<<20 and its pages
// scattered over the engine's memory (page i of the prefix at dst[i]).
func chainAndPages(seed uint64, blocks, pages, numPages int) ([]uint64, []int32) {
	chain := make([]uint64, blocks)
	for i := range chain {
		chain[i] = seed<<20 + uint64(i) + 1
	}
	perm := rand.New(rand.NewPCG(seed, 7)).Perm(numPages)
	dst := make([]int32, pages)
	for i := range dst {
		dst[i] = int32(perm[i])
	}
	return chain, dst
}

// saveBoundMs is the store rows' save bound: long enough for any prefix
// RunStore takes on the slowest disk.
const saveBoundMs = 10 * 60 * 1000

// deviceProfile is the scheduler's profile of one directory from the ceilings
// measured in this run (each directory's share), as an engine passes
// devbench's; the zero Ceilings (NoCeiling) leave the store's default.
func deviceProfile(c Ceilings, dirs int) sched.DeviceProfile {
	if c.ReadBytesPS <= 0 || c.WriteBytesPS <= 0 {
		return sched.DeviceProfile{}
	}
	r, w := c.ReadBytesPS/float64(dirs), c.WriteBytesPS/float64(dirs)
	return sched.DeviceProfile{ReadBytesPerSec: r, WriteBytesPerSec: w, ReadIOPS: r / (64 << 10), WriteIOPS: w / (64 << 10),
		ReadLatencyNs: 1e5, ReadShareUnderWrites: 0.5, WriteShareUnderReads: 0.5}
}

// storeCapacity is the store's capacity for a prefix of blocks over dirs
// directories: every block with room to spare in each directory.
func storeCapacity(g kvshape.Geometry, blocks, dirs int) int64 {
	return runtime.CapacityForBlocksOn(g, blocks, dirs) + int64(dirs)*(64<<20)
}

// runStorePath is one path's operations in one round: a fresh store in
// fresh subdirectories of cfg.Dirs (removed after), the prefix saved,
// restored twice, discarded and saved again, each operation bracketed by
// samples of its ceiling (c; nil: none). It returns the rows measured so
// far with any error.
func runStorePath(ctx context.Context, cfg StoreConfig, path string, g kvshape.Geometry, blocks int, ceil Ceilings, c *storeCeilings) ([]StoreRow, error) {
	pages := blocks * g.ChunkPages
	numPages := pages + pages/8 + 16
	dirs, cleanup, err := storeDirs(cfg.Dirs, path)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	onGPU := path == PathStoreGPU
	kv, err := NewKV(g, numPages, onGPU, cfg.Device)
	if err != nil {
		return nil, err
	}
	defer kv.Free()
	chain, dst := chainAndPages(cfg.Seed, blocks, pages, numPages)
	// The save is measured whole: its bound and budget hold all of it (what
	// a default budget would cut is the replay's to count, not this row's).
	payload := int64(blocks) * g.ChunkBytes()
	sc := runtime.Config{Dirs: dirs, Geometry: g, Layout: kvshape.LayoutPerLayer, NumPages: numPages,
		CapacityBytes: storeCapacity(g, blocks, len(dirs)),
		SaveBoundMs:   saveBoundMs, SaveBudgetBytes: payload, Device: deviceProfile(ceil, len(dirs)), WritePool: cfg.WritePool,
		NoPrewrite: !cfg.Prewrite, StagingBytes: cfg.StagingBytes, SaveWritesPerDevice: cfg.SaveWritesPerDevice}
	if onGPU {
		sc.Path, sc.GPU.Device, sc.GPU.MaxPages = runtime.PathGPU, cfg.Device, pages
	}
	s, err := runtime.Open(sc)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	opened := time.Now()
	if err := s.RegisterKV(kv.Memory()); err != nil {
		return nil, err
	}
	if err := kv.fill(cfg.Seed, dst); err != nil {
		return nil, err
	}
	p := &storePathRun{ctx: ctx, c: c, s: s, kv: kv, seed: cfg.Seed, chain: chain, dst: dst, g: g}
	var rows []StoreRow
	add := func(r StoreRow) { r.Path = path; rows = append(rows, r) }
	var preS float64
	if cfg.Prewrite {
		if !s.WaitPrewrite(prewriteWait) {
			return nil, fmt.Errorf("the store's prewrite did not end within %v: %+v", prewriteWait, s.Stats())
		}
		preS = time.Since(opened).Seconds() // it started in Open, and ran beside the KV fill
		if p := s.Stats().Prewrite; p.Errors > 0 || p.State != runtime.PrewriteDone {
			return nil, fmt.Errorf("the store's prewrite: %v (%s), %d failed writes (%s)", p.State, p.Reason, p.Errors, p.LastError)
		}
	}
	save, err := p.save("save")
	if cfg.Prewrite {
		save.PrewrittenBytes, save.PrewriteS = s.Stats().Prewrite.WrittenBytes, preS
	}
	add(save)
	if err != nil {
		return rows, err
	}
	restore, err := p.restore("restore", save.Blocks, true)
	add(restore)
	if err != nil {
		return rows, err
	}
	// The same restore again on the now warm store and GPU context: what the
	// first one costs beyond it is paid once per store (first kernel
	// launches, first use of the restorer's buffers), not per Load.
	warm, err := p.restore("restore-warm", save.Blocks, true)
	add(warm)
	if err != nil {
		return rows, err
	}
	// The prefix discarded and saved into the space it held, then restored
	// (unmeasured) and verified: the row's Mismatches are that restore's.
	if _, err := s.Discard(chain[0]); err != nil {
		return rows, err
	}
	again, err := p.save("save-again")
	if err == nil && again.Blocks < save.Blocks {
		err = fmt.Errorf("saved %d of the %d blocks the first save did (skipped %v)", again.Blocks, save.Blocks, again.Skipped)
	}
	if err == nil {
		var check StoreRow
		check, err = p.restore("restore after save-again", again.Blocks, false)
		again.Mismatches = check.Mismatches
	}
	add(again)
	return rows, err
}

// storePathRun is what one path's operations act on.
type storePathRun struct {
	ctx   context.Context
	c     *storeCeilings
	s     *runtime.Store
	kv    *KV
	seed  uint64
	chain []uint64
	dst   []int32
	g     kvshape.Geometry
}

// save times a Save of the prefix to its commit (row op op) between two
// samples of the write ceiling.
func (p *storePathRun) save(op string) (StoreRow, error) {
	before, err := p.c.sample(p.ctx, true)
	if err != nil {
		return StoreRow{Op: op}, err
	}
	r, err := timeSave(p.s, p.chain, p.dst)
	r.Op = op
	if err != nil {
		return r, err
	}
	after, err := p.c.sample(p.ctx, true)
	p.bracket(&r, before, after)
	return r, err
}

// bracket puts the ceiling samples around r's operation in r.
func (p *storePathRun) bracket(r *StoreRow, before, after ceilingSample) {
	r.CeilingBeforeBytesPS, r.CeilingAfterBytesPS = before.BytesPS, after.BytesPS
	r.CeilingBytesPS, r.CeilingFraction = bracketFraction(r.BytesPerS, before.BytesPS, after.BytesPS)
	r.CeilingBusyCPUs = meanPositive(before.BusyCPUs, after.BusyCPUs)
}

// restore restores the saved prefix into poisoned memory (row op op), timed
// to Wait between two samples of the read ceiling when bracket, and
// verifies it: fewer than saved blocks restored is an error, mismatched
// words are counted.
func (p *storePathRun) restore(op string, saved int, bracket bool) (StoreRow, error) {
	r := StoreRow{Op: op}
	if err := p.kv.poison(); err != nil {
		return r, err
	}
	var before, after ceilingSample
	var err error
	if bracket {
		if before, err = p.c.sample(p.ctx, false); err != nil {
			return r, err
		}
	}
	r, err = timeLoad(p.s, p.chain, p.dst, p.g)
	r.Op = op
	if err != nil {
		return r, err
	}
	if bracket {
		if after, err = p.c.sample(p.ctx, false); err != nil {
			return r, err
		}
		p.bracket(&r, before, after)
	}
	r.Mismatches, err = p.kv.verify(p.seed, p.dst[:r.Blocks*p.g.ChunkPages])
	if err == nil && r.Blocks < saved {
		err = fmt.Errorf("%s: restored %d of the %d blocks saved (planned %d)", op, r.Blocks, saved, r.Planned)
	}
	return r, err
}

// cpuSeconds is the process's user+system CPU time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// rate fills r's time, bytes/s and CPU figures of an operation that
// started at t0 with the process's CPU time at c0 and the host's at h0.
func rate(r *StoreRow, t0 time.Time, c0 float64, h0 hostCPU) {
	r.Seconds = time.Since(t0).Seconds()
	h1 := readHostCPU()
	r.HostBusyCPUs, r.HostCPUs = busyCPUs(h0, h1), h1.cpus
	if r.Seconds > 0 {
		r.BytesPerS = float64(r.Bytes) / r.Seconds
	}
	if r.Bytes > 0 {
		r.CPUSPerGiB = (cpuSeconds() - c0) / (float64(r.Bytes) / (1 << 30))
	}
}

func timeSave(s *runtime.Store, chain []uint64, dst []int32) (StoreRow, error) {
	r := StoreRow{Op: "save"}
	before := s.Stats()
	h0, c0, t0 := readHostCPU(), cpuSeconds(), time.Now()
	sv, err := s.Save(chain, dst)
	if err != nil {
		return r, err
	}
	sv.Wait()
	after := s.Stats()
	r.CopyS = float64(after.Saves.CopyNs-before.Saves.CopyNs) / 1e9
	r.ChecksumS = float64(after.Saves.ChecksumNs-before.Saves.ChecksumNs) / 1e9
	r.DirectWrites = after.Saves.DirectWrites - before.Saves.DirectWrites
	r.StagedWrites = after.Saves.StagedWrites - before.Saves.StagedWrites
	if r.StagedWrites > 0 {
		r.StagedReason = after.Saves.StagedReason
	}
	r.Blocks = sv.Saved()
	r.Bytes = int64(r.Blocks) * s.Geometry().ChunkBytes()
	rate(&r, t0, c0, h0)
	saveTiming(&r, sv.Timing())
	for _, c := range runtime.SkipCauses() {
		if n := sv.Skipped(c); n > 0 {
			if r.Skipped == nil {
				r.Skipped = map[string]int{}
			}
			r.Skipped[c.String()] = n
		}
	}
	if r.Blocks == 0 {
		return r, fmt.Errorf("nothing saved (skipped %v)", r.Skipped)
	}
	return r, nil
}

// saveTiming puts a save's runtime.SaveTiming into its row, in seconds.
func saveTiming(r *StoreRow, tm runtime.SaveTiming) {
	r.AdmittedS, r.FirstWriteS, r.WritesS = float64(tm.AdmittedNs)/1e9, float64(tm.FirstWriteNs)/1e9, float64(tm.WritesNs)/1e9
	first := true
	for _, ns := range tm.DeviceWritesNs {
		if ns == 0 {
			continue
		}
		v := float64(ns) / 1e9
		if first || v < r.DeviceWritesMin {
			r.DeviceWritesMin = v
		}
		r.DeviceWritesMax = max(r.DeviceWritesMax, v)
		first = false
	}
}

func timeLoad(s *runtime.Store, chain []uint64, dst []int32, g kvshape.Geometry) (StoreRow, error) {
	r := StoreRow{Op: "restore"}
	n := s.Lookup(chain)
	if n == 0 {
		return r, errors.New("nothing of the saved prefix is cached")
	}
	before := s.Stats()
	th0 := readThreadCPU()
	h0, c0, t0 := readHostCPU(), cpuSeconds(), time.Now()
	l, err := s.Load(chain[:n], dst[:n*g.ChunkPages])
	if err != nil {
		return r, err
	}
	r.SubmittedS = time.Since(t0).Seconds()
	werr := l.WaitLayer(0)
	r.FirstLayerS = time.Since(t0).Seconds()
	if werr == nil {
		werr = l.WaitLayer(g.Layers - 1)
	}
	r.LastLayerS = time.Since(t0).Seconds()
	if err := l.Wait(); werr == nil {
		werr = err
	}
	r.Blocks, r.Planned = l.Blocks(), l.Planned()
	r.Bytes = int64(r.Blocks) * g.ChunkBytes()
	rate(&r, t0, c0, h0)
	r.Threads = threadCPUDelta(th0, readThreadCPU(), 0)
	after := s.Stats()
	r.DirectReads = after.Loads.DirectReads - before.Loads.DirectReads
	if r.StagedReads = after.Loads.StagedReads - before.Loads.StagedReads; r.StagedReads > 0 {
		r.StagedReason = after.Loads.StagedReason
	}
	if werr != nil {
		return r, fmt.Errorf("load: %w (first failure: %v)", werr, l.Failure())
	}
	return r, nil
}
