package devbench

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// uringRun are the knobs of one runUring call beyond the grid point.
type uringRun struct {
	bufferBytes int64 // Config.BufferBytes
	// budgetBytes > 0 ends the row when this many bytes were read or
	// written, at the last completion, instead of at the deadline (which
	// still bounds it): a fixed amount of work, timed (CeilingStriped).
	budgetBytes int64
	// ready, if set, is called once the ring, buffer and registrations are
	// set up and before the clock starts; it returns when every device of a
	// concurrent measurement is ready too, so that their clocks start
	// together and no device runs part of its row alone.
	ready func()
	// syncAtEnd: a write row ends after an fdatasync of the target that
	// follows its last completion (a save is timed to its durable commit).
	syncAtEnd bool
}

// runUring keeps s.QueueDepth I/Os in flight on one ring, owned by this
// goroutine (locked to its thread for SINGLE_ISSUER/DEFER_TASKRUN), with the
// file and the buffer registered (READ_FIXED/WRITE_FIXED). Each callback
// resubmits its completion until the deadline or, with o.budgetBytes, until
// that many bytes were submitted.
func runUring(ctx context.Context, t *target, s Spec, dur time.Duration, seed uint64, o uringRun) (*result, error) {
	sqpoll := s.Engine == "uring-sqpoll"
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	qd, bs := s.QueueDepth, s.BlockBytes
	g, err := newUringRig(t, s, seed, o.bufferBytes)
	if err != nil {
		return nil, err
	}
	defer g.close()
	r, buf, blocks := g.r, g.buf, g.blocks
	next := 0

	write := isWrite(s.Op)
	offs := newOffsets(s.Op, t.sizeBytes, bs, seed)
	cs := make([]uring.Completion, qd)
	started := make([]int64, qd)
	res := &result{}
	var ioErr error
	stop := false
	epoch := time.Now()
	var submittedBytes int64
	var last time.Duration // since epoch, of the last counted completion
	submit := func(c *uring.Completion) {
		if o.budgetBytes > 0 && submittedBytes >= o.budgetBytes {
			return // the budget is in flight: this completion's slot stays idle
		}
		submittedBytes += int64(bs)
		i := c.UserData
		addr := buf.Addr() + uintptr(int(i)*bs)
		if blocks > qd {
			addr = buf.Addr() + uintptr(next*bs)
			next = (next + 1) % blocks
		}
		if write {
			c.PrepWriteFixed(t.file, buf, 0, addr, uint32(bs), offs.get())
		} else {
			c.PrepReadFixed(t.file, buf, 0, addr, uint32(bs), offs.get())
		}
		started[i] = int64(time.Since(epoch))
		if err := r.Submit(c); err != nil && ioErr == nil {
			ioErr = err
		}
	}
	cb := func(c *uring.Completion) {
		if stop {
			return // drained after the deadline: not counted
		}
		now := time.Since(epoch)
		res.lat.add(int64(now) - started[c.UserData])
		if c.Err != nil {
			if ioErr == nil {
				ioErr = c.Err
			}
			return
		}
		if c.Result != int64(bs) && ioErr == nil {
			ioErr = fmt.Errorf("%s at offset %d: %d of %d bytes", s.Op, c.Offset(), c.Result, bs)
		}
		res.ops++
		res.bytes += c.Result
		last = now
		submit(c)
	}
	for i := range cs {
		cs[i].UserData = uint64(i)
		cs[i].Callback = cb
	}
	var sq0 time.Duration
	if sqpoll {
		sq0, _ = r.SQPollCPUTime()
	}
	if o.ready != nil {
		o.ready()
	}
	start := time.Now()
	deadline := start.Add(dur)
	for i := range cs {
		submit(&cs[i])
	}
	for r.InFlight() > 0 {
		if err := r.Flush(1); err != nil {
			return nil, err
		}
		if !stop && (ioErr != nil || time.Now().After(deadline) || ctx.Err() != nil) {
			stop = true
			res.elapsed = time.Since(start)
		}
	}
	if !stop {
		// The budget ran out before the deadline: the row ends at its last
		// completion.
		res.elapsed = last - start.Sub(epoch)
		if res.ops == 0 {
			res.elapsed = time.Since(start)
		}
	}
	if ioErr != nil {
		return nil, ioErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if o.syncAtEnd && write {
		if err := unix.Fdatasync(int(t.file.FD)); err != nil {
			return nil, fmt.Errorf("fdatasync of %s: %w", t.path, err)
		}
		res.elapsed = time.Since(start)
	}
	if sqpoll {
		sq1, err := r.SQPollCPUTime()
		if err == nil {
			res.sqpollCPU = sq1 - sq0
		}
	}
	res.bufferBytes, res.bufferHuge = int64(buf.Len()), buf.HugeNow()
	return res, nil
}

// uringRig is runUring's ring with the target's file and one buffer of
// blocks destination blocks (at least the queue depth) registered.
type uringRig struct {
	r                 *uring.Ring
	buf               *uring.Buffer
	blocks            int
	files, registered bool
}

// newUringRig sets the ring up for s: SQPOLL for uring-sqpoll, else
// SINGLE_ISSUER and DEFER_TASKRUN; a write's buffer holds the seed's
// pattern. close undoes what it did, in reverse order.
func newUringRig(t *target, s Spec, seed uint64, bufferBytes int64) (*uringRig, error) {
	qd, bs := s.QueueDepth, s.BlockBytes
	cfg := uring.Config{Entries: uint32(2 * qd), MaxInFlight: qd, SQThreadCPU: -1}
	if s.Engine == "uring-sqpoll" {
		cfg.SQPoll, cfg.SQThreadIdleMs = true, 100
	} else {
		cfg.SingleIssuer, cfg.DeferTaskrun = true, true
	}
	r, err := uring.New(cfg)
	if err != nil {
		return nil, err
	}
	g := &uringRig{r: r, blocks: qd} // destination blocks the I/Os rotate over (Config.BufferBytes)
	if n := int(bufferBytes / int64(bs)); n > g.blocks {
		g.blocks = n
	}
	if g.buf, err = uring.AllocBuffer(g.blocks * bs); err != nil {
		g.close()
		return nil, err
	}
	if isWrite(s.Op) {
		fillPattern(g.buf.Bytes(), seed)
	}
	if err := r.RegisterFiles([]*uring.File{t.file}); err != nil {
		g.close()
		return nil, err
	}
	g.files = true
	if err := r.RegisterBuffers([]*uring.Buffer{g.buf}); err != nil {
		g.close()
		return nil, err
	}
	g.registered = true
	return g, nil
}

func (g *uringRig) close() {
	if g.registered {
		g.r.RegisterBuffers(nil)
	}
	if g.files {
		g.r.RegisterFiles(nil)
	}
	if g.buf != nil {
		g.buf.Free()
	}
	g.r.Close()
}

// runPread runs s.QueueDepth goroutines, each doing pread(2)/pwrite(2) of
// its own buffer slice in a loop until the deadline.
func runPread(ctx context.Context, t *target, s Spec, dur time.Duration, seed uint64) (*result, error) {
	n, bs := s.QueueDepth, s.BlockBytes
	buf, err := uring.AllocBuffer(n * bs)
	if err != nil {
		return nil, err
	}
	defer buf.Free()
	write := isWrite(s.Op)
	if write {
		fillPattern(buf.Bytes(), seed)
	}
	// Sequential ops share one cursor, as the in-flight I/Os of the ring do.
	var mu sync.Mutex
	shared := newOffsets(s.Op, t.sizeBytes, bs, seed)
	results := make([]result, n)
	errs := make([]error, n)
	start := time.Now()
	deadline := start.Add(dur)
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			own := newOffsets(s.Op, t.sizeBytes, bs, seed+uint64(w)*7919)
			addr := buf.Addr() + uintptr(w*bs)
			res := &results[w]
			for i := 0; ; i++ {
				var off uint64
				if own.seq {
					mu.Lock()
					off = shared.get()
					mu.Unlock()
				} else {
					off = own.get()
				}
				t0 := time.Now()
				var got int
				var err error
				if write {
					got, err = uring.Pwrite(t.file, addr, uint32(bs), off)
				} else {
					got, err = uring.Pread(t.file, addr, uint32(bs), off)
				}
				t1 := time.Now()
				if err == nil && got != bs {
					err = fmt.Errorf("%s at offset %d: %d of %d bytes", s.Op, off, got, bs)
				}
				if err != nil {
					errs[w] = fmt.Errorf("pread engine: %w", err)
					return
				}
				res.lat.add(int64(t1.Sub(t0)))
				res.ops++
				res.bytes += int64(got)
				if t1.After(deadline) || i%64 == 0 && ctx.Err() != nil {
					return
				}
			}
		}(w)
	}
	wg.Wait()
	total := &result{elapsed: time.Since(start)}
	for w := range results {
		if errs[w] != nil {
			return nil, errs[w]
		}
		total.ops += results[w].ops
		total.bytes += results[w].bytes
		total.lat.merge(&results[w].lat)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return total, nil
}

func fillPattern(b []byte, seed uint64) {
	x := seed*0x9e3779b97f4a7c15 | 1
	for i := range b {
		if i%8 == 0 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
		b[i] = byte(x >> (8 * (i % 8)))
	}
}
