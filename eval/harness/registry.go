package harness

import (
	"fmt"
	"strings"
)

// BackendNames lists every backend, in the order a replay runs them.
var BackendNames = []string{"tutti-gpu", "tutti-cpu", "per-block", "cufile", "pagecache", "dram", "recompute"}

// NewBackend returns the backend called name. planner, when non-nil, is the
// compute model tutti's scheduler uses to weigh loading against recomputing
// (nil: tutti loads every cached block, as the baselines do).
func NewBackend(name string, planner *Compute) (Backend, error) {
	switch name {
	case "tutti-gpu":
		return NewTuttiGPU(planner), nil
	case "tutti-cpu":
		return NewTuttiCPU(planner), nil
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
	return nil, fmt.Errorf("unknown backend %q (have %s)", name, strings.Join(BackendNames, ", "))
}
