package sched

import (
	"errors"
	"fmt"
	"math"
)

// DeviceConfig is one device's model seed and limits. Zero limits take the
// documented defaults (Config.withDefaults).
type DeviceConfig struct {
	Profile DeviceProfile

	// Queue depth handed to the device at once, per direction (Dispatch never
	// exceeds them; the first op of an idle direction may exceed the byte limit
	// alone so that an op larger than the limit still runs).
	MaxReadsInFlight      int   // default 64
	MaxWritesInFlight     int   // default 4
	MaxReadBytesInFlight  int64 // default 256 MiB
	MaxWriteBytesInFlight int64 // default 16 MiB

	// Admission capacity: bytes admitted and not yet completed. PlanLoad cuts
	// the loaded prefix and EnqueueSave cuts the saved blocks to fit.
	MaxPendingReadBytes int64 // default 16 GiB
	// MaxPendingSaveBytes: default none beyond the save bound, which already
	// limits pending saves to what the device can write within SaveBoundNs
	// (at most 16× the profile's write rate) and MaxPendingIOs writes.
	MaxPendingSaveBytes int64
}

// Config configures a Planner.
type Config struct {
	Layers      int          // transformer layers (one read per layer and run)
	BlockTokens int          // tokens per chain block (the unit of the split)
	Compute     ComputeModel // seeded profile (FitCompute, ComputeFromFLOPs)
	Devices     []DeviceConfig

	// SaveBoundNs: every admitted save write completes within this long of
	// EnqueueSave, provided Dispatch is called at NextWakeNs and on completions.
	SaveBoundNs int64 // default 2 s
	// SlackMarginNs is kept free when a deferred save is slipped under reads,
	// and before a save's bound when it is promoted.
	SlackMarginNs int64 // default 1 ms
	// SlackFrac discounts a pending read's slack by this fraction of the time
	// until its planned completion when deciding whether a save fits under it:
	// predictions err in proportion to how far ahead they look.
	SlackFrac float64 // default 0.1; negative = 0
	// MaxWriteIOBytes cuts a save's per-layer object into writes of at most this
	// size, which bounds how long one deferred write can hold reads back.
	MaxWriteIOBytes int64 // default 4 MiB
	// MaxPendingIOs bounds the ops the planner tracks (queued + in flight, all
	// devices); each costs about 100 bytes.
	MaxPendingIOs int // default 65536
}

const (
	defaultMaxReadsInFlight      = 64
	defaultMaxWritesInFlight     = 4
	defaultMaxReadBytesInFlight  = 256 << 20
	defaultMaxWriteBytesInFlight = 16 << 20
	defaultMaxPendingReadBytes   = 16 << 30
	defaultMaxPendingSaveBytes   = math.MaxInt64
	defaultSaveBoundNs           = 2e9
	defaultSlackMarginNs         = 1e6
	defaultSlackFrac             = 0.1
	defaultMaxWriteIOBytes       = 4 << 20
	defaultMaxPendingIOs         = 1 << 16
	maxLayers                    = 1 << 12
	maxDevices                   = 256
)

// ErrConfig reports an unusable Config.
var ErrConfig = errors.New("sched: bad config")

func orDefault[T int | int64](v, d T) T {
	if v == 0 {
		return d
	}
	return v
}

func (c Config) withDefaults() (Config, error) {
	if c.Layers <= 0 || c.Layers > maxLayers {
		return c, fmt.Errorf("layers %d not in [1, %d]: %w", c.Layers, maxLayers, ErrConfig)
	}
	if c.BlockTokens <= 0 {
		return c, fmt.Errorf("block tokens %d: %w", c.BlockTokens, ErrConfig)
	}
	if _, err := NewComputeModel(c.Compute.FixedNs, c.Compute.PerTokenNs, c.Compute.PerPairNs); err != nil {
		return c, fmt.Errorf("compute: %w", err)
	}
	if len(c.Devices) == 0 || len(c.Devices) > maxDevices {
		return c, fmt.Errorf("%d devices, need 1..%d: %w", len(c.Devices), maxDevices, ErrConfig)
	}
	c.SaveBoundNs = orDefault(c.SaveBoundNs, int64(defaultSaveBoundNs))
	c.SlackMarginNs = orDefault(c.SlackMarginNs, int64(defaultSlackMarginNs))
	c.MaxWriteIOBytes = orDefault(c.MaxWriteIOBytes, int64(defaultMaxWriteIOBytes))
	c.MaxPendingIOs = orDefault(c.MaxPendingIOs, defaultMaxPendingIOs)
	if c.SlackFrac == 0 {
		c.SlackFrac = defaultSlackFrac
	}
	c.SlackFrac = max(0, c.SlackFrac)
	if c.SaveBoundNs < 0 || c.SlackMarginNs < 0 || c.MaxWriteIOBytes < 0 || c.MaxPendingIOs < 0 || c.MaxPendingIOs > 1<<30 {
		return c, fmt.Errorf("negative or huge limit in %+v: %w", c, ErrConfig)
	}
	if 4*c.SlackMarginNs >= c.SaveBoundNs {
		return c, fmt.Errorf("slack margin %d ns leaves no room in save bound %d ns: %w", c.SlackMarginNs, c.SaveBoundNs, ErrConfig)
	}
	devs := make([]DeviceConfig, len(c.Devices))
	for i, d := range c.Devices {
		if err := d.Profile.Validate(); err != nil {
			return c, fmt.Errorf("device %d: %w", i, err)
		}
		d.MaxReadsInFlight = orDefault(d.MaxReadsInFlight, defaultMaxReadsInFlight)
		d.MaxWritesInFlight = orDefault(d.MaxWritesInFlight, defaultMaxWritesInFlight)
		d.MaxReadBytesInFlight = orDefault(d.MaxReadBytesInFlight, int64(defaultMaxReadBytesInFlight))
		d.MaxWriteBytesInFlight = orDefault(d.MaxWriteBytesInFlight, int64(defaultMaxWriteBytesInFlight))
		d.MaxPendingReadBytes = orDefault(d.MaxPendingReadBytes, int64(defaultMaxPendingReadBytes))
		d.MaxPendingSaveBytes = orDefault(d.MaxPendingSaveBytes, int64(defaultMaxPendingSaveBytes))
		if d.MaxReadsInFlight < 0 || d.MaxWritesInFlight < 0 || d.MaxReadBytesInFlight < 0 ||
			d.MaxWriteBytesInFlight < 0 || d.MaxPendingReadBytes < 0 || d.MaxPendingSaveBytes < 0 {
			return c, fmt.Errorf("device %d: negative limit in %+v: %w", i, d, ErrConfig)
		}
		devs[i] = d
	}
	c.Devices = devs
	return c, nil
}
