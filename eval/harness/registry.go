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
