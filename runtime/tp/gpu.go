package tp

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/runtime"
)

// rankDevices picks each rank's CUDA device on PathGPU: cfg.Devices when
// given, else rank r on device r mod (visible GPUs). Several ranks on one
// device each still get their own store, SQPOLL ring, staging pool and
// restorer (runtime.Open binds them per store), so the N-rank GPU path runs,
// and is tested, on a one-GPU machine; with N GPUs each rank drives its own.
func rankDevices(cfg *Config) ([]int, error) {
	devs := make([]int, cfg.Ranks)
	if cfg.Store.Path != runtime.PathGPU {
		return devs, nil
	}
	if cfg.Devices != nil {
		copy(devs, cfg.Devices)
		// Fail once, for the group, rather than once per rank.
		for _, d := range devs {
			if err := kernels.Init(d); err != nil {
				return nil, fmt.Errorf("tp: device %d: %w: %w", d, runtime.ErrGPUUnavailable, err)
			}
		}
		return devs, nil
	}
	n, err := visibleGPUs(cfg.Ranks)
	if err != nil {
		return nil, fmt.Errorf("tp: counting GPUs: %w: %w", runtime.ErrGPUUnavailable, err)
	}
	for r := range devs {
		devs[r] = r % n
	}
	return devs, nil
}

// visibleGPUs counts the CUDA devices, up to limit, by initialising them in
// order (kernels.Init, which the stores' binds do anyway); the first device
// the library refuses as out of range (kernels.ErrInvalid: "device d of n")
// ends the count. Devices past limit are never touched, so no context is
// created on a GPU no rank uses.
func visibleGPUs(limit int) (int, error) {
	n := 0
	for d := 0; d < limit; d++ {
		err := kernels.Init(d)
		if err == nil {
			n++
			continue
		}
		if d > 0 && errors.Is(err, kernels.ErrInvalid) {
			break
		}
		return 0, err
	}
	return n, nil
}
