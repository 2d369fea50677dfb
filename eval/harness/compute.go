package harness

import (
	"fmt"
	"time"

	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/sched"
)

// Compute is the prefill compute model used when no GPU runs the prefill: the
// scheduler's ComputeModel built from the profile's FLOPs and an assumed
// GPU rate. Results using it are labelled simulated.
type Compute struct {
	Label string // e.g. "simulated: 495 TFLOP/s (H200 bf16 dense peak 989 at 50% MFU), 20 µs per layer"
	model sched.ComputeModel
}

// DefaultGPUFLOPs is the assumed prefill rate: an H200's dense bf16 peak
// (989 TFLOP/s) at 50% model FLOPs utilisation.
const DefaultGPUFLOPs = 989e12 * 0.5

// DefaultLayerFixedNs is a per-layer launch and synchronisation overhead.
const DefaultLayerFixedNs = 20_000

// NewCompute builds the model for profile p at gpuFLOPs FLOP/s.
func NewCompute(p model.Profile, gpuFLOPs, layerFixedNs float64) (Compute, error) {
	layers := float64(p.Shape.Layers)
	m, err := sched.ComputeFromFLOPs(sched.FLOPsProfile{
		LinearFLOPsPerToken: p.LinearFLOPsPerToken() / layers,
		AttnFLOPsPerPair:    p.AttnFLOPsPerContextToken() / layers,
		GEMMFLOPsPerSec:     gpuFLOPs,
		FixedNs:             layerFixedNs,
	})
	if err != nil {
		return Compute{}, fmt.Errorf("compute model for %s: %w", p.Name, err)
	}
	return Compute{
		Label: fmt.Sprintf("simulated: %s prefill FLOPs at %.0f TFLOP/s, %.0f µs fixed per layer (no GPU in this run)",
			p.Name, gpuFLOPs/1e12, layerFixedNs/1e3),
		model: m,
	}, nil
}

// Layer is the time of one layer computing newTokens tokens after
// cachedTokens tokens of context.
func (c Compute) Layer(newTokens, cachedTokens int) time.Duration {
	if newTokens <= 0 {
		return 0
	}
	return time.Duration(c.model.LayerNs(newTokens, cachedTokens))
}

// Model returns the scheduler's compute model (for a backend whose planner
// weighs loading against recomputing with the same costs).
func (c Compute) Model() sched.ComputeModel { return c.model }
