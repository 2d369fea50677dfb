package sched

import (
	"fmt"
	"math"
)

// DeviceProfile is what devbench measures for one device (or one striped pool
// file on its own device). Rates are sustained at the runtime's queue depth.
type DeviceProfile struct {
	ReadBytesPerSec  float64 // large O_DIRECT reads, deep queue
	WriteBytesPerSec float64 // large O_DIRECT writes, deep queue
	ReadIOPS         float64 // small reads, deep queue (bounds the per-op cost)
	WriteIOPS        float64
	ReadLatencyNs    float64 // first completion on an idle device
	// ReadShareUnderWrites is read bandwidth while writes run concurrently,
	// divided by read bandwidth alone (devbench runs both; 1 = no penalty).
	ReadShareUnderWrites float64
	// WriteShareUnderReads is write bandwidth while reads run, divided by write
	// bandwidth alone. A promoted save shares the device with reads; the save
	// bound is kept with writes at this share.
	WriteShareUnderReads float64
}

// Validate reports a profile that cannot predict times.
func (p DeviceProfile) Validate() error {
	for _, v := range []float64{p.ReadBytesPerSec, p.WriteBytesPerSec, p.ReadIOPS, p.WriteIOPS} {
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("device profile %+v: rates must be finite and > 0: %w", p, ErrBadProfile)
		}
	}
	if !(p.ReadLatencyNs >= 0) || math.IsInf(p.ReadLatencyNs, 0) {
		return fmt.Errorf("device profile: read latency %v: %w", p.ReadLatencyNs, ErrBadProfile)
	}
	if !(p.ReadShareUnderWrites > 0 && p.ReadShareUnderWrites <= 1) {
		return fmt.Errorf("device profile: read share under writes %v not in (0, 1]: %w", p.ReadShareUnderWrites, ErrBadProfile)
	}
	if !(p.WriteShareUnderReads > 0 && p.WriteShareUnderReads <= 1) {
		return fmt.Errorf("device profile: write share under reads %v not in (0, 1]: %w", p.WriteShareUnderReads, ErrBadProfile)
	}
	return nil
}

// DeviceModel is a DeviceProfile corrected online from completions. Each op
// costs the device max(bytes/bandwidth, 1/IOPS) of busy time: large ops are
// bandwidth bound, small ones IOPS bound, and ops overlap at queue depth so the
// busy times add up. Not safe for concurrent mutation.
type DeviceModel struct {
	cur  DeviceProfile // current estimates
	seed DeviceProfile // the profile, bounds the corrections
	obs  int64
}

// Online correction bounds: EWMA in the log domain, ±ln 2 per observation,
// estimates kept within [1/16, 16] of the profile.
const (
	deviceAlpha      = 0.125
	deviceMaxStep    = math.Ln2
	deviceMaxLogDiff = 4 * math.Ln2
)

// NewDeviceModel validates the profile.
func NewDeviceModel(p DeviceProfile) (DeviceModel, error) {
	if err := p.Validate(); err != nil {
		return DeviceModel{}, err
	}
	return DeviceModel{cur: p, seed: p}, nil
}

// Profile returns the current (corrected) estimates.
func (d DeviceModel) Profile() DeviceProfile { return d.cur }

// Observations counts the batches that corrected the model.
func (d DeviceModel) Observations() int64 { return d.obs }

// ReadNs is the device busy time of one read of bytes, concurrent writes absent.
func (d DeviceModel) ReadNs(bytes int64) float64 {
	return math.Max(float64(bytes)*1e9/d.cur.ReadBytesPerSec, 1e9/d.cur.ReadIOPS)
}

// WriteNs is the device busy time of one write of bytes.
func (d DeviceModel) WriteNs(bytes int64) float64 {
	return math.Max(float64(bytes)*1e9/d.cur.WriteBytesPerSec, 1e9/d.cur.WriteIOPS)
}

// ReadShare is the fraction of read bandwidth left while writes run.
func (d DeviceModel) ReadShare() float64 { return d.cur.ReadShareUnderWrites }

// WriteShare is the fraction of write bandwidth left while reads run.
func (d DeviceModel) WriteShare() float64 { return d.cur.WriteShareUnderReads }

// LatencyNs is the first-completion latency of an idle device.
func (d DeviceModel) LatencyNs() float64 { return d.cur.ReadLatencyNs }

func ewmaLog(cur, seed, observed float64) float64 {
	e := math.Log(observed / cur)
	e = math.Max(-deviceMaxStep, math.Min(deviceMaxStep, e))
	l := math.Log(cur) + deviceAlpha*e
	ls := math.Log(seed)
	l = math.Max(ls-deviceMaxLogDiff, math.Min(ls+deviceMaxLogDiff, l))
	return math.Exp(l)
}

// RemeasureReads replaces the read bandwidth, estimate and seed both, by
// readBytesPerSec measured afresh on the device (a re-run of the probe that
// seeded it). Online corrections stay within a factor of the seed, so a
// seed measured while the device was busy would otherwise bound the model
// for good; and a model that says loads lose to recompute sees no reads to
// correct it. A rate that is not finite and > 0 is refused.
func (d *DeviceModel) RemeasureReads(readBytesPerSec float64) error {
	if !(readBytesPerSec > 0) || math.IsInf(readBytesPerSec, 0) {
		return fmt.Errorf("device model: remeasured read rate %v: %w", readBytesPerSec, ErrBadProfile)
	}
	d.cur.ReadBytesPerSec, d.seed.ReadBytesPerSec = readBytesPerSec, readBytesPerSec
	d.obs++
	return nil
}

// ObserveReads corrects the model from a batch of completed reads: ops reads
// of bytes in total kept the device busy for busyNs (the union of the
// intervals in which at least one of them was in flight; at queue depth 1 the
// sum of latencies). withWrites says whether writes ran during the interval:
// such batches correct ReadShareUnderWrites instead of the bandwidth. Batches
// whose mean op is IOPS bound correct ReadIOPS. Nonsense input is ignored.
func (d *DeviceModel) ObserveReads(bytes int64, ops int, busyNs int64, withWrites bool) {
	if bytes <= 0 || ops <= 0 || busyNs <= 0 {
		return
	}
	perOp := bytes / int64(ops)
	rate := float64(bytes) * 1e9 / float64(busyNs)
	bwBound := float64(perOp)*1e9/d.cur.ReadBytesPerSec >= 1e9/d.cur.ReadIOPS
	switch {
	case withWrites && bwBound:
		share := rate / d.cur.ReadBytesPerSec
		share = math.Max(1.0/16, math.Min(1, share))
		d.cur.ReadShareUnderWrites += deviceAlpha * (share - d.cur.ReadShareUnderWrites)
	case withWrites:
		return // IOPS-bound reads under writes say little about either figure
	case bwBound:
		d.cur.ReadBytesPerSec = ewmaLog(d.cur.ReadBytesPerSec, d.seed.ReadBytesPerSec, rate)
	default:
		d.cur.ReadIOPS = ewmaLog(d.cur.ReadIOPS, d.seed.ReadIOPS, float64(ops)*1e9/float64(busyNs))
	}
	d.obs++
}

// ObserveWrites corrects the write figures from a batch, like ObserveReads:
// batches that ran alongside reads correct WriteShareUnderReads.
func (d *DeviceModel) ObserveWrites(bytes int64, ops int, busyNs int64, withReads bool) {
	if bytes <= 0 || ops <= 0 || busyNs <= 0 {
		return
	}
	perOp := bytes / int64(ops)
	bwBound := float64(perOp)*1e9/d.cur.WriteBytesPerSec >= 1e9/d.cur.WriteIOPS
	if withReads {
		if bwBound {
			share := float64(bytes) * 1e9 / float64(busyNs) / d.cur.WriteBytesPerSec
			share = math.Max(1.0/16, math.Min(1, share))
			d.cur.WriteShareUnderReads += deviceAlpha * (share - d.cur.WriteShareUnderReads)
			d.obs++
		}
		return
	}
	if bwBound {
		d.cur.WriteBytesPerSec = ewmaLog(d.cur.WriteBytesPerSec, d.seed.WriteBytesPerSec, float64(bytes)*1e9/float64(busyNs))
	} else {
		d.cur.WriteIOPS = ewmaLog(d.cur.WriteIOPS, d.seed.WriteIOPS, float64(ops)*1e9/float64(busyNs))
	}
	d.obs++
}
