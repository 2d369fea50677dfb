package gpubench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/uring"
)

func (b *gpuBench) runPath(p string) Row {
	row := Row{Path: p}
	if err := testkit.FillKV(b.r, 0xA5); err != nil { // poison: stale bytes can never pass
		row.Error = err.Error()
		return row
	}
	var err error
	verify := true // every path restores into the KV tensors but the diagnostic
	switch p {
	case "gpu":
		row.Path = "gpu-driven (SQPOLL)"
		err = b.runGPU(&row, b.r)
	case "gpu-kick":
		row.Path = "gpu-driven (kick, no SQPOLL)"
		if b.rk == nil {
			err = b.bindKick()
		}
		if err == nil {
			err = b.runGPU(&row, b.rk)
		}
	case "uring":
		row.Path = "(a) uring -> staging -> scatter"
		err = b.runHost(&row, false, true)
	case "per-block":
		row.Path = "(b) per-block (page x layer)"
		err = b.runHost(&row, true, true)
	case "uring-staging-only":
		// Diagnostic: path (a)'s reads, in its order and pacing, with no
		// copy to HBM. Next to (a) and the ceiling it says what the copies
		// over PCIe cost the reads where the devices are host memory.
		row.Path = "(a0) uring -> staging only"
		row.Note = "diagnostic: no copy to HBM, nothing to verify"
		verify = false
		err = b.runHost(&row, false, false)
	case "cufile":
		row.Path = "(c) cufile batch"
		err = b.runCuFile(&row)
	case "cufile-compat":
		row.Path = "(c') cufile-compat (posix bounce)"
		err = b.runPread(&row, b.direct, 8)
	case "page-cache":
		row.Path = "(d) page cache (buffered pread)"
		err = b.runPread(&row, b.buffered, 8)
	case "dram":
		row.Path = "(e) DRAM (pinned host copy)"
		err = b.runDRAM(&row)
	default:
		err = fmt.Errorf("unknown path %q", p)
	}
	if err != nil {
		row.Error = err.Error()
	}
	if row.Bytes > 0 && verify {
		bad, verr := testkit.VerifyKV(b.r, b.seed, b.pm, 0, b.g.Layers)
		if verr != nil {
			row.Error = strings.TrimSpace(row.Error + " verify: " + verr.Error())
		}
		row.Mismatches = bad
	}
	if row.Error != "" {
		row.BytesPerS = 0 // a failed restore has no throughput
	}
	return row
}

// gpuRequest is the whole prefix as one restore: one extent per piece of
// each layer (b.lay), read through the devices' O_DIRECT files.
func (b *gpuBench) gpuRequest() kernels.Request {
	req := kernels.Request{Pages: b.dst}
	var ps []layoutPiece
	for l := 0; l < b.g.Layers; l++ {
		ps = b.lay.pieces(l, ps[:0])
		xs := make([]kernels.Extent, 0, len(ps))
		for _, pc := range ps {
			f := b.direct[pc.dev]
			xs = append(xs, kernels.Extent{FD: f.FD, Align: f.DirectAlign, Offset: pc.off, Pages: pc.pages})
		}
		req.Layers = append(req.Layers, xs)
	}
	return req
}

// runGPU restores the whole prefix with the GPU driving the ring.
func (b *gpuBench) runGPU(row *Row, r *kernels.Restorer) error {
	req := b.gpuRequest()
	wakes0, timeouts0, batch0 := r.Wakeups(), r.WakeTimeouts(), r.BatchTimeouts()
	m0 := b.start()
	x, err := r.Restore(req)
	if err != nil {
		return err
	}
	res, err := x.Wait()
	threads1 := b.finish(row, m0, 0)
	x.Release()
	if res != nil {
		row.IOs = int64(len(res.Entries))
		ms := make([]float64, len(res.LayerMs))
		for i, v := range res.LayerMs {
			ms[i] = float64(v)
		}
		layerStats(row, ms)
	}
	if err != nil {
		b.dumpThreads()
	}
	if r == b.r {
		row.Note = fmt.Sprintf("sqpoll thread %.2f s, %d wake-ups", row.SQPollCPUS, r.Wakeups()-wakes0)
	} else {
		row.Note = fmt.Sprintf("%d kicks, %d on the timeout, %d of them the whole batch wait (%s)", r.Wakeups()-wakes0, r.WakeTimeouts()-timeouts0, r.BatchTimeouts()-batch0, r.HelperMode())
	}
	if d := threadCPUDelta(m0.threads, threads1, r.HelperTID()); d != "" {
		row.Note += ", threads: " + d
	}
	if herr := r.HelperErr(); herr != nil {
		row.Note += ", helper: " + herr.Error()
	}
	switch fixed, ferr := r.FixedBuffers(); {
	case fixed:
		row.Note += ", READ_FIXED into registered staging"
		switch st := r.Staging(); {
		case !st.Huge():
			row.Note += " (4 KiB pages: no transparent huge pages)"
		case !st.HugeNow():
			row.Note += " (huge pages at allocation, no longer all huge after registration)"
		}
	case ferr != nil:
		row.Note += ", plain reads: " + ferr.Error() // asked for, refused: reported, not hidden
	default:
		row.Note += ", plain reads (--no-fixed-buffers)"
	}
	return err
}

// dumpThreads prints where this process's io_uring threads (iou-sqp, iou-wrk)
// and blocked threads sleep in the kernel (/proc/self/task/*/stack, root
// only): the evidence when a GPU-driven restore times out.
func (b *gpuBench) dumpThreads() {
	tasks, _ := filepath.Glob("/proc/self/task/*")
	for _, t := range tasks {
		comm, _ := os.ReadFile(filepath.Join(t, "comm"))
		stat, _ := os.ReadFile(filepath.Join(t, "stat"))
		state := ""
		if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && len(stat) > i+2 {
			state = string(stat[i+2 : i+3])
		}
		name := strings.TrimSpace(string(comm))
		wchan, _ := os.ReadFile(filepath.Join(t, "wchan"))
		stack, _ := os.ReadFile(filepath.Join(t, "stack"))
		if !strings.HasPrefix(name, "iou-") && state != "D" && !strings.Contains(string(stack), "io_uring") {
			continue
		}
		b.logf("thread %s %s state %s wchan %s\n%s", filepath.Base(t), name, state, wchan, stack)
	}
}

// bindKick binds a second context on the same KV tensors with a ring that
// has no SQPOLL thread: the CPU helper submits in batches, woken by completions.
func (b *gpuBench) bindKick() error {
	base := uring.Config{Entries: b.ringEntries, SQThreadCPU: -1, NoMmap: true}
	var ring *uring.Ring
	var err error
	if b.kickDefer {
		var fallback string
		ring, fallback, err = kernels.NewKickRing(base)
		if fallback != "" {
			b.logf("GPU kick ring: %s\n", fallback)
		}
	} else {
		ring, err = uring.New(base)
	}
	if err != nil {
		return err
	}
	cfg := b.kcfg
	cfg.Ring = ring
	b.rk, err = kernels.BindBench(cfg, b.kopts)
	if err != nil {
		ring.Close()
		return err
	}
	b.ringK = ring
	return nil
}
