package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/crashtest"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

func init() {
	register("serve-bench", "engine processes saving and loading overlapping prefixes through a tutti serve socket, every byte verified", runServeBench)
}

// Limits of serve-bench.
const (
	serveBenchMaxEngines = 64
	serveBenchMaxBlocks  = 1 << 12
)

// engineResult is one engine process's line (and the total's).
type engineResult struct {
	Engine        int     `json:"engine"` // -1: the total
	Seconds       float64 `json:"seconds"`
	Loads         int64   `json:"loads"`
	LoadedBlocks  int64   `json:"loaded_blocks"`
	LoadedBytes   int64   `json:"loaded_bytes"`
	Saves         int64   `json:"saves"`
	SavedBlocks   int64   `json:"saved_blocks"`
	SavedBytes    int64   `json:"saved_bytes"`
	SkippedBlocks int64   `json:"skipped_blocks"` // saves not admitted (no space, budget, cached by another engine meanwhile)
	VerifiedBytes int64   `json:"verified_bytes"` // restored bytes compared with the block's own content
	Mismatches    int64   `json:"mismatches"`     // pages restored with wrong bytes (per layer and plane on the CPU path): must be 0
	Errors        int64   `json:"errors"`         // calls that failed
	LoadGBps      float64 `json:"load_gb_per_s"`  // restored bytes / seconds
	SaveGBps      float64 `json:"save_gb_per_s"`  // committed bytes / seconds
	// LoadBusyS is the time spent in loads (Load to Wait; the total's: the
	// longest engine's); RestoreGBps is restored bytes over it: an engine's
	// restore rate, whatever else it does.
	LoadBusyS   float64 `json:"load_busy_s"`
	RestoreGBps float64 `json:"restore_gb_per_s"`
	LastError   string  `json:"last_error,omitempty"`
}

type serveBenchFlags struct {
	socket                         string
	engines, child                 int
	duration                       time.Duration
	modelName, geometry            string
	prefixes, minBlocks, maxBlocks int
	seed                           uint64
	path                           string
	gpuDevice, gpus                int
	populate, loadOnly             bool
}

func runServeBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve-bench", stderr)
	var f serveBenchFlags
	fs.StringVar(&f.socket, "socket", "", "the socket of a running tutti serve")
	fs.IntVar(&f.engines, "engines", 4, "engine processes")
	fs.DurationVar(&f.duration, "duration", 30*time.Second, "how long each engine runs")
	fs.StringVar(&f.modelName, "model", "tiny", "model profile: the service's (--model of tutti serve)")
	fs.StringVar(&f.geometry, "geometry", "", "the KV shape instead of --model's (tutti serve --geometry)")
	fs.IntVar(&f.prefixes, "prefixes", 32, "distinct prefixes the engines share (requests pick one and a length)")
	fs.IntVar(&f.minBlocks, "min-blocks", 1, "shortest request in chain blocks")
	fs.IntVar(&f.maxBlocks, "max-blocks", 16, "longest request in chain blocks")
	fs.IntVar(&f.gpuDevice, "gpu-device", 0, "--path gpu: the first engine's CUDA device")
	fs.IntVar(&f.gpus, "gpus", 1, "--path gpu: engine i uses device gpu-device + i mod gpus")
	fs.BoolVar(&f.populate, "populate", false, "first save every prefix at --max-blocks (one engine), then run the engines")
	fs.BoolVar(&f.loadOnly, "load-only", false, "the engines only load (with --populate: restore rates of engines sharing the devices)")
	fs.Uint64Var(&f.seed, "seed", 1, "request seed (engine i uses seed+i)")
	fs.StringVar(&f.path, "path", "cpu", "the engines' data path: cpu (host memory) or gpu (HBM; GPU machine)")
	fs.IntVar(&f.child, "engine-child", -1, "internal: run as engine N and print its result line")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case f.socket == "":
		return usageErr(fs.Usage, errors.New("--socket: required"))
	case f.engines < 1 || f.engines > serveBenchMaxEngines:
		return usageErr(fs.Usage, fmt.Errorf("--engines %d: want 1..%d", f.engines, serveBenchMaxEngines))
	case f.prefixes < 1 || f.minBlocks < 1 || f.maxBlocks < f.minBlocks || f.maxBlocks > serveBenchMaxBlocks:
		return usageErr(fs.Usage, fmt.Errorf("--prefixes %d, --min-blocks %d, --max-blocks %d: want >= 1 and 1 <= min <= max <= %d",
			f.prefixes, f.minBlocks, f.maxBlocks, serveBenchMaxBlocks))
	case f.gpus < 1 || f.gpuDevice < 0:
		return usageErr(fs.Usage, fmt.Errorf("--gpus %d, --gpu-device %d: want >= 1 and >= 0", f.gpus, f.gpuDevice))
	case f.duration <= 0:
		return usageErr(fs.Usage, fmt.Errorf("--duration %v: want > 0", f.duration))
	case f.path != "cpu" && f.path != "gpu":
		return usageErr(fs.Usage, fmt.Errorf("--path %q: want cpu or gpu", f.path))
	}
	if f.child >= 0 {
		r := benchEngine(f)
		return json.NewEncoder(stdout).Encode(r)
	}
	if f.populate {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		r, err := benchChild(exe, append(append([]string{"serve-bench"}, args...), "--engine-child=0"))
		if err == nil && (r.Errors > 0 || r.Mismatches > 0 || r.Saves == 0) {
			err = fmt.Errorf("%d saves, %d errors (last: %s)", r.Saves, r.Errors, r.LastError)
		}
		if err != nil {
			return fmt.Errorf("populating: %w", err)
		}
		args = append(args, "--populate=false")
		f.populate = false
	}
	return benchEngines(f, args, stdout)
}

// benchEngines runs the engine processes at once and reports each line and
// their total; any mismatch fails the command.
func benchEngines(f serveBenchFlags, args []string, stdout io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	results := make([]engineResult, f.engines)
	errs := make([]error, f.engines)
	var wg sync.WaitGroup
	for i := range f.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = benchChild(exe, append(append([]string{"serve-bench"}, args...), fmt.Sprintf("--engine-child=%d", i)))
		}()
	}
	wg.Wait()
	out := json.NewEncoder(stdout)
	total := engineResult{Engine: -1}
	for i, r := range results {
		if errs[i] != nil {
			return fmt.Errorf("engine %d: %w", i, errs[i])
		}
		if err := out.Encode(r); err != nil {
			return err
		}
		total.Seconds = max(total.Seconds, r.Seconds)
		total.Loads += r.Loads
		total.LoadedBlocks += r.LoadedBlocks
		total.LoadedBytes += r.LoadedBytes
		total.Saves += r.Saves
		total.SavedBlocks += r.SavedBlocks
		total.SavedBytes += r.SavedBytes
		total.SkippedBlocks += r.SkippedBlocks
		total.VerifiedBytes += r.VerifiedBytes
		total.Mismatches += r.Mismatches
		total.Errors += r.Errors
		total.LoadBusyS = max(total.LoadBusyS, r.LoadBusyS)
	}
	total.LoadGBps, total.SaveGBps = gbps(total.LoadedBytes, total.Seconds), gbps(total.SavedBytes, total.Seconds)
	total.RestoreGBps = gbps(total.LoadedBytes, total.LoadBusyS)
	if err := out.Encode(total); err != nil {
		return err
	}
	if f.loadOnly && total.LoadedBlocks == 0 {
		return errors.New("--load-only: nothing was loaded (no --populate, or another store's socket?)")
	}
	if total.Mismatches > 0 || total.Errors > 0 {
		return exitError{1} // every line is out: they say which engine failed and why
	}
	return nil
}

// benchChild runs one engine process and parses its result line.
func benchChild(exe string, args []string) (engineResult, error) {
	cmd := exec.Command(exe, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.Env = os.Environ()
	outp, err := cmd.Output()
	if err != nil {
		return engineResult{}, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var r engineResult
	sc := bufio.NewScanner(strings.NewReader(string(outp)))
	for sc.Scan() {
		if err := json.Unmarshal(sc.Bytes(), &r); err == nil {
			return r, nil
		}
	}
	return engineResult{}, fmt.Errorf("no result line in %q", outp)
}

func gbps(bytes int64, s float64) float64 {
	if s <= 0 {
		return 0
	}
	return float64(bytes) / s / 1e9
}

// benchEngine is one engine: until the duration ran out, it picks a shared
// prefix and a length, loads what the service has of it into its own
// memory (verifying every restored page) and saves the rest. With
// --populate it saves every prefix at --max-blocks once and ends; with
// --load-only it never saves.
func benchEngine(f serveBenchFlags) engineResult {
	r := engineResult{Engine: f.child}
	fail := func(err error) {
		r.Errors++
		r.LastError = err.Error()
	}
	prof, err := model.Lookup(f.modelName)
	if err != nil {
		fail(err)
		return r
	}
	g := prof.Shape
	if f.geometry != "" {
		if g, err = parseGeometry(f.geometry); err != nil {
			fail(err)
			return r
		}
	}
	cfg := runtime.Config{Geometry: g, Layout: kvshape.LayoutPerLayer, NumPages: f.maxBlocks * g.ChunkPages, Path: runtime.PathCPU}
	device := f.gpuDevice + f.child%f.gpus
	if f.path == "gpu" {
		cfg.Path, cfg.GPU.Device, cfg.GPU.MaxPages = runtime.PathGPU, device, cfg.NumPages
	}
	s, err := runtime.Connect(f.socket, cfg)
	if err != nil {
		fail(err)
		return r
	}
	defer s.Close()
	kv, err := newServeBenchKV(g, cfg.NumPages, f.path == "gpu", device)
	if err != nil {
		fail(err)
		return r
	}
	defer kv.Free()
	if err := s.RegisterKV(kv.Memory()); err != nil {
		fail(err)
		return r
	}
	pages := make([]int32, cfg.NumPages)
	for i := range pages {
		pages[i] = int32(i)
	}
	rng := rand.New(rand.NewPCG(f.seed+uint64(f.child), 7))
	start := time.Now()
	for req := 0; ; req++ {
		p, n := rng.IntN(f.prefixes), f.minBlocks+rng.IntN(f.maxBlocks-f.minBlocks+1)
		if f.populate {
			if req == f.prefixes {
				break
			}
			p, n = req, f.maxBlocks
		} else if time.Since(start) >= f.duration {
			break
		}
		chain := crashtest.Chain(uint64(p+1)<<32, n)
		pg := pages[:n*g.ChunkPages]
		hit := 0
		if !f.populate {
			hit = s.Lookup(chain)
		}
		if hit > 0 {
			benchLoad(s, kv, g, chain[:hit], pg[:hit*g.ChunkPages], &r, fail)
		}
		if hit < n && (f.populate || !f.loadOnly) {
			benchSave(s, kv, g, chain, pg, &r, fail)
		}
	}
	if err := s.WaitSaves(); err != nil {
		fail(err)
	}
	r.Seconds = time.Since(start).Seconds()
	r.LoadGBps, r.SaveGBps = gbps(r.LoadedBytes, r.Seconds), gbps(r.SavedBytes, r.Seconds)
	r.RestoreGBps = gbps(r.LoadedBytes, r.LoadBusyS)
	return r
}

func benchSave(s *runtime.Store, kv *benchKV, g kvshape.Geometry, chain []uint64, pg []int32, r *engineResult, fail func(error)) {
	if err := kv.fill(chain, pg); err != nil {
		fail(err)
		return
	}
	sv, err := s.Save(chain, pg)
	if err != nil {
		fail(err)
		return
	}
	sv.Wait()
	r.Saves++
	r.SavedBlocks += int64(sv.Saved())
	r.SavedBytes += int64(sv.Saved()) * g.ChunkBytes()
	r.SkippedBlocks += int64(len(chain) - sv.Saved() - sv.Skipped(runtime.SkipCached))
}

func benchLoad(s *runtime.Store, kv *benchKV, g kvshape.Geometry, chain []uint64, pg []int32, r *engineResult, fail func(error)) {
	t0 := time.Now()
	l, err := s.Load(chain, pg)
	if err != nil {
		fail(err)
		return
	}
	if err := l.Wait(); err != nil {
		fail(err)
	}
	r.LoadBusyS += time.Since(t0).Seconds()
	got := l.Blocks()
	r.Loads++
	r.LoadedBlocks += int64(got)
	r.LoadedBytes += int64(got) * g.ChunkBytes()
	bad, verified, err := kv.verify(chain[:got], pg[:got*g.ChunkPages])
	r.VerifiedBytes += verified
	r.Mismatches += bad
	if err != nil {
		fail(err)
	} else if bad > 0 {
		fail(fmt.Errorf("%d pages of the %d blocks restored from %#x hold wrong bytes", bad, got, chain[0]))
	}
}
