package main

import (
	"flag"
	"fmt"
	"io"
	"slices"

	"github.com/tutti-io/tutti/eval"
	"github.com/tutti-io/tutti/eval/harness"
	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/eval/workload"
	"github.com/tutti-io/tutti/internal/trace"
)

// workloadFlags are replay's flags for a generated workload (--workload).
type workloadFlags struct {
	name   *string
	docqa  workload.DocQA
	pick   *bool
	pickO  harness.PickOptions
	rounds *int
}

// The workloads --workload names: a generated docqa workload (the default
// without --trace), or the embedded window of the Mooncake conversation
// trace (a trace: what --warm-ms, --from-ms, --to-ms and --pick-window cut).
const (
	workloadDocQA        = "docqa"
	workloadConversation = "conversation"
)

var workloads = []string{workloadDocQA, workloadConversation}

func registerWorkloadFlags(fs *flag.FlagSet) *workloadFlags {
	w := &workloadFlags{docqa: workload.DefaultDocQA}
	d := &w.docqa
	w.name = fs.String("workload", "", "the requests: docqa (generated long-document QA in the shape of LEval/LooGLE: "+
		"long documents, several short questions after each whole document, Poisson arrivals; the --docqa-* flags), "+
		"or conversation (the embedded 200-request window of the Mooncake conversation trace; --requests defaults to its first 100) "+
		"(default: docqa, or the --trace file)")
	fs.IntVar(&d.Documents, "docqa-docs", d.Documents, "docqa: documents")
	fs.IntVar(&d.MinDocTokens, "docqa-min-doc-tokens", d.MinDocTokens, "docqa: shortest document (tokens; lengths are log-uniform)")
	fs.IntVar(&d.MaxDocTokens, "docqa-max-doc-tokens", d.MaxDocTokens, "docqa: longest document (tokens)")
	fs.IntVar(&d.QuestionsPerDoc, "docqa-questions", d.QuestionsPerDoc, "docqa: questions per document")
	fs.IntVar(&d.MinQuestionTokens, "docqa-min-question-tokens", d.MinQuestionTokens, "docqa: shortest question (tokens)")
	fs.IntVar(&d.MaxQuestionTokens, "docqa-max-question-tokens", d.MaxQuestionTokens, "docqa: longest question (tokens)")
	fs.Float64Var(&d.RatePerS, "docqa-rate", d.RatePerS, "docqa: Poisson arrival rate (requests per second)")
	fs.Uint64Var(&d.Seed, "docqa-seed", d.Seed, "docqa: seed (document lengths, question order and lengths, arrivals)")
	w.rounds = fs.Int("rounds", 1, "replay the window this many times through every backend, interleaved (each round's order rotated): each row is the backend's median round by rate at SLO, with every round's range beside it (1..20)")
	w.pick = fs.Bool("pick-window", false, "print the best windows of the trace for a replay (--from-ms, --requests) instead of replaying: "+
		"most hits from the --warm-ms history, then most hits under --capacity-blocks, within the --pick-* bounds; any trace")
	o := &w.pickO
	fs.IntVar(&o.MinRequests, "pick-min-requests", 5, "--pick-window: fewest requests in a window")
	fs.IntVar(&o.MaxRequests, "pick-max-requests", 15, "--pick-window: most requests in a window")
	fs.Float64Var(&o.MaxGPUSeconds, "pick-max-gpu-s", 0, "--pick-window: bound on one replay's prefill work in GPU seconds at --gpu-tflops (6 caching backends prefill their misses, recompute everything; 0 = none)")
	fs.IntVar(&o.Top, "pick-top", 5, "--pick-window: candidates printed")
	return w
}

// pickWindow prints the best windows of the trace (harness.PickWindows).
func (w *workloadFlags) pickWindow(stdout io.Writer, tracePath string, opts trace.Options, p model.Profile, warmMs, gpuFLOPs float64,
	capBlocks int, maxKV int64) error {
	parsed, err := parseTrace(tracePath, opts)
	if err != nil {
		return err
	}
	all, _, err := parsed.Select(trace.Window{})
	if err != nil {
		return err
	}
	o := w.pickO
	o.WarmMs, o.CapacityBlocks, o.MaxKVBytes, o.GPUFLOPs, o.CachingBackends = warmMs, capBlocks, maxKV, gpuFLOPs, 6
	if maxKV <= 0 {
		o.MaxKVBytes = 16 << 30
	}
	cands := harness.PickWindows(all, p, o)
	fmt.Fprintf(stdout, "%d windows of %d-%d requests, model %s, history %.0f ms; best first:\n", len(cands), o.MinRequests, o.MaxRequests, p.Name, warmMs)
	for _, c := range cands {
		u := c.Reuse
		fmt.Fprintf(stdout, "--from-ms %.0f --requests %d (line %d): %d block refs, %d distinct (%.1f GiB), hits %d (%d from the warm set of %d blocks; %d with no capacity limit), hit ratio %.2f, largest request %.1f GiB of KV, prefill %.1f GPU s\n",
			c.FromMs, c.Requests, c.Line, u.BlockRefs, u.Distinct, float64(c.DistinctBytes)/(1<<30), u.Hits, u.WarmHits, u.WarmBlocks, u.UnboundedHits,
			c.HitRatio, float64(c.MaxKVBytes)/(1<<30), c.GPUSeconds)
	}
	if len(cands) == 0 {
		return fmt.Errorf("no window fits the bounds")
	}
	return nil
}

// kind is the workload to replay: --workload, else the --trace file
// ("trace"), else docqa.
func (w *workloadFlags) kind(fs *flag.FlagSet, tracePath string) (string, error) {
	switch {
	case *w.name != "" && !slices.Contains(workloads, *w.name):
		return "", usageErr(fs.Usage, fmt.Errorf("--workload %q: want one of %v", *w.name, workloads))
	case *w.name != "" && tracePath != "":
		return "", usageErr(fs.Usage, fmt.Errorf("--workload and --trace: give one"))
	case *w.name != "":
		return *w.name, nil
	case tracePath != "":
		return "trace", nil
	}
	return workloadDocQA, nil
}

// flagSet reports whether the flag called name was given.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// replayRequests returns the replay's requests of workload kind,
// arrival times rebased to 0 (time scale not applied): docqa generated
// (its first win.First requests when --requests is given), else the trace
// window (the embedded one for conversation) with its warm-up history and
// the trace's arrival spread.
func replayRequests(fs *flag.FlagSet, w *workloadFlags, kind, tracePath string, opts trace.Options, win trace.Window, warmMs float64,
	blockTokens int, stderr io.Writer) ([]trace.Request, trace.Stats, *harness.Warm, string, error) {
	if *w.rounds < 1 || *w.rounds > 20 {
		return nil, trace.Stats{}, nil, "", usageErr(fs.Usage, fmt.Errorf("--rounds %d: want 1..20", *w.rounds))
	}
	if kind == workloadDocQA {
		return w.requests(fs, win, warmMs, blockTokens)
	}
	return traceRequests(tracePath, opts, win, warmMs, stderr)
}

// needsTrace is the error of a flag that cuts a trace, given with docqa.
func needsTrace(what string) error {
	return fmt.Errorf("%s: docqa is generated; give a trace (--trace FILE, or --workload conversation for the embedded one)", what)
}

func (w *workloadFlags) requests(fs *flag.FlagSet, win trace.Window, warmMs float64, blockTokens int) ([]trace.Request, trace.Stats, *harness.Warm, string, error) {
	var st trace.Stats
	fail := func(err error) ([]trace.Request, trace.Stats, *harness.Warm, string, error) {
		return nil, st, nil, "", usageErr(fs.Usage, err)
	}
	switch {
	case warmMs > 0:
		return fail(needsTrace("--warm-ms needs a trace's history (a generated workload starts cold)"))
	case win.FromMs != 0 || win.ToMs != 0:
		return fail(needsTrace("--from-ms/--to-ms cut a trace (--requests cuts docqa)"))
	}
	w.docqa.BlockTokens = blockTokens
	reqs, err := w.docqa.Generate()
	if err != nil {
		return fail(err)
	}
	if flagSet(fs, "requests") && win.First > 0 && win.First < len(reqs) {
		reqs = reqs[:win.First]
	}
	st.Requests, st.Lines = len(reqs), len(reqs)
	return reqs, st, nil, w.docqa.Describe(), nil
}

// traceRequests reads the trace window (the embedded one when path is
// empty), its warm-up history and the arrival spread of the whole trace.
func traceRequests(tracePath string, opts trace.Options, win trace.Window, warmMs float64, stderr io.Writer) ([]trace.Request, trace.Stats, *harness.Warm, string, error) {
	traceDesc := eval.DefaultWindowName
	if tracePath != "" {
		traceDesc = tracePath
	}
	fail := func(format string, err error) ([]trace.Request, trace.Stats, *harness.Warm, string, error) {
		return nil, trace.Stats{}, nil, traceDesc, fmt.Errorf(format, traceDesc, err)
	}
	// Read and parsed once: the window, its warm-up history and the
	// arrival spread are cut from it, each as a read of just that part
	// would give it (trace.Parsed.Select).
	parsed, err := parseTrace(tracePath, opts)
	if err != nil {
		return fail("reading %s: %w", err)
	}
	reqs, st, err := parsed.Select(win)
	if err != nil {
		return fail("reading %s: %w", err)
	}
	if len(reqs) == 0 {
		return nil, st, nil, traceDesc, fmt.Errorf("%s: no requests in the window", traceDesc)
	}
	if st.Skipped > 0 {
		fmt.Fprintf(stderr, "skipped %d malformed lines (first: %v)\n", st.Skipped, st.FirstSkipped)
	}
	var warm *harness.Warm
	if warmMs > 0 {
		if warm, err = warmHistory(parsed, reqs[0].TimestampMs, warmMs); err != nil {
			return fail("reading the warm-up history of %s: %w", err)
		}
	}
	if err := spreadAsInTrace(reqs, parsed); err != nil {
		return fail("spreading the arrivals of %s: %w", err)
	}
	trace.Rebase(reqs)
	return reqs, st, warm, traceDesc, nil
}

// printWindowNotes prints the summary's lines on what the window means:
// what was left out, and what makes it mean less (harness.WindowNotes).
func printWindowNotes(w io.Writer, res *harness.Result) {
	if res.Oversize > 0 || res.Reuse.OverCapacity > 0 {
		fmt.Fprintf(w, "left out: %d requests above the engine KV memory bound (%d MiB); %d longer than the capacity, saved in part\n",
			res.Oversize, res.MaxKVBytes>>20, res.Reuse.OverCapacity)
	}
	for _, n := range harness.WindowNotes(res) {
		fmt.Fprintf(w, "NOTE: %s\n", n)
	}
}

// printBelowNotes prints why tutti-cpu is below a backend, where it is
// (harness.BelowNotes), and the paper's figures as measured (harness.Claims).
func printBelowNotes(w io.Writer, res *harness.Result) {
	for _, n := range harness.BelowNotes(res) {
		fmt.Fprintf(w, "WHY: %s\n", n)
	}
	for _, c := range harness.Claims(res) {
		fmt.Fprintf(w, "CLAIM: %s\n", c)
	}
}

// rateText is the summary's rate at SLO: with several rounds the median
// round's and the range over all of them.
func rateText(b harness.BackendResult) string {
	rate := fmt.Sprintf("%.3f", b.MaxRateAtSLO)
	if b.MaxRateIsLowerBound {
		rate = ">=" + rate
	}
	if b.Rounds != nil {
		lo, hi := harness.MinMax(b.Rounds.MaxRateAtSLO)
		rate += fmt.Sprintf(" [%.1f-%.1f]", lo, hi)
	}
	return rate
}
