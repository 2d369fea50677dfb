package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/tutti-io/tutti/eval/metrics"
)

// ServiceLog is what a replay measured, per backend and request: everything
// the timeline needs, so TTFT and the SLO sweep can be computed again (at
// another SLO) without re-running the backends (a GPU-machine replay costs
// minutes of device time). Written as services.json next to a report.
type ServiceLog struct {
	Version   int               `json:"version"` // ServiceLogVersion
	Model     string            `json:"model"`
	SLOms     float64           `json:"slo_ms"` // the SLO the report used
	SLOSource string            `json:"slo_source"`
	Backends  []BackendServices `json:"backends"`
}

// BackendServices are one backend's services, in arrival order.
type BackendServices struct {
	Backend  string    `json:"backend"`
	Services []Service `json:"services"`
}

// ServiceLogVersion is the version WriteServices writes and ReadServices reads.
const ServiceLogVersion = 1

// ErrServiceLog marks a services.json that is malformed or out of range.
var ErrServiceLog = errors.New("bad service log")

// WriteServices writes res's services as a ServiceLog (JSON).
func WriteServices(w io.Writer, res *Result) error {
	log := ServiceLog{Version: ServiceLogVersion, Model: res.Model, SLOms: res.SLOms, SLOSource: res.SLOSource}
	for _, b := range res.Backends {
		log.Backends = append(log.Backends, BackendServices{Backend: b.Backend, Services: b.Services})
	}
	return json.NewEncoder(w).Encode(log)
}

func checkService(s Service, prevArrivalMs float64) error {
	switch {
	case !finite(s.ArrivalMs) || s.ArrivalMs < prevArrivalMs:
		return fmt.Errorf("arrival %v ms after %v ms", s.ArrivalMs, prevArrivalMs)
	case s.Layers < 1 || s.Layers > maxLogLayers:
		return fmt.Errorf("%d layers (1..%d)", s.Layers, maxLogLayers)
	case len(s.LayerReady) > s.Layers:
		return fmt.Errorf("%d layer-ready times for %d layers", len(s.LayerReady), s.Layers)
	case s.Load < 0 || s.Save < 0 || s.LayerCompute < 0 || s.SaveBlocks < 0 || s.Bytes < 0:
		return fmt.Errorf("negative time or count: load %v save %v compute %v save blocks %d bytes %d",
			s.Load, s.Save, s.LayerCompute, s.SaveBlocks, s.Bytes)
	case s.ArrivalMs > maxLogArrivalMs:
		return fmt.Errorf("arrival_ms %v beyond the bound %v", s.ArrivalMs, float64(maxLogArrivalMs))
	case s.SaveBlocks > maxLogSaveBlocks:
		return fmt.Errorf("save_blocks %d beyond the bound %d", s.SaveBlocks, maxLogSaveBlocks)
	case s.Load > maxLogTime || s.Save > maxLogTime || s.LayerCompute > maxLogTime:
		return fmt.Errorf("load_ns %d, save_ns %d or layer_compute_ns %d beyond the bound %d", s.Load, s.Save, s.LayerCompute, maxLogTime)
	}
	for l, t := range s.LayerReady {
		if t < 0 || (l > 0 && t < s.LayerReady[l-1]) {
			return fmt.Errorf("layer %d ready at %v, layer %d at %v", l, t, max(l-1, 0), s.LayerReady[max(l-1, 0)])
		}
	}
	return nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// ResweepRow is one backend's TTFT and rate at SLO, computed again from its
// services.
type ResweepRow struct {
	Backend             string  `json:"backend"`
	TTFTmsP50           float64 `json:"ttft_ms_p50"`
	TTFTmsP90           float64 `json:"ttft_ms_p90"`
	TTFTmsP99           float64 `json:"ttft_ms_p99"`
	MaxRateAtSLO        float64 `json:"max_rate_at_slo"`
	MaxRateIsLowerBound bool    `json:"max_rate_is_lower_bound"`
}

// Resweep replays every backend's services through the timeline at sloMs;
// sloMs ≤ 0 settles the SLO as a replay does (settleSLO: the recompute
// backend's prefills when the log has them, else the log's own SLO). It
// returns the rows and the SLO used with its source.
func Resweep(log *ServiceLog, sloMs float64) ([]ResweepRow, float64, string) {
	res := &Result{SLOms: log.SLOms, SLOSource: log.SLOSource}
	if sloMs > 0 {
		res.SLOms, res.SLOSource = sloMs, "given"
	}
	for _, b := range log.Backends {
		res.Backends = append(res.Backends, BackendResult{Backend: b.Backend, Services: b.Services})
	}
	settleSLO(Config{SLOms: sloMs}, res)
	var rows []ResweepRow
	for _, b := range res.Backends {
		row := ResweepRow{Backend: b.Backend, MaxRateAtSLO: b.MaxRateAtSLO, MaxRateIsLowerBound: b.MaxRateIsLowerBound}
		if len(b.Services) > 0 {
			s := metrics.Summarize(Simulate(b.Services, 1).TTFTms)
			row.TTFTmsP50, row.TTFTmsP90, row.TTFTmsP99 = s.P50, s.P90, s.P99
		}
		rows = append(rows, row)
	}
	return rows, res.SLOms, res.SLOSource
}

// SpreadArrivals re-places services that share one arrival time evenly over
// widthMs (the k services at time t get t + i·widthMs/k, in order), for a
// log recorded with simultaneous arrivals (a window inside one timestamp
// bucket, before replay spread windows as the whole trace). The services
// themselves (load, layer and save times) are the ones measured; only the
// arrivals, which the timeline and the rate sweep replay, move. widthMs ≤ 0
// leaves svc as it is.
func SpreadArrivals(svc []Service, widthMs float64) {
	if widthMs <= 0 {
		return
	}
	for i := 0; i < len(svc); {
		j := i + 1
		for j < len(svc) && svc[j].ArrivalMs == svc[i].ArrivalMs {
			j++
		}
		if k := j - i; k > 1 {
			for n := i; n < j; n++ {
				svc[n].ArrivalMs = svc[i].ArrivalMs + float64(n-i)*widthMs/float64(k)
			}
		}
		i = j
	}
}
