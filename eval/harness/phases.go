package harness

import (
	"fmt"
	"time"
)

// Phases is where one backend's wall time went, request by request, summed
// (wall clock of the replay's goroutine, which does them one after
// another). Restore and Save are the measured I/O (the services' Load and
// Save come from them); the rest is the harness's own work around them,
// none of which is in any TTFT: zeroing the pages before a restore,
// the copies between the host KV memory and a backend's own (HBM) pages,
// verifying every restored byte, writing the new blocks' KV as the prefill
// would, and waiting for (or running) the GPU prefill. Other is the wall
// time no phase accounts for (allocation, the index, eviction, progress).
type Phases struct {
	RestoreS     float64 `json:"restore_s"`
	SaveS        float64 `json:"save_s"`
	ScribbleS    float64 `json:"scribble_s"`     // host pages zeroed before a restore
	InvalidateS  float64 `json:"invalidate_s"`   // a HostSyncer's own pages cleared before a restore
	ToHostS      float64 `json:"to_host_s"`      // restored pages copied to the host to verify them
	FromHostS    float64 `json:"from_host_s"`    // new blocks copied to the backend's pages to save them
	VerifyS      float64 `json:"verify_s"`       // every restored page checked bit for bit
	FillS        float64 `json:"fill_s"`         // the new blocks' KV written as a prefill would
	PrefillWaitS float64 `json:"prefill_wait_s"` // GPU prefill: waiting for it after the restore, or running it alone
	OtherS       float64 `json:"other_s"`
	WallS        float64 `json:"wall_s"`

	VerifiedBytes int64 `json:"verified_bytes"`
	FilledBytes   int64 `json:"filled_bytes"`
}

// phaseClock accumulates Phases.
type phaseClock struct {
	restore, save, scribble, invalidate, toHost, fromHost, verify, fill, prefill time.Duration
	verified, filled                                                             int64
}

// timed runs fn and adds its wall time to *d.
func timed(d *time.Duration, fn func()) {
	t0 := time.Now()
	fn()
	*d += time.Since(t0)
}

// phases is the sums with Other = wall − the phases (never negative).
func (c *phaseClock) phases(wall time.Duration) Phases {
	p := Phases{
		RestoreS: c.restore.Seconds(), SaveS: c.save.Seconds(), ScribbleS: c.scribble.Seconds(),
		InvalidateS: c.invalidate.Seconds(), ToHostS: c.toHost.Seconds(), FromHostS: c.fromHost.Seconds(),
		VerifyS: c.verify.Seconds(), FillS: c.fill.Seconds(), PrefillWaitS: c.prefill.Seconds(),
		WallS: wall.Seconds(), VerifiedBytes: c.verified, FilledBytes: c.filled,
	}
	sum := c.restore + c.save + c.scribble + c.invalidate + c.toHost + c.fromHost + c.verify + c.fill + c.prefill
	p.OtherS = max(0, (wall - sum).Seconds())
	return p
}

// HarnessS is the wall time of the harness's own work (all but Restore and
// Save).
func (p Phases) HarnessS() float64 { return max(0, p.WallS-p.RestoreS-p.SaveS) }

// String is the one-line breakdown the summary prints.
func (p Phases) String() string {
	return fmt.Sprintf("wall %.1f s = restore %.1f + save %.1f | harness %.1f: verify %.1f (%.1f GiB) + scribble %.1f + fill %.1f (%.1f GiB) + host/backend copies %.1f + prefill wait %.1f + other %.1f",
		p.WallS, p.RestoreS, p.SaveS, p.HarnessS(), p.VerifyS, float64(p.VerifiedBytes)/(1<<30), p.ScribbleS, p.FillS,
		float64(p.FilledBytes)/(1<<30), p.InvalidateS+p.ToHostS+p.FromHostS, p.PrefillWaitS, p.OtherS)
}
