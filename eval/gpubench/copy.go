package gpubench

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kernels/testkit"
	"github.com/tutti-io/tutti/uring"
)

// runPread: workers pread each layer's object (each piece up to max-io a
// call) into the staging slot, then the layer is scattered; layers go one
// after another, as cuFile's compat mode does a cuFileRead (O_DIRECT files)
// — and as a page cache read does (buffered files).
func (b *gpuBench) runPread(row *Row, files []*uring.File, workers int) error {
	st := b.r.Staging()
	lim := b.r.Limits()
	slots := st.Len() / int(lim.SlotBytes)
	if err := b.r.SetHostMap(b.pm); err != nil {
		return err
	}
	// The reads are planned before the clock starts, as the other paths'
	// are. O_DIRECT files read whole 4 KiB blocks, buffered ones the bytes.
	layerReads := make([][]objRead, b.g.Layers)
	for l := range layerReads {
		layerReads[l] = b.lay.reads(l, int64(b.maxIO), files[0].DirectAlign != 0, nil)
	}
	var ios int64
	var doneMs []float64
	m0 := b.start()
	for l, rs := range layerReads {
		if l >= slots {
			if err := b.r.WaitCopy(l % slots); err != nil {
				return err
			}
		}
		slot := st.Addr() + uintptr(int64(l%slots)*lim.SlotBytes)
		if err := preadLayer(files, slot, rs, workers); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
		ios += int64(len(rs))
		if err := b.r.ScatterHost(l, slot, lim.SlotBytes); err != nil {
			return err
		}
		if err := b.r.RecordCopy(l % slots); err != nil {
			return err
		}
		doneMs = append(doneMs, float64(time.Since(m0.t).Microseconds())/1e3)
	}
	if err := b.r.SyncCopies(); err != nil {
		return err
	}
	b.finish(row, m0, ios)
	layerStats(row, doneMs)
	return nil
}

// preadLayer runs reads with pread(2) from workers goroutines, read r from
// files[r.dev] into slot+r.slot (off-heap memory the caller owns, at least
// as long as the reads reach). A read that returns fewer than its need
// bytes is an error; the first error is returned once all workers stopped.
func preadLayer(files []*uring.File, slot uintptr, rs []objRead, workers int) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ferr error
	next := 0
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				c := next
				next++
				stop := ferr != nil
				mu.Unlock()
				if stop || c >= len(rs) {
					return
				}
				r := rs[c]
				f := files[r.dev]
				got, err := uring.Pread(f, slot+uintptr(r.slot), uint32(r.len), uint64(r.off))
				if err == nil && got < r.need {
					err = fmt.Errorf("short read at %d of %s: %d of %d bytes", r.off, f.Path, got, r.len)
				}
				if err != nil {
					mu.Lock()
					if ferr == nil {
						ferr = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return ferr
}

// cufileBatch is one CuFileBatchRead: reads of one device's file into the
// layer's device buffer.
type cufileBatch struct {
	dev     int
	fileOff []uint64
	dstOff  []uint64
	lens    []uint32
}

// cufileBatches are layer l's reads (each piece up to max-io a read, whole
// 4 KiB blocks) grouped by device, devices in the order of their first
// piece: cuFile's batch takes one file per call.
func (b *gpuBench) cufileBatches(l int) []cufileBatch {
	var out []cufileBatch
	at := map[int]int{}
	for _, r := range b.lay.reads(l, int64(b.maxIO), true, nil) {
		i, ok := at[r.dev]
		if !ok {
			i = len(out)
			at[r.dev] = i
			out = append(out, cufileBatch{dev: r.dev})
		}
		c := &out[i]
		c.fileOff = append(c.fileOff, uint64(r.off))
		c.dstOff = append(c.dstOff, uint64(r.slot))
		c.lens = append(c.lens, uint32(r.len))
	}
	return out
}

// runCuFile tries the real cuFile path: driver open, handle registration,
// batch reads into a device buffer (one batch per device holding pieces of
// the layer, one after another), scatter. Where cuFile refuses the
// storage (5027 on a virtio disk) the row says so and carries no numbers.
func (b *gpuBench) runCuFile(row *Row) error {
	for _, p := range b.paths {
		code, err := testkit.CuFileProbe(p)
		if err != nil {
			row.Note = fmt.Sprintf("cuFile error %d", code)
			return fmt.Errorf("cuFile refused %s (error %d): %w", p, code, err)
		}
	}
	_, bufBytes := b.lay.slotOffsets()
	buf, err := kernels.DevAlloc(bufBytes)
	if err != nil {
		return err
	}
	defer kernels.DevFree(buf)
	if err := b.r.SetHostMap(b.pm); err != nil {
		return err
	}
	batches := make([][]cufileBatch, b.g.Layers) // planned before the clock starts
	for l := range batches {
		batches[l] = b.cufileBatches(l)
	}
	var ios int64
	m0 := b.start()
	for l, bs := range batches {
		for _, c := range bs {
			if err := testkit.CuFileBatchRead(b.paths[c.dev], c.fileOff, c.dstOff, c.lens, buf, bufBytes); err != nil {
				return err
			}
			ios += int64(len(c.lens))
		}
		if err := b.r.ScatterDevice(l, buf, bufBytes); err != nil {
			return err
		}
		if err := b.r.SyncCopies(); err != nil {
			return err
		}
	}
	b.finish(row, m0, ios)
	return nil
}

// fillSlot writes layer l's object into dst as a staging slot holds it
// after the reads (b.pm's places, zeroed padding): dst is the slot bytes
// of b.lay.slotOffsets.
func (b *gpuBench) fillSlot(dst []byte, l int) error {
	offs, used := b.lay.slotOffsets()
	clear(dst[:used])
	for k, pc := range b.lay.pieces(l, nil) {
		if err := testkit.FillObject(dst[offs[k]:], b.g, b.seed, l, pc.first, pc.pages); err != nil {
			return err
		}
	}
	return nil
}

// runDRAM: the prefix already sits in pinned host memory (a DRAM tier),
// each layer as a staging slot would hold it after the reads (fillSlot);
// only the scatter into HBM is timed: the upper bound of any storage path.
func (b *gpuBench) runDRAM(row *Row) error {
	_, stride := b.lay.slotOffsets()
	total := stride * int64(b.g.Layers)
	buf, err := uring.AllocBuffer(int(total))
	if err != nil {
		return err
	}
	defer buf.Free()
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := w; l < b.g.Layers && errs[w] == nil; l += 16 {
				errs[w] = b.fillSlot(buf.Bytes()[int64(l)*stride:int64(l+1)*stride], l)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := kernels.HostRegister(buf.Addr(), total); err != nil {
		return err
	}
	defer kernels.HostUnregister(buf.Addr())
	if err := b.r.SetHostMap(b.pm); err != nil {
		return err
	}
	m0 := b.start()
	for l := 0; l < b.g.Layers; l++ {
		if err := b.r.ScatterHost(l, buf.Addr()+uintptr(int64(l)*stride), stride); err != nil {
			return err
		}
	}
	if err := b.r.SyncCopies(); err != nil {
		return err
	}
	b.finish(row, m0, 0)
	return nil
}
