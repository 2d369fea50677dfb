package kernels

import (
	"fmt"
	"time"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring"
)

// Config describes what Bind allocates and binds. Zero fields take the
// defaults named.
type Config struct {
	Device   int
	Geometry kvshape.Geometry // ChunkPages is not used
	Layout   Layout
	NumPages int      // engine pages in each KV tensor
	KV       []uint64 // device pointers: Geometry.Layers tensors (per-layer) or one (cross-layer)

	// Ring is a ring dedicated to the GPU (nothing else may Submit to it while
	// bound); nil binds host copies only (CPU-issued I/O paths). With SQPOLL
	// the kernel thread submits and the helper only wakes it; without, the
	// helper enters the kernel once per WakeInterval (kick mode).
	//
	// A kick-mode ring created with uring.Config{DeferTaskrun: true,
	// Disabled: true} is the cheapest on the CPU: Bind hands it to the
	// helper's thread, which registers the staging pool, enables the ring
	// (becoming its single issuer) and is then woken by the kernel once per
	// batch of completions instead of once per completion. Such a ring must
	// not be used by anything else while bound, not even to register.
	Ring *uring.Ring

	MaxPages     int           // pages per request (required)
	MaxExtents   int           // extents per layer per request; 64
	MaxIOBytes   int           // largest single read; 1 MiB (multiple of 4096)
	StagingSlots int           // layer slots of the pinned staging pool; Lookahead+3
	MaxRequests  int           // requests in flight; 4
	IOWindow     int           // SQEs in flight; 128 (capped by the ring's SQ and CQ)
	Lookahead    int           // layers beyond the one waited for that may be in flight; 1
	PollTimeout  time.Duration // no completion for this long: entries time out, the ring breaks; 5 s
	GatherLanes  int           // concurrent GatherLane callers, each with its own stream and page map buffers; 8 (tutti_kernels.h's TK_GATHER_LANES), at most 64
	WakeInterval time.Duration // SQPOLL: how often the helper looks at the flags; kick mode: wait while nothing is in flight; 50 µs
	WakeBatch    int           // kick mode: most completions one wake-up of the helper waits for; 32 (1: every completion)
	BatchWait    time.Duration // kick mode: longest wait for a batch while I/O is in flight; 4 ms
	// WakeRamp (kick mode): when a restore begins, the helper's batch starts
	// at 1 and grows by one every WakeRamp completions up to WakeBatch, so
	// the first layer is seen as soon as its reads are done; 8 (-1: no
	// ramp, a full batch from the first wait).
	WakeRamp      int
	SlotBytesHint int64 // staging slot size; derived from MaxPages and MaxExtents
	// EnqueueLayers is how many layers of a restore are on the GPU's streams
	// ahead of the last one scattered; Restore enqueues that many and a
	// feeder goroutine the rest (feed.go: enqueueing blocks once the GPU's
	// command queue is full, about 60 layers). 2×(Lookahead+3), at least 16,
	// at most 48.
	EnqueueLayers int
	// EnqueueChunk is how many layers the feeder enqueues per wake-up (it
	// waits for layer l-EnqueueLayers+EnqueueChunk-1, then enqueues layers
	// l..l+EnqueueChunk-1): fewer host wake-ups per restore, at least
	// EnqueueLayers-EnqueueChunk+1 layers always queued. EnqueueLayers/2,
	// at least 1, at most 8; at most EnqueueLayers. Why: each wake-up of
	// the feeder costs CPU time and a chunk of layers per wake-up moves the
	// same bytes per second as one layer per wake-up.
	EnqueueChunk int
}

func (c *Config) defaults() {
	if c.MaxExtents == 0 {
		c.MaxExtents = 64
	}
	if c.MaxIOBytes == 0 {
		c.MaxIOBytes = 1 << 20
	}
	if c.Lookahead == 0 {
		c.Lookahead = 1
	}
	if c.StagingSlots == 0 {
		c.StagingSlots = c.Lookahead + 3
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = 4
	}
	if c.EnqueueLayers == 0 {
		c.EnqueueLayers = min(48, max(16, 2*(c.Lookahead+3)))
	}
	if c.EnqueueChunk == 0 {
		c.EnqueueChunk = min(8, max(1, c.EnqueueLayers/2))
	}
	if c.IOWindow == 0 {
		c.IOWindow = 128
	}
	if c.PollTimeout == 0 {
		c.PollTimeout = 5 * time.Second
	}
	if c.WakeInterval == 0 {
		c.WakeInterval = 50 * time.Microsecond
	}
	if c.WakeBatch <= 0 {
		c.WakeBatch = 32
	}
	if c.WakeRamp == 0 {
		c.WakeRamp = 8
	}
	if c.BatchWait == 0 {
		// On a slow disk a batch of 32 takes longer than this, so the
		// timeout sets the wake-up rate there, and a shorter one costs CPU
		// time in wake-ups. A layer's last completions may wait this long;
		// layers of such a disk take far longer.
		c.BatchWait = 4 * time.Millisecond
	}
}

// PlanLimits are the limits a Restorer bound with cfg checks every request
// against (BuildPlan): a caller that builds requests without a GPU checks
// them the same way.
func PlanLimits(cfg Config) Limits {
	cfg.defaults()
	g := cfg.Geometry
	slotBytes := stagingSlotBytes(cfg, g)
	return Limits{Layers: g.Layers, NumPages: cfg.NumPages, MaxPages: cfg.MaxPages, SlotBytes: slotBytes,
		MaxIOBytes: cfg.MaxIOBytes, MaxEntries: int((slotBytes+int64(cfg.MaxIOBytes)-1)/int64(cfg.MaxIOBytes)) + cfg.MaxExtents,
		MaxRequests: cfg.MaxRequests}
}

// checkFeed checks the feeder's settings (after defaults).
func (c *Config) checkFeed() error {
	if c.EnqueueLayers < 1 || c.EnqueueChunk < 0 || c.EnqueueChunk > c.EnqueueLayers {
		return fmt.Errorf("EnqueueLayers %d, EnqueueChunk %d: want EnqueueLayers ≥ 1 and EnqueueChunk in [0, EnqueueLayers]: %w",
			c.EnqueueLayers, c.EnqueueChunk, ErrInvalid)
	}
	return nil
}
