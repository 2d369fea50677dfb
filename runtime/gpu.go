package runtime

import (
	"errors"
	"fmt"
)

// ErrGPUUnavailable is wrapped by Open with PathGPU when the GPU path cannot
// run here (no GPU, or the kernels library is not loaded); the cause is
// wrapped too. Open never falls back to PathCPU by itself.
var ErrGPUUnavailable = errors.New("runtime: GPU path unavailable")

// gpuAvailable reports why PathGPU cannot run.
func gpuAvailable() error {
	return fmt.Errorf("%w: the GPU restore path is not wired into this build", ErrGPUUnavailable)
}
