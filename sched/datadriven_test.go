package sched

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestDispatchScript replays testdata/dispatch and testdata/spread: plans,
// saves, dispatches and completions on devices of round numbers (1 GB/s both
// ways, so 1 MB takes 1 ms; shares 0.5; no latency, no IOPS floor; one
// unless init says devices=N) and a GPU doing 1 µs per token per layer, and
// logs what the planner decides. Times print in ms. spread=1 on a load or a
// save puts layer l of run i (of the save) on device (i + l) % devices, as
// the store's placement does.
func TestDispatchScript(t *testing.T) {
	for _, f := range []string{"testdata/dispatch", "testdata/spread"} {
		t.Run(f, func(t *testing.T) { dispatchScript(t, f) })
	}
}

func dispatchScript(t *testing.T, path string) {
	var (
		p        *Planner
		inflight []IO
		devices  int
	)
	ms := func(ns int64) string {
		if ns == math.MaxInt64 {
			return "never"
		}
		return strconv.FormatFloat(float64(ns)/1e6, 'f', 3, 64)
	}
	spread := func(on bool, layers, i int) []int {
		if !on {
			return nil
		}
		out := make([]int, layers)
		for l := range out {
			out[l] = (i + l) % devices
		}
		return out
	}
	datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
		arg := func(key string, def int64) int64 {
			if !d.HasArg(key) {
				return def
			}
			var s string
			d.ScanArgs(t, key, &s)
			mult := int64(1)
			switch {
			case strings.HasSuffix(s, "ms"):
				s, mult = strings.TrimSuffix(s, "ms"), 1e6
			case strings.HasSuffix(s, "MB"):
				s, mult = strings.TrimSuffix(s, "MB"), 1e6
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatalf("%s=%s: %v", key, s, err)
			}
			return int64(v * float64(mult))
		}
		var out strings.Builder
		switch d.Cmd {
		case "init":
			m, err := NewComputeModel(0, 1000, 0)
			if err != nil {
				t.Fatal(err)
			}
			prof := DeviceProfile{ReadBytesPerSec: 1e9, WriteBytesPerSec: 1e9, ReadIOPS: 1e12, WriteIOPS: 1e12,
				ReadShareUnderWrites: 0.5, WriteShareUnderReads: 0.5}
			devices = int(arg("devices", 1))
			cfg := Config{Layers: int(arg("layers", 4)), BlockTokens: int(arg("block", 1000)), Compute: m,
				SaveBoundNs: arg("bound", 100e6), SlackMarginNs: arg("margin", 1e6), MaxWriteIOBytes: arg("writeio", 1e6),
				SlackFrac: -1} // no horizon discount: keeps the arithmetic readable
			for range devices {
				cfg.Devices = append(cfg.Devices, DeviceConfig{Profile: prof, MaxReadsInFlight: int(arg("readqd", 2)), MaxWritesInFlight: int(arg("writeqd", 1)),
					MaxPendingReadBytes: arg("readbudget", 1e12)})
			}
			p, err = NewPlanner(cfg)
			if err != nil {
				t.Fatal(err)
			}
			inflight = nil
		case "load":
			var runs []Run
			var spec string
			d.ScanArgs(t, "runs", &spec)
			for i, f := range strings.Split(spec, ",") {
				n, err := strconv.Atoi(f)
				if err != nil {
					t.Fatal(err)
				}
				runs = append(runs, Run{Device: i % devices, LayerDevices: spread(arg("spread", 0) == 1, p.cfg.Layers, i), Blocks: n,
					BytesPerLayerPerBlock: arg("bpb", 1e6)})
			}
			plan, err := p.PlanLoad(LoadRequest{ID: uint64(arg("id", 1)), NowNs: arg("now", 0), ComputeReadyNs: arg("ready", 0),
				Runs: runs, UncachedTokens: int(arg("uncached", 1000)), SegmentsOnly: true})
			if err != nil {
				return err.Error()
			}
			fmt.Fprintf(&out, "load %d of %d blocks, compute %d tokens from %d; layer %s ms; first token %s (recompute-all %s, load-all %s)\n",
				plan.LoadBlocks, plan.CachedBlocks, plan.ComputeTokens, plan.ComputeStartPos, ms(plan.LayerComputeNs),
				ms(plan.FirstTokenNs), ms(plan.RecomputeAllNs), ms(plan.LoadAdmissibleNs))
			for l := range plan.LayerDeadlineNs {
				fmt.Fprintf(&out, "  layer %d: reads done %s, deadline %s\n", l, ms(plan.LayerReadDoneNs[l]), ms(plan.LayerDeadlineNs[l]))
			}
			for _, r := range plan.NotAdmitted {
				fmt.Fprintf(&out, "  not admitted: blocks [%d,%d) %v\n", r.FromBlock, r.ToBlock, r.Reason)
			}
		case "save":
			tk, err := p.EnqueueSave(SaveRequest{ID: uint64(arg("id", 1)), NowNs: arg("now", 0), Blocks: int(arg("blocks", 1)),
				Device: int(arg("dev", 0)), LayerDevices: spread(arg("spread", 0) == 1, p.cfg.Layers, int(arg("dev", 0))),
				BytesPerLayerPerBlock: arg("bpb", 1e6)})
			if err != nil {
				return err.Error()
			}
			fmt.Fprintf(&out, "save: %d blocks in %d writes, due %s", tk.Blocks, tk.Writes, ms(tk.DeadlineNs))
			if tk.Reason != ReasonNone {
				fmt.Fprintf(&out, ", cut: %v", tk.Reason)
			}
			out.WriteString("\n")
		case "dispatch":
			before := len(inflight)
			inflight = p.Dispatch(arg("now", 0), inflight)
			for _, io := range inflight[before:] {
				dev := ""
				if devices > 1 {
					dev = fmt.Sprintf(" dev %d", io.Device)
				}
				if io.Kind == IORead {
					fmt.Fprintf(&out, "read  req %d layer %d run %d%s: %d blocks %s MB, deadline %s\n", io.ReqID, io.Layer, io.Run, dev, io.Blocks, ms(io.Bytes), ms(io.DeadlineNs))
				} else {
					fmt.Fprintf(&out, "write save %d layer %d%s at %s MB: %s MB, due %s", io.ReqID, io.Layer, dev, ms(io.OffsetBytes), ms(io.Bytes), ms(io.DeadlineNs))
					if io.Promoted {
						out.WriteString(" (promoted)")
					}
					out.WriteString("\n")
				}
			}
			if len(inflight) == before {
				out.WriteString("nothing\n")
			}
			fmt.Fprintf(&out, "next wake %s\n", ms(p.NextWakeNs()))
		case "complete":
			n := int(arg("n", int64(len(inflight))))
			for _, io := range inflight[:n] {
				if err := p.Complete(io.ID, arg("now", 0)); err != nil {
					t.Fatal(err)
				}
			}
			inflight = inflight[n:]
			fmt.Fprintf(&out, "%d in flight, %d records\n", len(inflight), p.Pending())
		default:
			t.Fatalf("unknown command %q", d.Cmd)
		}
		return out.String()
	})
}
