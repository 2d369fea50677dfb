package gpubench

import (
	"fmt"
	"time"

	"github.com/tutti-io/tutti/uring"
)

// hostIO is one CPU-issued read of the host paths.
type hostIO struct {
	layer int
	dev   int
	off   int64
	len   int
	slot  int64 // where the read lands in the layer's slot (direct), or -1: bounce
	copyN int   // bounce: bytes to copy
	skip  int   // bounce: bytes to skip at the start of the read
	dstAt int64 // bounce: destination offset in the layer's slot
}

// hostReads are the reads of the host uring paths, layer-major: each
// piece of a layer's object in reads of up to max-io bytes (path a), or one
// read per (layer, page) at the page's place in its piece (path b; a page
// not on 4 KiB boundaries is read whole blocks into a bounce buffer and
// copied). Either way the layer's slot ends up as b.pm describes it.
func (b *gpuBench) hostReads(perBlock bool) []hostIO {
	pb := b.g.PageBytesPerLayer()
	offs, _ := b.lay.slotOffsets()
	var ios []hostIO
	var rs []objRead
	var ps []layoutPiece
	for l := 0; l < b.g.Layers; l++ {
		if !perBlock {
			rs = b.lay.reads(l, int64(b.maxIO), true, rs[:0])
			for _, r := range rs {
				ios = append(ios, hostIO{layer: l, dev: r.dev, off: r.off, len: r.len, slot: r.slot})
			}
			continue
		}
		ps = b.lay.pieces(l, ps[:0])
		for k, pc := range ps {
			for j := 0; j < pc.pages; j++ {
				off, slot := pc.off+int64(j)*pb, offs[k]+int64(j)*pb
				lo, hi := off/4096*4096, (off+pb+4095)/4096*4096
				if lo == off && hi == off+pb {
					ios = append(ios, hostIO{layer: l, dev: pc.dev, off: off, len: int(pb), slot: slot})
				} else {
					ios = append(ios, hostIO{layer: l, dev: pc.dev, off: lo, len: int(hi - lo), slot: -1, copyN: int(pb), skip: int(off - lo), dstAt: slot})
				}
			}
		}
	}
	return ios
}

// runHost restores through a Go uring.Ring (no SQPOLL): object reads of up to
// max-io bytes (path a) or one read per (layer, page) (path b, as a per-page
// offload connector does), into the pinned staging pool, each layer scattered
// as soon as its reads completed while later layers are read. Without toHBM
// (the diagnostic uring-staging-only) the layers are read and not copied.
func (b *gpuBench) runHost(row *Row, perBlock, toHBM bool) error {
	ios := b.hostReads(perBlock)
	eng, err := uring.New(uring.Config{Entries: uint32(b.qd), SQThreadCPU: -1})
	if err != nil {
		return err
	}
	defer eng.Close()
	bounce, err := b.allocBounce()
	if err != nil {
		return err
	}
	defer bounce.Free()
	m0 := b.start()
	done, err := b.hostPipeline(ios, bounce, toHBM, func(io *hostIO, dst uintptr, c *uring.Completion) error {
		c.PrepRead(b.direct[io.dev], dst, uint32(io.len), uint64(io.off))
		return eng.Submit(c)
	}, func(wait int) error { return eng.Flush(wait) })
	b.finish(row, m0, int64(len(ios)))
	layerStats(row, done)
	return err
}

// bounceSlotBytes is one O_DIRECT-aligned bounce slot: a page's read with
// the alignment slack either side.
func (b *gpuBench) bounceSlotBytes() int {
	return int((b.g.PageBytesPerLayer() + 8192 + 4095) / 4096 * 4096)
}

// allocBounce allocates hostPipeline's bounce slots (qd of them) before a
// path's clock starts: setup that the GPU path does at bind time is not
// timed for the host paths either. The caller frees it.
func (b *gpuBench) allocBounce() (*uring.Buffer, error) {
	return uring.AllocBuffer(b.qd * b.bounceSlotBytes())
}

// hostPipeline runs ios (layer-major) with at most qd in flight through
// submit/flush, into staging slot layer%slots, and scatters each layer when
// it is complete; a slot is reused only after its scatter finished. Without
// toHBM nothing is copied or scattered: a layer is done when its reads are.
// Reads not aligned for O_DIRECT land in bounce (qd slots of
// bounceSlotBytes, from allocBounce) and are copied into the slot. It
// returns each layer's completion time (ms from start).
func (b *gpuBench) hostPipeline(ios []hostIO, bounce *uring.Buffer, toHBM bool, submit func(io *hostIO, dst uintptr, c *uring.Completion) error, flush func(int) error) ([]float64, error) {
	st := b.r.Staging()
	lim := b.r.Limits()
	slots := st.Len() / int(lim.SlotBytes)
	slotAddr := func(l int) uintptr { return st.Addr() + uintptr(int64(l%slots)*lim.SlotBytes) }
	if err := b.r.SetHostMap(b.pm); err != nil {
		return nil, err
	}
	perLayer := make([]int, b.g.Layers)
	for _, io := range ios {
		perLayer[io.layer]++
	}
	doneIn := make([]int, b.g.Layers)
	comps := make([]uring.Completion, b.qd)
	bsz := b.bounceSlotBytes()
	free := make([]int, 0, b.qd)
	for i := range comps {
		free = append(free, i)
	}
	var firstErr error
	for i := range comps {
		comps[i].UserData = uint64(i)
		comps[i].Callback = func(c *uring.Completion) {
			k := int(c.UserData)
			io := c.Context.(*hostIO)
			if c.Err != nil && firstErr == nil {
				firstErr = c.Err
			} else if c.Result != int64(io.len) && firstErr == nil {
				firstErr = fmt.Errorf("short read at %d: %d of %d bytes", io.off, c.Result, io.len)
			}
			if io.slot < 0 {
				src := bounce.Bytes()[k*bsz:]
				at := int64(io.layer%slots)*lim.SlotBytes + io.dstAt
				copy(st.Bytes()[at:at+int64(io.copyN)], src[io.skip:io.skip+io.copyN])
			}
			doneIn[io.layer]++
			free = append(free, k)
		}
	}
	t0 := time.Now()
	var doneMs []float64
	next, scattered, inflight := 0, 0, 0
	waited := make([]bool, b.g.Layers)
	for scattered < b.g.Layers {
		for next < len(ios) && len(free) > 0 {
			io := &ios[next]
			if io.layer-scattered >= slots {
				break // its slot still holds a layer waiting to be scattered
			}
			if toHBM && io.layer >= slots && !waited[io.layer] {
				if err := b.r.WaitCopy(io.layer % slots); err != nil {
					return doneMs, err
				}
				waited[io.layer] = true
			}
			k := free[len(free)-1]
			free = free[:len(free)-1]
			c := &comps[k]
			c.Context = io
			dst := slotAddr(io.layer) + uintptr(io.slot)
			if io.slot < 0 {
				dst = bounce.Addr() + uintptr(k*bsz)
			}
			if err := submit(io, dst, c); err != nil {
				return doneMs, err
			}
			next++
			inflight++
		}
		if inflight > 0 {
			before := len(free)
			if err := flush(1); err != nil {
				return doneMs, err
			}
			inflight -= len(free) - before
		}
		if firstErr != nil {
			return doneMs, firstErr
		}
		for scattered < b.g.Layers && doneIn[scattered] == perLayer[scattered] {
			l := scattered
			if toHBM {
				if err := b.r.ScatterHost(l, slotAddr(l), lim.SlotBytes); err != nil {
					return doneMs, err
				}
				if err := b.r.RecordCopy(l % slots); err != nil {
					return doneMs, err
				}
			}
			doneMs = append(doneMs, float64(time.Since(t0).Microseconds())/1e3)
			scattered++
		}
	}
	return doneMs, b.r.SyncCopies()
}
