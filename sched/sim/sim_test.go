package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/tutti-io/tutti/internal/trace"
	"github.com/tutti-io/tutti/sched"
)

// Llama-3.1-8B on a datacenter-class GPU, BF16 KV (2 MiB per layer per
// 512-token block), one SSD-class device, with read/write interference of
// the kind sched/internal/rwbench measures (the profiles behind these inputs
// are in BENCHMARKS.md, "## sched").
func worldConfig(t testing.TB, seed uint64, policy Policy) Config {
	t.Helper()
	m, err := sched.ComputeFromFLOPs(sched.FLOPsProfile{
		LinearFLOPsPerToken: 2 * 218e6, AttnFLOPsPerPair: 4 * 32 * 128,
		GEMMFLOPsPerSec: 400e12, AttnFLOPsPerSec: 200e12, FixedNs: 20e3,
	})
	if err != nil {
		t.Fatal(err)
	}
	// The hardware is off from the profile by a seeded skew (±25% compute,
	// ±30% disk) that the planner must learn online.
	u := func(k uint64) float64 { return float64(mix(seed^k)>>11) / (1 << 53) }
	return Config{
		Seed: seed, Policy: policy,
		Layers: 32, BlockTokens: 512, BytesPerLayerPerBlock: 512 * 8 * 128 * 2 * 2,
		Compute: m,
		Device: sched.DeviceProfile{
			ReadBytesPerSec: 2e9, WriteBytesPerSec: 1.6e9, ReadIOPS: 250e3, WriteIOPS: 150e3,
			ReadLatencyNs: 100e3, ReadShareUnderWrites: measuredReadShare, WriteShareUnderReads: measuredWriteShare,
		},
		Devices:     4,
		ComputeSkew: 0.75 + 0.5*u(1), ReadSkew: 0.7 + 0.6*u(2), WriteSkew: 0.7 + 0.6*u(3),
		NoiseFrac:       0.1,
		CacheBlocks:     20000,
		SaveBoundNs:     20e9,
		PlannerDevice:   sched.DeviceConfig{MaxReadsInFlight: 4, MaxWritesInFlight: 1, MaxPendingSaveBytes: 64 << 30},
		MaxWriteIOBytes: 16 << 20,
	}
}

// Read and write bandwidth shares under the other direction, measured on the
// GPU machine's virtio disk with sched/internal/rwbench (devbench's io_uring
// O_DIRECT engine, 1 MiB and 4 MiB, two processes; medians of five runs, see
// BENCHMARKS.md "## sched").
const (
	measuredReadShare  = 0.67
	measuredWriteShare = 0.28
)

// traceFile finds the shared trace: $TUTTI_TRACE, else ../shared/traces next
// to the repository root (the module root's parent).
func traceFile(t testing.TB) string {
	if p := os.Getenv("TUTTI_TRACE"); p != "" {
		return p
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "..", "shared", "traces", "conversation_trace.jsonl")
		}
		up := filepath.Dir(dir)
		if up == dir {
			return ""
		}
		dir = up
	}
}

// window reads n requests of path starting at request `from`, rebased to
// start at 0, spread within the trace's 3 s buckets and time-scaled, and the
// requests before it as history (at most `warm`).
func window(t testing.TB, path string, from, n, warm int, scale float64) (history, reqs []Request) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	all, _, err := trace.ReadAll(f, trace.Options{}, trace.Window{First: from + n})
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	if len(all) < from+n {
		t.Fatalf("%s: %d requests, want %d", path, len(all), from+n)
	}
	conv := func(rs []trace.Request) []Request {
		out := make([]Request, len(rs))
		for i, r := range rs {
			out[i] = Request{ArrivalNs: int64(r.ArrivalMs * 1e6), InputTokens: r.InputTokens, BlockIDs: r.HashIDs}
		}
		return out
	}
	history = conv(all[max(0, from-warm):from])
	win := all[from:]
	trace.Rebase(win)
	trace.Spread(win, 3000)
	if err := trace.Scale(win, scale); err != nil {
		t.Fatal(err)
	}
	return history, conv(win)
}

type outcome struct {
	p50, p90, p99 int64
	res           Result
}

func runAll(t testing.TB, seed uint64, history, reqs []Request) map[Policy]outcome {
	t.Helper()
	out := map[Policy]outcome{}
	for _, p := range Policies {
		res, err := Run(worldConfig(t, seed, p), history, reqs)
		if err != nil {
			t.Fatalf("seed %d %v: %v", seed, p, err)
		}
		out[p] = outcome{Percentile(res.TTFTNs, 0.5), Percentile(res.TTFTNs, 0.9), Percentile(res.TTFTNs, 0.99), res}
	}
	return out
}

func describe(o map[Policy]outcome) string {
	s := ""
	for _, p := range Policies {
		r := o[p].res
		s += fmt.Sprintf("\n  %-13s p50 %7.0f ms  p90 %7.0f ms  p99 %7.0f ms  loaded %5d/%5d blocks  read %6.1f GB  written %6.1f GB  dropped %d  max save %5.1f s  gpu idle %6.1f s",
			p, ms(o[p].p50), ms(o[p].p90), ms(o[p].p99), r.LoadedBlocks, r.CachedBlocks, float64(r.ReadBytes)/1e9,
			float64(r.WriteBytes)/1e9, r.DroppedBlocks, float64(r.MaxSaveNs)/1e9, float64(r.GPUIdleNs)/1e9)
	}
	return s
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

// worse reports a > b beyond a tie: differences under 0.1% of b are ties.
// They come from chance phase alone: which save write happens to be in flight
// when a burst of arrivals starts (every policy writes into idle device time),
// delaying its first read by a fraction of one write, and the burst behind it
// inherits the offset. Seen: 1.1 ms on a 22 s p99.
func worse(a, b int64) bool { return a > b+b/1000 }

// compare asserts the scheduler's TTFT p99 is no worse than every baseline's
// (and so better wherever they differ), its p90 too, and that no save
// outlived the planner's bound.
func compare(t *testing.T, what string, seed uint64, o map[Policy]outcome) {
	t.Helper()
	for _, p := range Policies[1:] {
		if worse(o[PolicyScheduler].p99, o[p].p99) {
			t.Errorf("%s seed %d: scheduler p99 %.0f ms > %v p99 %.0f ms%s", what, seed, ms(o[PolicyScheduler].p99), p, ms(o[p].p99), describe(o))
		}
		if worse(o[PolicyScheduler].p90, o[p].p90) {
			t.Errorf("%s seed %d: scheduler p90 %.0f ms > %v p90 %.0f ms%s", what, seed, ms(o[PolicyScheduler].p90), p, ms(o[p].p90), describe(o))
		}
	}
	if o[PolicyScheduler].res.SaveBoundMisses > 0 {
		t.Errorf("%s seed %d: %d saves missed the bound%s", what, seed, o[PolicyScheduler].res.SaveBoundMisses, describe(o))
	}
}

// tally counts, per baseline, the runs where the scheduler's tail (p90 or
// p99) was strictly better, so a suite where every run ties fails instead of
// passing vacuously. (The p99 of a window is often one long prompt with
// nothing cached, computed alike by every policy: a tie.)
type tally map[Policy]int

func (w tally) add(o map[Policy]outcome) {
	s := o[PolicyScheduler]
	for _, p := range Policies[1:] {
		if worse(o[p].p99, s.p99) || (!worse(s.p99, o[p].p99) && worse(o[p].p90, s.p90)) {
			w[p]++
		}
	}
}

func (w tally) check(t *testing.T) {
	t.Helper()
	for _, p := range Policies[1:] {
		if w[p] == 0 {
			t.Errorf("scheduler's tail never strictly better than %v's", p)
		}
	}
}

// Replay shape: windows of winN requests after warmN requests of history,
// arrivals stretched winScale times (the trace's rate saturates one GPU with
// this model several times over).
var (
	winN, warmN = 300, 2000
	winScale    = 5.0
)

func init() {
	if v := os.Getenv("SIM_N"); v != "" {
		fmt.Sscan(v, &winN)
	}
	if v := os.Getenv("SIM_WARM"); v != "" {
		fmt.Sscan(v, &warmN)
	}
	if v := os.Getenv("SIM_SCALE"); v != "" {
		fmt.Sscan(v, &winScale)
	}
}

// TestTraceWindows replays windows of the shared Mooncake conversation trace.
func TestTraceWindows(t *testing.T) {
	path := traceFile(t)
	if _, err := os.Stat(path); err != nil {
		t.Skipf("shared trace not found at %s (set TUTTI_TRACE, or keep ../shared/traces next to the repository): %v", path, err)
	}
	wins := tally{}
	for _, from := range []int{2000, 5000, 9000} {
		history, reqs := window(t, path, from, winN, warmN, winScale)
		for seed := uint64(1); seed <= 3; seed++ {
			o := runAll(t, seed, history, reqs)
			t.Logf("window %d+300 seed %d:%s", from, seed, describe(o))
			compare(t, fmt.Sprintf("window %d+300", from), seed, o)
			wins.add(o)
		}
	}
	wins.check(t)
}

// TestCommittedWindow replays the window kept in testdata (requests
// 8500..9299, the first 500 as history of the conversation trace), so CI always runs a replay.
func TestCommittedWindow(t *testing.T) {
	history, reqs := window(t, filepath.Join("testdata", "conversation_8500_800.jsonl"), 500, 300, 500, winScale)
	wins := tally{}
	for seed := uint64(1); seed <= 4; seed++ {
		o := runAll(t, seed, history, reqs)
		t.Logf("seed %d:%s", seed, describe(o))
		compare(t, "testdata window", seed, o)
		wins.add(o)
	}
	wins.check(t)
}

// TestQueueUnknownWindow: the planner as the runtime drives it (no
// compute-ready time, so the whole recompute is charged) on the committed
// window. Without the queue it cannot do what the queue-known planner does
// (TestCommittedWindow); what it must do is stay with loading everything,
// the rule it replaces for an engine that cannot tell: p50, p90 and p99
// within 5% of load-all's (what it measured: BENCHMARKS.md "## sched"), and
// a tail well under recompute-all's.
func TestQueueUnknownWindow(t *testing.T) {
	history, reqs := window(t, filepath.Join("testdata", "conversation_8500_800.jsonl"), 500, 300, 500, winScale)
	for seed := uint64(1); seed <= 4; seed++ {
		o := runAll(t, seed, history, reqs)
		cfg := worldConfig(t, seed, PolicyScheduler)
		cfg.QueueUnknown = true
		res, err := Run(cfg, history, reqs)
		if err != nil {
			t.Fatal(err)
		}
		u := outcome{Percentile(res.TTFTNs, 0.5), Percentile(res.TTFTNs, 0.9), Percentile(res.TTFTNs, 0.99), res}
		o[PolicyScheduler] = u
		t.Logf("seed %d, the scheduler with the queue unknown:%s", seed, describe(o))
		la, ra := o[PolicyLoadAll], o[PolicyRecomputeAll]
		for _, c := range []struct {
			name      string
			got, want int64
		}{{"p50", u.p50, la.p50}, {"p90", u.p90, la.p90}, {"p99", u.p99, la.p99}} {
			if float64(c.got) > 1.05*float64(c.want) {
				t.Errorf("seed %d: %s %.0f ms, load-all's %.0f ms%s", seed, c.name, ms(c.got), ms(c.want), describe(o))
			}
		}
		if u.p99 >= ra.p99 {
			t.Errorf("seed %d: p99 %.0f ms, recompute-all's %.0f ms%s", seed, ms(u.p99), ms(ra.p99), describe(o))
		}
		if u.res.LoadedBlocks >= u.res.CachedBlocks {
			t.Errorf("seed %d: loaded every cached block: the case does not test the split", seed)
		}
	}
}

// Equal inputs give equal outputs.
func TestDeterministic(t *testing.T) {
	history, reqs := window(t, filepath.Join("testdata", "conversation_8500_800.jsonl"), 500, 100, 500, winScale)
	for _, p := range Policies {
		a, err := Run(worldConfig(t, 9, p), history, reqs)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Run(worldConfig(t, 9, p), history, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("%v: two runs differ", p)
		}
	}
}

// With a tight save bound and hardware exactly as profiled, saves are
// promoted in time: none completes past its bound, and some were deferred.
func TestSaveBound(t *testing.T) {
	history, reqs := window(t, filepath.Join("testdata", "conversation_8500_800.jsonl"), 500, 300, 500, winScale)
	for seed := uint64(1); seed <= 3; seed++ {
		cfg := worldConfig(t, seed, PolicyScheduler)
		cfg.ComputeSkew, cfg.ReadSkew, cfg.WriteSkew, cfg.NoiseFrac, cfg.ComputeNoiseFrac = 1, 1, 1, 0, 0
		cfg.Devices = int(seed) // 1..3 devices
		cfg.SaveBoundNs = 4e9
		res, err := Run(cfg, history, reqs)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("seed %d: max save %.2f s of %.2f s bound, %d writes promoted of %d, %d blocks saved, %d not admitted",
			seed, float64(res.MaxSaveNs)/1e9, float64(cfg.SaveBoundNs)/1e9, res.Planner.WritesPromoted, res.Planner.WritesDispatched,
			res.SavedBlocks, res.DroppedBlocks)
		if res.SaveBoundMisses > 0 || res.MaxSaveNs > cfg.SaveBoundNs {
			t.Errorf("seed %d: %d saves past the %d ns bound (max %d ns)", seed, res.SaveBoundMisses, cfg.SaveBoundNs, res.MaxSaveNs)
		}
		if res.SavedBlocks == 0 {
			t.Errorf("seed %d: nothing saved", seed)
		}
	}
}

// TestCalibration is an ablation: on hardware 40% off its profiles (GPU
// slower, disk faster), the scheduler that observes layer times and
// completions beats the same scheduler planning with the profiles as given.
func TestCalibration(t *testing.T) {
	history, reqs := window(t, filepath.Join("testdata", "conversation_8500_800.jsonl"), 500, 300, 500, winScale)
	for seed := uint64(1); seed <= 2; seed++ {
		var p50, p90 [2]int64
		for i, off := range []bool{false, true} {
			cfg := worldConfig(t, seed, PolicyScheduler)
			cfg.ComputeSkew, cfg.ReadSkew, cfg.WriteSkew = 1.4, 1.4, 1.4
			cfg.NoCalibration = off
			res, err := Run(cfg, history, reqs)
			if err != nil {
				t.Fatal(err)
			}
			p50[i], p90[i] = Percentile(res.TTFTNs, 0.5), Percentile(res.TTFTNs, 0.9)
			t.Logf("seed %d calibration off=%v: p50 %.0f ms p90 %.0f ms p99 %.0f ms, loaded %d of %d blocks, compute scale learned %.2f",
				seed, off, ms(p50[i]), ms(p90[i]), ms(Percentile(res.TTFTNs, 0.99)), res.LoadedBlocks, res.CachedBlocks, res.ComputeScale)
		}
		if worse(p50[0], p50[1]) || worse(p90[0], p90[1]) {
			t.Errorf("seed %d: calibrated p50/p90 %.0f/%.0f ms worse than uncalibrated %.0f/%.0f ms", seed, ms(p50[0]), ms(p90[0]), ms(p50[1]), ms(p90[1]))
		}
	}
}
