// Package sim is a deterministic discrete-event simulator that replays a
// request trace (Mooncake format: arrival, input tokens, chained block ids)
// against one GPU compute queue and shared storage devices, under a policy
// for restoring cached prefixes and saving new ones:
//
//   - PolicyScheduler: the sched.Planner (load-vs-recompute split, reads by
//     least slack, saves deferred into slack within a bound), driven through
//     the same calls the runtime makes (PlanLoad, EnqueueSave, Dispatch,
//     Complete, NextWakeNs, Observe*);
//   - PolicyFIFO: load the whole cached prefix; every I/O, reads and save
//     writes alike, leaves one device queue in submission order;
//   - PolicyLoadAll: load the whole cached prefix; reads before writes;
//   - PolicyRecomputeAll: never read; recompute every prefix.
//
// The model of the world, the same for every policy:
//
//   - GPU: one prefill at a time in arrival order, layer by layer; layer l
//     starts when layer l−1 finished and layer l's reads completed (the GPU
//     idles meanwhile). A layer's true time is the compute profile × a skew ×
//     seeded per-(request, layer) noise.
//   - Devices: each has a read lane and a write lane serving one op at a time
//     (ops overlap at queue depth, so busy times add up: an op costs
//     max(bytes/bandwidth, 1/IOPS) of lane time). While both lanes are busy,
//     reads progress at ReadShareUnderWrites and writes at WriteShareUnderReads
//     of their rates (fluid model: progress is re-timed when the other lane
//     starts or stops). A completion is seen ReadLatencyNs after service ends.
//     Bandwidths are the profile's × a skew, each op × seeded noise.
//   - Cache: an LRU over block ids. A request's cached prefix is its leading
//     resident blocks (at least one token is always computed). When its
//     prefill ends, its blocks not in the cache are saved as one run on the
//     next device (round robin) and become resident when all the run's writes
//     completed; evicted blocks stop being resident.
//
// Noise is drawn from a hash of (seed, what, request, layer, ...), not from a
// shared stream, so two policies see the same timelines for the same work.
// No goroutines, no wall clock: equal inputs give equal outputs.
package sim

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/tutti-io/tutti/sched"
)

// Request is one trace request.
type Request struct {
	ArrivalNs   int64
	InputTokens int
	BlockIDs    []uint64 // chained block ids, one per BlockTokens input tokens
}

// Policy selects how prefixes are restored and saves issued.
type Policy uint8

const (
	PolicyScheduler Policy = iota + 1
	PolicyFIFO
	PolicyLoadAll
	PolicyRecomputeAll
)

// Policies lists all policies, scheduler first.
var Policies = []Policy{PolicyScheduler, PolicyFIFO, PolicyLoadAll, PolicyRecomputeAll}

func (p Policy) String() string {
	switch p {
	case PolicyScheduler:
		return "scheduler"
	case PolicyFIFO:
		return "fifo"
	case PolicyLoadAll:
		return "load-all"
	case PolicyRecomputeAll:
		return "recompute-all"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// Config describes the simulated world and the policy.
type Config struct {
	Seed   uint64
	Policy Policy

	Layers, BlockTokens   int
	BytesPerLayerPerBlock int64

	// The profiles the planner is seeded with; the simulated hardware is
	// these times the skews below.
	Compute sched.ComputeModel
	Device  sched.DeviceProfile
	Devices int

	ComputeSkew      float64 // true layer time ÷ profile (0 = 1)
	ReadSkew         float64 // true read bandwidth ÷ profile (0 = 1)
	WriteSkew        float64 // true write bandwidth ÷ profile (0 = 1)
	NoiseFrac        float64 // each I/O op's time × uniform [1−n, 1+n]
	ComputeNoiseFrac float64 // each layer's time × uniform [1−n, 1+n]

	CacheBlocks int   // LRU capacity in blocks (> 0)
	SaveBoundNs int64 // planner's save bound (scheduler policy; 0 = planner default)

	// Planner limits per device (scheduler policy); zero = planner defaults.
	PlannerDevice sched.DeviceConfig
	// MaxWriteIOBytes cuts save writes, for every policy (0 = 4 MiB).
	MaxWriteIOBytes int64
	// QueueUnknown plans as the runtime does (scheduler policy): no
	// compute-ready time, sched.LoadRequest.QueueUnknown set.
	QueueUnknown bool
	// NoCalibration withholds observations from the planner (an ablation: the
	// scheduler then plans with the profiles as given, skews and all).
	NoCalibration bool
	// FreeWrites makes every save write take no device time (an ablation:
	// what restores would see if saves cost the devices nothing).
	FreeWrites bool
}

// Result is what a run measured.
type Result struct {
	TTFTNs []int64 // per request, in input order: prefill end − arrival

	CachedBlocks, LoadedBlocks int64 // prefix blocks found resident / loaded
	ReadBytes, WriteBytes      int64
	SavedBlocks, DroppedBlocks int64                  // admitted to saves / not admitted (scheduler)
	CutBlocks                  map[sched.Reason]int64 // DroppedBlocks by the planner's reason
	MaxSaveNs                  int64                  // longest enqueue → last write seen complete
	SaveBoundMisses            int                    // saves that took longer than the planner's bound
	GPUIdleNs                  int64                  // GPU waiting for reads while a request was on it
	Planner                    sched.Stats
	ComputeScale               float64 // the planner's learned compute correction at the end
}

// Percentile returns the q-quantile (0..1) of v by nearest rank.
func Percentile(v []int64, q float64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(len(s)-1, i))]
}

// ErrConfig reports an unusable Config.
var ErrConfig = errors.New("sim: bad config")

const (
	maxEvents = 1 << 24 // bounds a run: a window of the trace needs far fewer
)

func (c *Config) defaults() error {
	if c.Layers <= 0 || c.BlockTokens <= 0 || c.BytesPerLayerPerBlock <= 0 || c.Devices <= 0 || c.CacheBlocks <= 0 {
		return fmt.Errorf("%+v: %w", *c, ErrConfig)
	}
	for _, f := range []*float64{&c.ComputeSkew, &c.ReadSkew, &c.WriteSkew} {
		if *f == 0 {
			*f = 1
		}
		if !(*f > 0) {
			return fmt.Errorf("skew %v: %w", *f, ErrConfig)
		}
	}
	if !(c.NoiseFrac >= 0 && c.NoiseFrac < 1) || !(c.ComputeNoiseFrac >= 0 && c.ComputeNoiseFrac < 1) {
		return fmt.Errorf("noise %v, %v: %w", c.NoiseFrac, c.ComputeNoiseFrac, ErrConfig)
	}
	if c.MaxWriteIOBytes == 0 {
		c.MaxWriteIOBytes = 4 << 20
	}
	if err := c.Device.Validate(); err != nil {
		return err
	}
	switch c.Policy {
	case PolicyScheduler, PolicyFIFO, PolicyLoadAll, PolicyRecomputeAll:
	default:
		return fmt.Errorf("policy %v: %w", c.Policy, ErrConfig)
	}
	return nil
}

// splitmix64 finalizer: noise from a hash, independent of event order.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (s *state) noiseFrac(frac float64, parts ...uint64) float64 {
	h := mix(s.cfg.Seed)
	for _, p := range parts {
		h = mix(h ^ p)
	}
	u := float64(h>>11) / (1 << 53)
	return 1 + frac*(2*u-1)
}

// Run replays reqs (arrival times non-decreasing) under cfg. The blocks of
// history (requests before the window) start resident, in history order as
// if each had saved its new blocks as one run, so the window starts with the
// warm cache a long-running store has, not an empty one.
func Run(cfg Config, history, reqs []Request) (Result, error) {
	if err := cfg.defaults(); err != nil {
		return Result{}, err
	}
	for i := 1; i < len(reqs); i++ {
		if reqs[i].ArrivalNs < reqs[i-1].ArrivalNs {
			return Result{}, fmt.Errorf("request %d arrives before request %d: %w", i, i-1, ErrConfig)
		}
	}
	s := &state{cfg: cfg, reqs: make([]reqState, len(reqs)), cache: newLRU(cfg.CacheBlocks)}
	s.devs = make([]device, cfg.Devices)
	for i := range s.devs {
		s.devs[i].lanes[0].cur, s.devs[i].lanes[1].cur = -1, -1
	}
	s.gpuCur, s.gpuWaiting = -1, -1
	if cfg.Policy == PolicyScheduler {
		pc := sched.Config{Layers: cfg.Layers, BlockTokens: cfg.BlockTokens, Compute: cfg.Compute,
			SaveBoundNs: cfg.SaveBoundNs, MaxWriteIOBytes: cfg.MaxWriteIOBytes}
		for i := 0; i < cfg.Devices; i++ {
			dc := cfg.PlannerDevice
			dc.Profile = cfg.Device
			pc.Devices = append(pc.Devices, dc)
		}
		p, err := sched.NewPlanner(pc)
		if err != nil {
			return Result{}, err
		}
		s.planner = p
		s.saveBoundNs = p.Config().SaveBoundNs
	}
	for _, h := range history {
		var ids []uint64
		for _, id := range h.BlockIDs {
			if !s.cache.has(id) {
				ids = append(ids, id)
			} else {
				s.cache.touch(id)
			}
		}
		if len(ids) == 0 {
			continue
		}
		si := len(s.saves)
		for j, id := range ids {
			s.cache.insert(id, blockInfo{run: si, pos: j, dev: si % cfg.Devices})
		}
		s.saves = append(s.saves, save{run: si})
	}
	for i := range reqs {
		s.reqs[i].req = &reqs[i]
		s.push(reqs[i].ArrivalNs, evArrival, i, 0)
	}
	for s.events.Len() > 0 {
		if s.nEvents++; s.nEvents > maxEvents {
			return Result{}, fmt.Errorf("sim: more than %d events", maxEvents)
		}
		ev := s.events.pop()
		s.now = ev.t
		if err := s.handle(ev); err != nil {
			return Result{}, fmt.Errorf("sim at %d ns: %w", s.now, err)
		}
	}
	res := s.res
	res.TTFTNs = make([]int64, len(reqs))
	for i := range s.reqs {
		r := &s.reqs[i]
		if !r.done {
			return Result{}, fmt.Errorf("sim: request %d never finished", i)
		}
		res.TTFTNs[i] = r.finishNs - r.req.ArrivalNs
	}
	if s.planner != nil {
		res.Planner = s.planner.Stats()
		res.ComputeScale = s.planner.Compute().Scale()
	}
	return res, nil
}
