package kernels

import (
	"fmt"

	"github.com/tutti-io/tutti/uring"
)

// NewKickRing creates the ring a GPU context drives in kick mode (no SQPOLL
// thread): DEFER_TASKRUN, created disabled, so that Bind can hand it to the
// helper's thread and the kernel wakes that thread once per batch of
// completions (see Config.Ring). On a kernel without DEFER_TASKRUN (before
// Linux 6.1) it falls back to an ordinary ring, woken by every completion,
// and says so: fallback is the reason, empty when there was none. The caller
// reports it (never silent); Restorer.HelperMode shows the mode as well.
//
// base sets the size and memory (Entries, CQEntries, NoMmap); its SQPoll,
// SingleIssuer, DeferTaskrun and Disabled fields are overridden. The caller
// owns the ring: it closes it after the Restorer bound to it is closed.
func NewKickRing(base uring.Config) (ring *uring.Ring, fallback string, err error) {
	cfg := base
	cfg.SQPoll, cfg.SQThreadCPU, cfg.SingleIssuer = false, -1, false
	cfg.DeferTaskrun, cfg.Disabled = true, true
	ring, err = uring.New(cfg)
	if err == nil {
		return ring, "", nil
	}
	deferErr := err
	cfg.DeferTaskrun, cfg.Disabled = false, false
	ring, err = uring.New(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("creating the GPU ring: %w (with DEFER_TASKRUN: %v)", err, deferErr)
	}
	return ring, fmt.Sprintf("ring without DEFER_TASKRUN (every completion wakes the helper): %v", deferErr), nil
}
