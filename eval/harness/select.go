package harness

import (
	"fmt"
	"os"

	"github.com/tutti-io/tutti/runtime"
)

// BackendChoice is which backends a replay runs and how tutti's are tuned.
type BackendChoice struct {
	Names []string
	// Explicit: Names were asked for by name, and each runs even where
	// Available refuses (Run then reports it skipped, and the CLI fails);
	// otherwise an unavailable one is left out with a note.
	Explicit bool
	Planner  *Compute // tutti's planner model; nil: load every cached block
	// Dirs are the store directories: tutti-gpu's reads are sized to their
	// devices where GPUWindow, GPUMaxIO or GPULookahead is 0.
	Dirs                              []string
	GPUWindow, GPUMaxIO, GPULookahead int
	SaveBoundMs                       int // tutti's save bound; 0: the runtime's default
	// RunWidth is tutti's runtime.Config.RunWidth (0: the runtime's
	// default, every device; 1: each run on one device, the layout before
	// objmap's manifest version 3, to compare against).
	RunWidth int
}

// SelectBackends builds c's backends, in c.Names' order, with notes for
// the report: the ones left out and why, tutti-gpu's read sizes and the
// save bound. An unknown name is an error naming it.
func SelectBackends(c BackendChoice) ([]Backend, []string, error) {
	var bs []Backend
	var notes []string
	for _, n := range c.Names {
		b, err := NewBackend(n, c.Planner)
		if err != nil {
			return nil, nil, err
		}
		if err := b.Available(); err != nil && !c.Explicit {
			notes = append(notes, fmt.Sprintf("%s not run: %v", n, err))
			continue
		}
		if t, ok := b.(*Tutti); ok {
			if n == "tutti-gpu" {
				r := gpuReads(c.Dirs, c.GPUWindow, c.GPUMaxIO, c.GPULookahead)
				t.SetGPUReads(r.Window, r.MaxIOBytes, r.Lookahead)
				notes = append(notes, fmt.Sprintf("tutti-gpu: window %d reads, largest read %d KiB, lookahead %d layers", r.Window, r.MaxIOBytes>>10, r.Lookahead))
				for _, u := range r.Unread {
					notes = append(notes, "tutti-gpu: device not read: "+u)
				}
			}
			if c.RunWidth > 0 {
				t.SetRunWidth(c.RunWidth)
				notes = append(notes, fmt.Sprintf("%s: each run spread over %d device(s) at most (--tutti-run-width; runtime.Config.RunWidth)", n, c.RunWidth))
			}
			if c.SaveBoundMs > 0 {
				t.SetSaveBoundMs(c.SaveBoundMs)
				notes = append(notes, fmt.Sprintf("%s: save bound %d ms (--tutti-save-bound-ms, the replay's default 60000: the runtime's own default, 2000, cuts saves larger than it writes in 2 s, which the baselines keep whole)", n, c.SaveBoundMs))
			}
		}
		bs = append(bs, b)
	}
	return bs, notes, nil
}

// gpuReads sizes tutti-gpu's reads to the store's devices where a flag
// left them 0 (runtime.DeviceSizedGPUReads; an unknown device adds 128
// reads to the window and counts as taking 1 MiB reads); the runtime checks
// the values at Open.
func gpuReads(dirs []string, window, maxIO, lookahead int) runtime.GPUReads {
	if len(dirs) == 0 {
		dirs = []string{os.TempDir()}
	}
	return runtime.DeviceSizedGPUReads(dirs).Explicit(window, maxIO, lookahead)
}

// TuttiNotes are the report's notes on tutti's backends after a run: how
// often the GPU ring's helper entered the kernel, what the scheduler
// dispatched (writes into slack or promoted), and the cached blocks the
// planner recomputed instead of loading.
func TuttiNotes(bs []Backend) []string {
	var notes []string
	for _, b := range bs {
		t, ok := b.(*Tutti)
		if !ok {
			continue
		}
		if w, bt := t.GPUHelper(); w > 0 {
			notes = append(notes, fmt.Sprintf("%s: the GPU ring's helper entered the kernel %d times; %d waits ran the whole batch wait with reads in flight", t.Name(), w, bt))
		}
		if st := t.SchedStats(); st.ReadsDispatched > 0 || st.WritesDispatched > 0 {
			// Whether saves were deferred into the restores' slack (on
			// tutti-gpu behind whole GPU restores) or had to be promoted.
			notes = append(notes, fmt.Sprintf("%s: the scheduler dispatched %d reads (%d GPU restores, each whole) and %d writes, %d of them promoted (due soon: issued beside reads regardless of slack); %d dispatch rounds held reads back for saves; %d reads cancelled",
				t.Name(), st.ReadsDispatched, st.RestoresDispatched, st.WritesDispatched, st.WritesPromoted, st.ReadHolds, st.Cancelled))
		}
		if t.saveNote != "" {
			notes = append(notes, t.Name()+": "+t.saveNote)
		}
		if t.PlannedRecomputeBlocks() > 0 {
			notes = append(notes, fmt.Sprintf("%s: the planner recomputed %d cached blocks instead of loading them (its device model started from: %s)",
				t.Name(), t.PlannedRecomputeBlocks(), t.DeviceProbe()))
		}
	}
	return notes
}

// GPUComputeNotes is the report's note on measured GPU prefill (none
// where g measured none; g may be nil).
func GPUComputeNotes(g *GPUCompute) []string {
	gs := g.Stats()
	if gs.Requests == 0 && gs.Calibrated == 0 {
		return nil
	}
	return []string{fmt.Sprintf("GPU prefill: %d prefills measured (%d re-measured alone: the restore brought back fewer blocks than looked up), %.1f s of GPU time; %d GEMM launches next to restores took %.2f CPU-s (in the restores' CPU time where they overlapped)%s%s",
		gs.Requests, gs.Reruns, gs.GPUTime.Seconds(), gs.Launches, gs.EnqueueCPU.Seconds(), gs.warmupNote(), gs.liveNote(g.LiveEvery()))}
}
