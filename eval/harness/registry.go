package harness

import (
	"fmt"
	"slices"
	"strings"
)

// BackendNames lists the backends a replay runs by default, in the order it
// runs them: tutti's two paths, the designs users pick instead (each
// implemented here after its design: LMCache's GDS and local disk backends,
// vLLM's file-system tier), the DRAM tier and recompute.
var BackendNames = []string{"tutti-gpu", "tutti-cpu", "lmcache-gds", "lmcache-disk", "vllm-fs", "dram", "recompute"}

// ExtraBackendNames run only when named: tutti-cpu with the planner off
// (every cached block loaded: the bound the planner must not fall below)
// and the older stand-ins, which follow no product's design (labelled so).
var ExtraBackendNames = []string{"tutti-cpu-load-all", "per-block", "cufile", "pagecache"}

// backendSummaries say in one line what each backend is: `tutti replay -h`,
// the report and the README's table (a test holds it to these) say the same.
var backendSummaries = map[string]string{
	"tutti-gpu": "tutti, GPU path: the GPU drives io_uring reads of whole per-layer runs into pinned staging and scatters them into HBM pages (needs the kernels library and a GPU)",
	"tutti-cpu": "tutti, CPU path: one io_uring read per layer and run, issued from Go into the host KV pages; its planner recomputes cached blocks where that is faster",
	"lmcache-gds": fmt.Sprintf("LMCache's GDS backend's design, implemented here: a file per %d-token chunk holding every layer, O_DIRECT (cuFile where it registers the files), %d I/O threads",
		lmcacheChunkTokens, lmcacheDiskThreads),
	"lmcache-disk": fmt.Sprintf("LMCache's local disk backend's design, implemented here: a file per %d-token chunk holding every layer, buffered I/O through the page cache, %d I/O threads",
		lmcacheChunkTokens, lmcacheDiskThreads),
	"vllm-fs": fmt.Sprintf("vLLM's file-system offload tier's design, implemented here: a file per engine page (vLLM's block) holding every layer, O_DIRECT, %d reader threads",
		vllmFSThreads),
	"dram":               "the blocks in host memory: the bound every storage tier is below",
	"recompute":          "no cache: every request prefills its whole prompt",
	"tutti-cpu-load-all": "tutti-cpu with its planner off: every cached block loaded (the bound the planner must not fall below)",
	"per-block":          "one O_DIRECT io_uring read per page and layer: the no-batching bound (an older stand-in, no product's design)",
	"cufile":             "a file per chain block, one synchronous O_DIRECT read each through a host bounce (an older stand-in, not cuFile)",
	"pagecache":          "a file per chain block, one synchronous buffered read each (an older stand-in, no product's design)",
}

// BackendSummary is what backend name is, in one line ("" for an unknown
// name); a tensor-parallel variant (tpBackends' "<name>-tpN") says so.
func BackendSummary(name string) string {
	if i := strings.LastIndex(name, "-tp"); i > 0 {
		if base, ok := backendSummaries[name[:i]]; ok {
			return base + ", over " + name[i+3:] + " tensor-parallel ranks"
		}
	}
	return backendSummaries[name]
}

// NewBackend returns the backend called name. planner, when non-nil, is the
// compute model tutti's scheduler uses to weigh loading against recomputing
// (nil: tutti loads every cached block, as the baselines do).
func NewBackend(name string, planner *Compute) (Backend, error) {
	switch name {
	case "tutti-gpu":
		return NewTuttiGPU(planner), nil
	case "tutti-cpu":
		return NewTuttiCPU(planner), nil
	case "tutti-cpu-load-all":
		return NewTuttiCPULoadAll(), nil
	case "lmcache-gds":
		return NewLMCacheGDS(), nil
	case "lmcache-disk":
		return NewLMCacheDisk(), nil
	case "vllm-fs":
		return NewVLLMFS(), nil
	case "per-block":
		return NewPerBlock(), nil
	case "cufile":
		return NewCuFileStandIn(), nil
	case "pagecache":
		return NewPageCache(), nil
	case "dram":
		return NewDRAM(), nil
	case "recompute":
		return Recompute{}, nil
	}
	return nil, fmt.Errorf("unknown backend %q (have %s)", name, strings.Join(slices.Concat(BackendNames, ExtraBackendNames), ", "))
}
