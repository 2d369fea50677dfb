package harness

import (
	"time"

	"github.com/tutti-io/tutti/eval/blockstat"
)

// DeviceSample is the device's read and write bandwidth over one sampling
// interval of a backend's run (whole disk: eBPF when it runs, else diskstats).
type DeviceSample struct {
	Seconds        float64 // interval end, since the backend's start
	ReadBytesPerS  float64
	WriteBytesPerS float64
}

// maxSamples bounds a sampler's memory (an hour at 200 ms).
const maxSamples = 18000

// sampler reads a Meter periodically on its own goroutine until stop.
type sampler struct {
	stop    chan struct{}
	done    chan struct{}
	samples []DeviceSample
}

func startSampler(m *blockstat.Meter, every time.Duration) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t0 := time.Now()
		tick := time.NewTicker(every)
		defer tick.Stop()
		prev, prevT := m.Sample(), 0.0
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			cur, now := m.Sample(), time.Since(t0).Seconds()
			dt := now - prevT
			if dt > 0 && len(s.samples) < maxSamples {
				s.samples = append(s.samples, DeviceSample{Seconds: now,
					ReadBytesPerS:  float64(cur.DeviceReadBytes()-prev.DeviceReadBytes()) / dt,
					WriteBytesPerS: float64(writeBytes(cur)-writeBytes(prev)) / dt})
			}
			prev, prevT = cur, now
		}
	}()
	return s
}

func writeBytes(r blockstat.Result) uint64 {
	if r.EBPF {
		return r.EBPFWriteBytes
	}
	return r.DiskWriteBytes
}

// Stop ends sampling and returns the samples. Call once.
func (s *sampler) Stop() []DeviceSample {
	close(s.stop)
	<-s.done
	return s.samples
}
