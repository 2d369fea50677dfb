package gpu

import (
	"github.com/tutti-io/tutti/kernels"
)

// Restorer is what the mover uses of a bound kernels.Restorer. The
// product's is kernels' own; runtime's tests bind a CPU one
// (Config.Bind), so that PathGPU's load and save logic, its scheduling
// included, runs in CI, where there is no GPU. The kernels API itself is
// unchanged.
type Restorer interface {
	Restore(req kernels.Request) (Restoration, error)
	// GatherLanes and GatherLane: kernels.Restorer's (the save's gathers,
	// one call per lane at a time, lanes handed out by the mover, with the
	// planes' CRC32Cs into planeCRCs, after the engine's afterEvent).
	GatherLanes() int
	GatherLane(lane int, pages []int32, firstLayer, layers int, dst uintptr, layerStride int64, planeCRCs []uint32, afterEvent uintptr) error
	FixedBuffers() (bool, error)
	Wakeups() int64
	BatchTimeouts() int64
	Close() error
}

// Restoration is one restore in flight (kernels.Restore's methods).
type Restoration interface {
	StreamWaitLayer(layer int, stream uintptr) error
	WaitLayer(layer int) error
	Wait() (*kernels.Result, error)
	Release() error
}

// kernelsRestorer is the product's restorer: package kernels.
type kernelsRestorer struct{ *kernels.Restorer }

func (k kernelsRestorer) Restore(req kernels.Request) (Restoration, error) {
	x, err := k.Restorer.Restore(req)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return x, nil
}
