package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tutti-io/tutti/eval/metrics"
	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/trace"
	"github.com/tutti-io/tutti/kvshape"
	"golang.org/x/sys/unix"
)

// Config of a replay.
type Config struct {
	Requests []trace.Request // arrival times final (window, scale, spread applied)
	Profile  model.Profile
	Dir      string    // store root; each backend gets Dir/<name>
	Backends []Backend // run in this order on the same requests
	// Dirs, when set, are several store roots (one file system each, e.g.
	// one per device) that every backend stripes over: each gets
	// root/<name> in every root. Dir is then unused.
	Dirs []string
	// StorageLabel describes the storage under the roots for the report and
	// every JSON row (e.g. "emulated storage (4 RAM-backed loop devices)").
	StorageLabel string
	// CapacityBlocks caps the storage of every backend (evicting leaf-first
	// LRU beyond it); 0 = every distinct block of the requests fits, capped
	// at half the free space the roots hold together (freeAcross).
	CapacityBlocks int
	// MaxKVBytes bounds the engine KV memory (sized for the largest request);
	// requests needing more are left out of the replay for every backend
	// (counted in Result.Oversize). 0 = half of MemAvailable, at most 16 GiB.
	MaxKVBytes int64
	// KeepStores keeps each backend's directory after its run (default:
	// removed, so backends run one after another never hold the disk twice).
	KeepStores bool
	QueueDepth int     // I/Os in flight per backend; 0 = 64
	Compute    Compute // prefill model
	SLOms      float64 // p90 TTFT target; 0 = 2 × recompute's unloaded p90
	EBPF       bool    // count device bytes with eBPF (else diskstats only)
	// GPU, when set (SetupCompute), runs each request's prefill GEMMs on the
	// GPU next to its restore and its measured layer times replace Compute's.
	GPU *GPUCompute
	// CeilingBytes is the size of the devbench ceiling file, one in each
	// store root (ceilingAcross); 0 = the window's distinct block bytes
	// (its working set) over the roots, within [256 MiB, 4 GiB] each,
	// negative = do not measure a ceiling.
	CeilingBytes int64
	// Rounds is how many times every backend replays the window (≤ 1:
	// once), interleaved: a comparison then carries its spread.
	Rounds int
	// Progress, if set, is called after each request of each backend.
	Progress func(backend string, done, total int)
	// PhaseProgress, if set, is called after each request of each backend
	// with where its wall time went so far (a run cut short still says it).
	PhaseProgress func(backend string, done, total int, p Phases)
	// Stage, if set, is told of the work between the backends' requests
	// that can take seconds: the device ceiling's measurement (0 of 1, then
	// 1 of 1) and a store's removal that lasts (files removed of all).
	Stage func(what string, done, total int)
	// Workload names what the requests are (WorkloadDocQA, or a trace),
	// for the claims and the summary's first lines.
	Workload string
	// Warm, when set, starts every caching backend's window from the store
	// the history's requests would have left (warm.go): the blocks of the
	// history the window references are saved first, untimed, through the
	// shared index and each backend's own save path; nothing of it counts
	// in any metric of the window. Nil: every backend starts empty.
	Warm *Warm
}

// BackendResult is one backend's row: the --json object.
type BackendResult struct {
	Backend string `json:"backend"`
	Label   string `json:"label,omitempty"`
	// Rounds holds every round's figures when the replay ran several
	// (Config.Rounds); the row's figures are its median round's.
	Rounds  *RoundFigures `json:"rounds,omitempty"`
	Storage string        `json:"storage,omitempty"` // Config.StorageLabel
	Skipped string        `json:"skipped,omitempty"` // why it did not run

	Requests            int     `json:"requests"`
	TTFTmsP50           float64 `json:"ttft_ms_p50"`
	TTFTmsP90           float64 `json:"ttft_ms_p90"`
	TTFTmsP99           float64 `json:"ttft_ms_p99"`
	MaxRateAtSLO        float64 `json:"max_rate_at_slo"`
	MaxRateIsLowerBound bool    `json:"max_rate_is_lower_bound,omitempty"` // the SLO held at every rate tried
	BytesPerS           float64 `json:"bytes_per_s"`
	CeilingFraction     float64 `json:"ceiling_fraction"`     // of Result.CeilingBytesPS (striped)
	CeilingSumFraction  float64 `json:"ceiling_sum_fraction"` // of Result.CeilingSumBytesPS
	CPUSPerGiB          float64 `json:"cpu_s_per_gib"`
	DeviceReadBytes     uint64  `json:"device_read_bytes"`
	DeviceBytesSource   string  `json:"device_bytes_source"`
	VerifyMismatches    int64   `json:"verify_mismatches"` // restored pages (host check) or 8-byte words (DeviceVerifier) that differ: anything but 0 fails
	HitBlocks           int64   `json:"hit_blocks"`
	RestoredBytes       int64   `json:"restored_bytes"`
	ReadBytes           int64   `json:"read_bytes"` // read from the backend's storage to restore them
	// ReadBytesPerDir is ReadBytes from each store root (Config.Dirs, in
	// their order; absent for a backend that reads no directory), and
	// ReadDirsMaxOverMean the largest of them over their mean (1 = even).
	ReadBytesPerDir        []int64 `json:"read_bytes_per_dir,omitempty"`
	ReadDirsMaxOverMean    float64 `json:"read_dirs_max_over_mean,omitempty"`
	IOsPerLayerRequestMean float64 `json:"ios_per_layer_request_mean"`
	RunsPerRequestMean     float64 `json:"runs_per_request_mean"`
	BlocksPerRequestMean   float64 `json:"blocks_per_request_mean"`
	IOsPerRequestMean      float64 `json:"ios_per_request_mean"`
	HitRatio               float64 `json:"hit_ratio"`
	GPUStallMsMean         float64 `json:"gpu_stall_ms_mean"`
	Fallbacks              int64   `json:"fallbacks"`
	SaveFallbacks          int64   `json:"save_fallbacks"`
	SavedBytes             int64   `json:"saved_bytes"`
	SaveCPUSPerGiB         float64 `json:"save_cpu_s_per_gib"`
	EvictedBlocks          int64   `json:"evicted_blocks"`
	DeviceWriteBytes       uint64  `json:"device_write_bytes"`
	DiskstatsReadBytes     uint64  `json:"diskstats_read_bytes"`
	DeviceReadLatencyP50Us float64 `json:"device_read_latency_p50_us,omitempty"`
	DeviceReadLatencyP99Us float64 `json:"device_read_latency_p99_us,omitempty"`
	DirectIO               bool    `json:"direct_io"`
	WallSeconds            float64 `json:"wall_s"`
	LoadSeconds            float64 `json:"load_s"`
	SaveSeconds            float64 `json:"save_s"`
	ComputeModel           string  `json:"compute"`
	// Phases: where the wall time went (the harness's own work beside the
	// measured restores and saves).
	Phases                  *Phases `json:"phases,omitempty"`
	RequestsWithHitsRestore int     `json:"requests_with_hits"`

	// Warm start (Config.Warm; absent when the window started cold): the
	// history's range and what this backend saved before the window,
	// untimed and in no other field.
	WarmMs              float64 `json:"warm_ms,omitempty"`
	WarmHistoryRequests int     `json:"warm_history_requests,omitempty"`
	WarmSavedBlocks     int64   `json:"warm_saved_blocks,omitempty"`
	WarmSavedBytes      int64   `json:"warm_saved_bytes,omitempty"`
	WarmSeconds         float64 `json:"warm_s,omitempty"`
	// WarmEvictedBlocks: what the shared index evicted during the warm-up
	// (a SelfIndexed backend evicts on its own: not counted, see WarmNote).
	WarmEvictedBlocks int64  `json:"warm_evicted_blocks,omitempty"`
	WarmFallbacks     int64  `json:"warm_fallbacks,omitempty"`
	WarmNote          string `json:"warm_note,omitempty"`
	// AtRates: the timeline at given request rates (RatesTTFT; replay's
	// --at-rates), each with every request's TTFT, for a check against a
	// real engine's runs at those rates (eval/vllm/harness_check.py).
	AtRates []RateTTFT `json:"at_rates,omitempty"`
	// Workload is the generated workload's own description (replay fills it
	// with --at-rates), so a check can tell it ran the same requests.
	Workload string `json:"workload,omitempty"`

	// Not in JSON: for the report and plots.
	TTFTms     []float64      `json:"-"`
	Curve      []RatePoint    `json:"-"`
	BandwidthT []float64      `json:"-"`
	Device     []DeviceSample `json:"-"` // measured device bandwidth during the run
	Bandwidth  []float64      `json:"-"`
	Services   []Service      `json:"-"`
}

// Result of a replay.
type Result struct {
	Model          string
	Geometry       string
	Oversize       int   // requests left out: their KV exceeds MaxKVBytes
	MaxKVBytes     int64 // the engine KV memory bound those were measured against
	CapacityNote   string
	Dirs           []string // the store roots every backend striped over
	Storage        string   // Config.StorageLabel
	Trace          trace.Summary
	CapacityBlocks int
	CapacityBytes  int64
	DistinctBlocks int64
	KVMemoryBytes  int64
	SLOms          float64
	SLOSource      string
	// CeilingBytesPS is the device ceiling every backend's ceiling_fraction
	// is over: devbench's over the store roots as one striped array (all
	// bytes over the slowest root's time); CeilingSumBytesPS the roots' own
	// ceilings measured at the same time, summed. With one root both are
	// the one measurement. 0: not measured (CeilingNote says why).
	CeilingBytesPS    float64
	CeilingSumBytesPS float64
	CeilingNote       string
	ComputeModel      string
	Backends          []BackendResult
	// Warm describes the warm start; nil when none was asked for.
	Warm *WarmSummary
	// Reuse is what the window can reuse under the capacity, before any
	// backend ran (AnalyzeWindow; WindowNotes says what it means).
	Reuse   WindowReuse
	Started time.Time
	Host    string
	// Workload is Config.Workload.
	Workload string
	// Disks names the disks under Dirs (for the summary's first line).
	Disks string
}

// WorkloadDocQA is Config.Workload of a generated docqa workload
// (eval/workload): a document's first question prefills it whole.
const WorkloadDocQA = "docqa"

// stage calls cfg.Stage if set.
func (cfg Config) stage(what string, done, total int) {
	if cfg.Stage != nil {
		cfg.Stage(what, done, total)
	}
}

// removalProgress is what removeTree reports for backend's store, or nil.
func (cfg Config) removalProgress(backend string) func(done, total int) {
	if cfg.Stage == nil {
		return nil
	}
	return func(done, total int) { cfg.Stage(backend+": removing its store (files)", done, total) }
}

// memAvailable is /proc/meminfo's MemAvailable in bytes (8 GiB if unknown).
func memAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemAvailable:" {
				if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					return kb << 10
				}
			}
		}
	}
	return 8 << 30
}

// freeBytes is the space available to unprivileged users on dir's file
// system (0 if unknown).
func freeBytes(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// Run replays cfg.Requests through every backend.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if len(cfg.Requests) == 0 {
		return nil, errors.New("replay: no requests")
	}
	g, err := cfg.Profile.Geometry()
	if err != nil {
		return nil, err
	}
	if cfg.QueueDepth <= 0 {
		cfg.QueueDepth = 64
	}
	roots := cfg.roots()
	if len(roots) == 0 {
		return nil, errors.New("replay: no store directory")
	}
	for _, d := range roots {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
	}
	rootLocks, err := lockRoots(roots) // storelock.go: held until Run returns
	if err != nil {
		return nil, err
	}
	defer unlockAll(rootLocks)
	// Requests whose KV does not fit the engine memory bound are left out,
	// for every backend alike.
	maxKV := cfg.MaxKVBytes
	if maxKV <= 0 {
		maxKV = min(int64(16<<30), memAvailable()/2)
	}
	kept, oversize, maxBlocks := fitKV(cfg.Requests, g, maxKV)
	if len(kept) == 0 {
		return nil, fmt.Errorf("replay: every request needs more than %d MiB of KV memory", maxKV>>20)
	}
	cfg.Requests = kept
	sum := trace.Summarize(cfg.Requests)
	capBlocks, capNote := capacity(cfg.CapacityBlocks, sum.DistinctBlocks, roots, g.ChunkBytes())
	host, _ := os.Hostname()
	res := &Result{
		Model: cfg.Profile.Name, Geometry: g.String(), Trace: sum,
		CapacityBlocks: capBlocks, CapacityBytes: int64(capBlocks) * g.ChunkBytes(), CapacityNote: capNote,
		Oversize: oversize, MaxKVBytes: maxKV, Dirs: roots, Storage: cfg.StorageLabel,
		DistinctBlocks: sum.DistinctBlocks, ComputeModel: cfg.Compute.Label,
		Started: time.Now().UTC(), Host: host, Workload: cfg.Workload, Disks: disksOf(roots),
	}
	// The warm-up's steps: the history cut to what the window looks up
	// (prefixes of the window's chains, so the KV memory below fits them).
	var warm []warmStep
	if cfg.Warm != nil {
		var ws WarmSummary
		warm, ws = planWarm(cfg.Warm, cfg.Requests, cfg.Profile.BlockTokens(), capBlocks, g.ChunkBytes())
		res.Warm = &ws
	}
	res.Reuse = AnalyzeWindow(cfg.Requests, warm, capBlocks)
	// One page pool for all backends, sized for the largest request.
	kv, err := NewKVMemory(g, max(1, maxBlocks)*g.ChunkPages)
	if err != nil {
		return nil, fmt.Errorf("replay: KV memory for a %d-block request: %w", maxBlocks, err)
	}
	defer kv.Free()
	res.KVMemoryBytes = kv.Bytes()

	// The SLO: by default twice the unloaded p90 TTFT of prefill from scratch.
	res.SLOms, res.SLOSource = cfg.SLOms, "given"
	if res.SLOms <= 0 {
		var ttft []float64
		for _, r := range cfg.Requests {
			ttft = append(ttft, float64(g.Layers)*float64(cfg.Compute.Layer(r.InputTokens, 0))/1e6)
		}
		res.SLOms = 2 * metrics.Percentile(ttft, 0.9)
		res.SLOSource = "2 × p90 TTFT of recompute without queueing"
	}

	if cfg.CeilingBytes >= 0 {
		measureCeiling(ctx, cfg, res, sum.DistinctBlocks*g.ChunkBytes())
	}

	// The backends that finished are swept at the settled SLO also when a
	// later one fails or the run is interrupted (their report is written).
	// With several rounds, every round runs every backend (interleaved, each
	// round's order rotated by one), and each backend's row is its median
	// round by rate at SLO, with every round's figures beside it (rounds.go).
	var rounds [][]BackendResult
	defer func() { settleRounds(cfg, res, rounds) }()
	n := len(cfg.Backends)
	for r := 0; r < max(1, cfg.Rounds); r++ {
		var round []BackendResult
		rounds = append(rounds, nil)
		for i := 0; i < n; i++ {
			b := cfg.Backends[(i+r)%n]
			if err := ctx.Err(); err != nil {
				return res, err
			}
			br, err := runBackend(ctx, cfg, res, g.Layers, kv, b, warm)
			if err != nil {
				return res, fmt.Errorf("replay: backend %s (round %d): %w", b.Name(), r+1, err)
			}
			round = append(round, br)
			rounds[r] = round
		}
	}
	return res, nil
}

// measureCeiling fills res's device ceiling (ceilingAcross over res.Dirs),
// or says why there is none, for a working set of workingBytes.
func measureCeiling(ctx context.Context, cfg Config, res *Result, workingBytes int64) {
	size := cfg.CeilingBytes
	if size == 0 {
		// Over a working set like the replay's (its distinct blocks,
		// spread over the roots as the backends spread them), at least
		// 256 MiB and at most 4 GiB per root: a small file reads faster
		// than the working set a backend restores from.
		size = min(max(workingBytes/int64(len(res.Dirs)), 256<<20), 4<<30)
	}
	t0 := time.Now()
	what := fmt.Sprintf("device ceiling: a %d MiB file per store dir, written and read", size>>20)
	cfg.stage(what, 0, 1)
	c, err := ceilingAcross(ctx, res.Dirs, size)
	cfg.stage(what, 1, 1)
	if err != nil {
		res.CeilingNote = "not measured: " + err.Error()
		return
	}
	res.CeilingBytesPS, res.CeilingSumBytesPS, res.CeilingNote = c.stripedBPS, c.sumBPS, c.note
	res.CeilingNote += fmt.Sprintf(" (%.1f s to write the files and measure, before the first backend)", time.Since(t0).Seconds())
}

// RecomputeSLOSource names the SLO RecomputeSLO derives.
const RecomputeSLOSource = "2 × p90 TTFT of recompute without queueing (the recompute backend's own prefills)"

// RecomputeSLO is 2 × the p90 of the unloaded TTFTs (layers × layer time)
// of the recompute backend's services.
func RecomputeSLO(recompute []Service) float64 {
	var ttft []float64
	for _, s := range recompute {
		ttft = append(ttft, float64(s.Layers)*float64(s.LayerCompute)/1e6)
	}
	return 2 * metrics.Percentile(ttft, 0.9)
}

// settleSLO fixes the SLO and sweeps every backend's rate curve once
// against it. Unless cfg gives one, a default SLO taken from the compute
// model is replaced by one from the recompute backend's own prefills (2 ×
// p90 of its unloaded TTFT, layers × measured layer time) when that backend
// ran: with prefill measured on the GPU the fitted model can be far from the
// prefills the timeline replays, and every backend would then miss a
// model-derived SLO at every rate.
func settleSLO(cfg Config, res *Result) {
	if cfg.SLOms <= 0 {
		for _, br := range res.Backends {
			if br.Backend == "recompute" && len(br.Services) > 0 {
				res.SLOms, res.SLOSource = RecomputeSLO(br.Services), RecomputeSLOSource
			}
		}
	}
	for i := range res.Backends {
		b := &res.Backends[i]
		b.Curve, b.MaxRateAtSLO = Sweep(b.Services, res.SLOms)
		b.MaxRateIsLowerBound = MaxRateTried(b.Curve, b.MaxRateAtSLO)
	}
}

// fitKV is reqs without those whose KV (geometry g) exceeds maxKV bytes,
// how many were left out, and the most blocks a kept one has.
func fitKV(reqs []trace.Request, g kvshape.Geometry, maxKV int64) (kept []trace.Request, oversize, maxBlocks int) {
	perBlockKV := int64(g.ChunkPages) * g.PageBytesPerLayer() * int64(g.Layers)
	kept = reqs[:0:0]
	for _, r := range reqs {
		if int64(len(r.HashIDs))*perBlockKV > maxKV {
			oversize++
			continue
		}
		kept = append(kept, r)
		maxBlocks = max(maxBlocks, len(r.HashIDs))
	}
	return kept, oversize, maxBlocks
}

// capacity is the backends' block capacity and where it comes from: the
// given one (at most every distinct block), or every distinct block where
// half of the roots' free space holds them, else that half.
func capacity(given int, distinct int64, roots []string, chunkBytes int64) (int, string) {
	capBlocks, capNote := given, "given"
	if capBlocks <= 0 || int64(capBlocks) > distinct {
		capBlocks, capNote = int(distinct), "every distinct block"
		if given <= 0 {
			if free, where := freeAcross(roots); free > 0 && int64(capBlocks)*chunkBytes > free/2 {
				capBlocks = int(free / 2 / chunkBytes)
				capNote = fmt.Sprintf("half of the %d MiB free in %s", free>>20, where)
			}
		}
	}
	return max(capBlocks, 1), capNote
}
